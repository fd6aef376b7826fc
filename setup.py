"""Build of the one compiled module, app.data._fastparse (everything else is in pyproject.toml).

optional=True: without a C compiler the install still succeeds and app.data.textfile parses
with its numpy path (slower, same values); tests/test_fastparse.py checks it was built
wherever a compiler is present.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "app.data._fastparse",
            sources=["app/data/_fastparse.c"],
            extra_compile_args=["-O2", "-std=c99"],
            optional=True,
        )
    ]
)
