#!/bin/sh
# Container entry point: `IMAGE [coretrain arguments]`, e.g. `IMAGE train
# --max-steps 500` or `IMAGE plan --format json` (the image's CMD is `train`).
# tini (PID 1) runs this script; the final `exec` replaces the shell with
# coretrain, so SIGTERM from `docker stop` / the kubelet reaches Python
# directly. For a shell in the image use `--entrypoint bash`.
set -eu

# Files the job writes are group-writable, so a rerun under another UID of the
# same group (OpenShift: arbitrary UID, GID 0; Kubernetes: the pod's fsGroup)
# can resume from them.
umask 0002

# An arbitrary UID has no passwd entry and no home; keep HOME somewhere writable.
if [ ! -w "${HOME:-/nonexistent}" ]; then
  export HOME=/tmp
fi

exec coretrain "$@"
