# Shared helpers of the container tests (smoke.sh, distributed.sh); sourced, not run.
#
# The sourcing script sets ROOT, SHARED, ENGINE, IMAGE, BASE_IMAGE, WORK and START, and
# LOG_TAG (the prefix of progress lines); FAILED is set to 1 by `fail`. Containers, volumes
# and networks it adds to CONTAINERS, VOLUMES and NETWORKS are removed on exit, with WORK.
# shellcheck shell=bash

CONTAINERS=()
VOLUMES=()
NETWORKS=()
FAILED=0

# shellcheck disable=SC2317  # run by the EXIT trap
cleanup() {
  local name
  for name in "${CONTAINERS[@]}"; do "$ENGINE" rm -f -t 0 "$name" >/dev/null 2>&1 || true; done
  for name in "${VOLUMES[@]}"; do "$ENGINE" volume rm -f "$name" >/dev/null 2>&1 || true; done
  for name in "${NETWORKS[@]}"; do "$ENGINE" network rm -f "$name" >/dev/null 2>&1 || true; done
  rm -rf "$WORK"
}
trap cleanup EXIT

log() { printf '[%s %4ds] %s\n' "$LOG_TAG" "$((SECONDS - START))" "$*"; }
pass() { printf 'PASS %-14s %s\n' "$1" "$2"; }
# shellcheck disable=SC2034  # FAILED is read by the sourcing script
fail() { printf 'FAIL %-14s %s\n' "$1" "$2"; FAILED=1; }
skip() { printf 'SKIP %-14s %s\n' "$1" "$2"; }
show() { tail -n 20 "$1" | cut -c1-400 | sed 's/^/    | /'; } # the end of a log, indented

# query FILE EXPR: evaluate a Python expression over the JSON log records in FILE
# (lines that are not JSON, e.g. from the engine, are ignored). `ev(name)` lists the
# records of one event; prints the result, or <Error: ...> if the expression raises.
query() {
  python3 - "$1" "$2" <<'PY'
import json, sys
records = []
for line in open(sys.argv[1], encoding="utf-8", errors="replace"):
    line = line.strip()
    if line.startswith("{"):
        try:
            records.append(json.loads(line))
        except ValueError:
            pass
def ev(name):
    return [r for r in records if r.get("event") == name]
try:
    print(eval(sys.argv[2]))
except Exception as exc:  # a malformed log is a failed check, not a crashed script
    print(f"<{type(exc).__name__}: {exc}>")
PY
}

# setup_and_build: the engine (podman: ../shared/tools/podman-setup.sh, unless
# SKIP_SETUP=1; where the checkout has no ../shared beside it, the engine and base image
# already installed on the machine) and the image (unless SKIP_BUILD=1; NO_CACHE=1 builds
# without the layer cache). Exits 1 with the end of the build log if the build fails.
setup_and_build() {
  if [ "$ENGINE" = podman ] && [ "${SKIP_SETUP:-0}" != 1 ]; then
    if [ -f "$SHARED/tools/podman-setup.sh" ]; then
      log "engine: bash ../shared/tools/podman-setup.sh"
      bash "$SHARED/tools/podman-setup.sh"
    elif [ -z "$BASE_IMAGE" ] || "$ENGINE" image exists "$BASE_IMAGE"; then
      log "engine: no $SHARED/tools/podman-setup.sh beside this checkout;" \
        "using the installed $ENGINE and base image ${BASE_IMAGE:-(Dockerfile default)}"
    else
      fail setup "no $SHARED/tools/podman-setup.sh and no $BASE_IMAGE image: run the setup script, or set BASE_IMAGE"
      exit 1
    fi
  fi
  if [ "${SKIP_BUILD:-0}" != 1 ]; then
    log "build $IMAGE (BASE_IMAGE=${BASE_IMAGE:-Dockerfile default})"
    local build_flags=(-t "$IMAGE")
    if [ -n "$BASE_IMAGE" ]; then build_flags+=(--build-arg "BASE_IMAGE=$BASE_IMAGE"); fi
    if [ "${NO_CACHE:-0}" = 1 ]; then build_flags+=(--no-cache); fi
    if [ "$ENGINE" = podman ]; then
      # pip and apt inside the build reach the network through this machine.
      build_flags+=(--network host -v /etc/ssl/certs:/etc/ssl/certs:ro)
    fi
    if ! "$ENGINE" build "${build_flags[@]}" "$ROOT" >"$WORK/build.log" 2>&1; then
      tail -n 40 "$WORK/build.log"
      fail build "image build failed (log above)"
      exit 1
    fi
  fi
}
