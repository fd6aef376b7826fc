# coretrain batch training image (docs/deploy.md: run, compose and Kubernetes).
#
#   podman build -t localhost/coretrain .        (or: docker build -t coretrain .)
#
# Three stages: "builder" makes a virtualenv in /opt/venv from requirements.lock (every
# package pinned and hashed; `make lock` regenerates it from constraints.txt); "system" is
# the base with tini, less what no run reads; the runtime stage starts from nothing and
# copies in the system's files, then the venv. The runtime user is numeric
# (10001:10001); /output belongs to it and is group-writable by GID 0, so an arbitrary UID
# in group 0 (OpenShift) can write there too. tini is PID 1 and forwards SIGTERM to
# coretrain, which saves a checkpoint and exits 143.
#
# The base is pinned by digest (the tag only says what it is): a rebuild starts from the
# same bytes until the digest is changed here (docs/deploy.md "Build"). Any Debian bookworm
# image with python3 and its venv module can stand in (--build-arg BASE_IMAGE=...): the apt
# pins below are bookworm's.
ARG BASE_IMAGE=docker.io/library/python:3.11.16-slim-bookworm@sha256:c425d915a89a6dcd3183b1797ad9bd8878caff5a417f6371c8df93c8ea8b727f

FROM ${BASE_IMAGE} AS builder
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
# binutils: `strip` for the size trim below; gcc, libc6-dev and (where the base has no
# Python.h, e.g. Debian's own python3) python3-dev: the compiled parser
# app/data/formats/textfile/_fastparse.c. libc6-dev and python3-dev must match the base's libc6 and python3
# exactly, so they are pinned to the installed versions. Builder stage only.
RUN apt-get update \
 && apt-get install -y --no-install-recommends binutils=2.40-2 gcc=4:12.2.0-3 \
      libc6-dev="$(dpkg-query -W -f='${Version}' libc6)" \
 && if [ ! -e "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ]; then \
      apt-get install -y --no-install-recommends \
        python3-dev="$(dpkg-query -W -f='${Version}' python3)"; \
    fi \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
WORKDIR /src
# Dependencies first, from the lock alone, so this slow layer (TensorFlow's wheels are
# most of the image) is reused while only app/ changes. --require-hashes: pip refuses
# any file whose sha256 is not in the lock; --no-deps: nothing outside the lock is
# installed; --no-compile: bytecode is written below, for the modules training imports.
COPY requirements.lock ./
RUN /opt/venv/bin/pip install --no-cache-dir --require-hashes --no-deps --no-compile -r requirements.lock
# Size trim, runtime-neutral (docs/deploy.md "Image size and start-up"): TF's C++
# headers (only for building custom ops), the test suites packages ship (numpy's, h5py's,
# ...: `tests` directories, which nothing imports) and the static symbol tables of TF's
# shared libraries (`strip --strip-unneeded` keeps the dynamic symbols the loader and
# TF's op registry use; only tensorflow/: stripping auditwheel-patched libraries such as
# numpy.libs/ breaks them); then two of TF's libraries no run loads, the XLA op library
# tf.load_op_library would take (no module loads it: the ops are in libtensorflow_cc) and
# StableHLO's Python extension (tf.mlir tooling), and the type stubs and C sources
# packages ship. Left out of the lock, declared but never imported by a run: libclang
# (TF's source tooling), grpcio (TF's debugger server), google-pasta (tf_upgrade_v2), and
# rich's pygments and markdown-it-py (with mdurl) for syntax and Markdown rendering.
RUN site=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && rm -rf "$site/tensorflow/include" \
 && find "$site" -type d -name tests -prune -exec rm -rf {} + \
 && find "$site/tensorflow" -name '*.so*' -type f -exec strip --strip-unneeded {} + \
 && rm "$site/tensorflow/compiler/tf2xla/ops/_xla_ops.so" \
      "$site/tensorflow/compiler/mlir/stablehlo/stablehlo_extension.so" \
 && find "$site" -type f \( -name '*.pyi' -o -name '*.pxd' -o -name '*.a' -o -name '*.c' \
      -o -name '*.cc' -o -name '*.h' \) -delete
COPY README.md pyproject.toml setup.py ./
COPY app ./app
# Built with the lock's setuptools and wheel (no build isolation: nothing unhashed is
# fetched to build coretrain); then they go, with pip: nothing imports them at run time
# (TF and astunparse declare setuptools and wheel but never import them).
RUN /opt/venv/bin/pip install --no-cache-dir --no-deps --no-build-isolation --no-compile . \
 && /opt/venv/bin/python -I -c 'import app.data.formats.textfile._fastparse' \
 && /opt/venv/bin/pip uninstall -y setuptools wheel pip

# Bytecode for what a training run imports, and only that (docs/deploy.md "Image size and
# start-up"): a tiny run here (generate, train and export, load the SavedModel) writes
# the .pyc of each module it imports, then these are rewritten as unchecked-hash .pyc,
# valid whatever timestamps the files get on their way into the image, in __pycache__
# directories every user may read (the run's umask made them 0750: the image user could
# not use them and compiled every module at every start). The run also proves that the
# trimmed venv trains, exports and serves.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN site=$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') \
 && unset PYTHONDONTWRITEBYTECODE \
 && /opt/venv/bin/coretrain generate --out /tmp/warm/data --train 240 --test 60 --seed 1 >/dev/null \
 && /opt/venv/bin/coretrain train --data /tmp/warm/data --output /tmp/warm/out \
      --cache-dir /tmp/warm/cache --batch-size 40 --eval-every 5 --max-steps 5 >/dev/null \
 && /opt/venv/bin/python -I -c 'import sys, tensorflow as tf; tf.saved_model.load(sys.argv[1])' \
      /tmp/warm/out/model/saved_model \
 && find "$site" -name '*.pyc' | sed -E 's#/__pycache__/([^./]+)\.[^/]*\.pyc$#/\1.py#' \
    | /opt/venv/bin/python -m compileall -q -f --invalidation-mode unchecked-hash -i - \
 && chmod -R a+rX /opt/venv \
 && rm -rf /tmp/warm

# The system: the base and tini, less what no run reads (docs/deploy.md "Image size and
# start-up"): apt's package lists and downloaded archives, documentation but for the
# copyright files, manual and info pages, message translations and the wheels the base
# keeps for creating virtualenvs. Nothing is uninstalled: dpkg's database stays true.
FROM ${BASE_IMAGE} AS system
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /usr/share/man/* /usr/share/info/* \
      /usr/share/locale/* /usr/share/python-wheels/* \
 && find /usr/share/doc -depth -mindepth 1 ! -name copyright ! -type d -delete \
 && find /usr/share/doc -depth -mindepth 1 -type d -empty -delete

# What was removed above is gone from the image only when the base's layers are not in
# it: so the runtime starts from nothing and copies the system's whole file system, on
# purpose (hadolint's DL3067 warns against it as a mistake; here it is what drops the
# base's leftovers). Two layers: the system, then the venv (the slow one to rebuild stays
# apart from the system's).
FROM scratch AS runtime
# hadolint ignore=DL3067
COPY --from=system / /
COPY --from=builder /opt/venv /opt/venv
COPY entrypoint.sh /usr/local/bin/entrypoint.sh
RUN groupadd --gid 10001 coretrain \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
      --shell /usr/sbin/nologin coretrain \
 && mkdir -p /data /output \
 && chown 10001:0 /output \
 && chmod 2775 /output
# HOME and KERAS_HOME point at /tmp (a tmpfs / emptyDir when the root file
# system is read-only) because an arbitrary UID has no home directory.
# CORETRAIN_CACHE_DIR keeps the data cache on the output volume, shared by the runs
# into it (without it the cache would be the user's, under HOME: the tmpfs).
# TINI_SUBREAPER keeps tini correct (and quiet) when it is not PID 1, e.g.
# under `docker run --init` or compose `init: true`. PATH and LANG are set in full:
# nothing is inherited from the base's configuration (LANG as the official base sets it).
ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    KERAS_HOME=/tmp/.keras \
    TINI_SUBREAPER=1 \
    CORETRAIN_DATA=/data \
    CORETRAIN_OUTPUT=/output \
    CORETRAIN_CACHE_DIR=/output/cache
WORKDIR /tmp
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "/usr/local/bin/entrypoint.sh"]
CMD ["train"]
