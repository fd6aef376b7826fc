"""Build of the one compiled module, app.data.formats.textfile._fastparse (everything else is in pyproject.toml).

optional=True: without a C compiler the install still succeeds and app.data.formats.textfile parses
with its numpy path (slower, same values); tests/test_fastparse.py checks it was built
wherever a compiler is present.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "app.data.formats.textfile._fastparse",
            sources=["app/data/formats/textfile/_fastparse.c"],
            extra_compile_args=["-O2", "-std=c99"],
            optional=True,
        )
    ]
)
