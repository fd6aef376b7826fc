#!/bin/sh
# Container entry point: `IMAGE [coretrain arguments]`, e.g. `IMAGE train
# --max-steps 500`, `IMAGE plan --format json` or `IMAGE exec -- python my.py`
# (your own program on the planned CPUs; the image's CMD is `train`).
# tini (PID 1) runs this script; the final `exec` replaces the shell with
# coretrain, so SIGTERM from `docker stop` / the kubelet reaches Python
# directly. For a shell in the image use `--entrypoint bash`.
set -eu

# Files the job writes are readable by the volume's group (OpenShift: GID 0;
# Kubernetes: the pod's fsGroup), e.g. a TF Serving pod of that group, but
# writable only by the UID that wrote them: the job refuses directories of
# another user, and group members can't plant or swap files in its own
# (docs/security.md). Files 0640, directories 0750 (2750 on the setgid /output).
umask 0027

# An arbitrary UID has no passwd entry and no home; keep HOME somewhere writable.
if [ ! -w "${HOME:-/nonexistent}" ]; then
  export HOME=/tmp
fi

exec coretrain "$@"
