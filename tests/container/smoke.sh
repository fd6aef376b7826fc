#!/usr/bin/env bash
# Container smoke test (`make container-test`): builds the image and runs it the
# way users do (docs/deploy.md), with a real container engine and real cgroups.
#
# Checks, one PASS/FAIL/SKIP line each:
#   size             the image is at most 1,000 MB (docs/deploy.md "Image size and start-up")
#   bytecode         the image user can read every __pycache__ of the venv (else every start
#                    compiles the modules TensorFlow imports)
#   plan-cpus        `run --cpus=1.5 IMAGE plan --format json` reports cpu_quota 1.5
#   plan-cpuset      `run --cpuset-cpus=1 IMAGE plan` reports cpuset [1]
#   exec-threads     `run --cpus=0.5 IMAGE exec -- python ...`: the program's BLAS pool and
#                    TF_NUM_INTRAOP_THREADS are 1
#   exec-exit-code   `run IMAGE exec -- sh -c 'exit 7'` exits 7
#   train            `train` as the image user, --read-only root, tmpfs /tmp, a named
#                    output volume and the data mounted read-only: exit 0, status
#                    completed, checkpoints/ model/ logs/train.jsonl metrics.json written
#   preempt          `stop -t 60` during training: exit 143, a checkpoint saved and an
#                    `end` event with status "preempted"
#   resume           a rerun on that volume logs `resume` at the saved step and completes
#   arbitrary-uid    `--user 123456:0` (OpenShift style) trains into a fresh named volume
#
# Environment: ENGINE (podman; docker works too and skips the setup script), IMAGE
# (localhost/coretrain:smoke), BASE_IMAGE (podman: the stand-in localhost/python-base:
# bookworm that ../shared/tools/podman-setup.sh makes; docker: unset, the Dockerfile's
# digest-pinned default),
# SKIP_SETUP=1 / SKIP_BUILD=1 to reuse an engine / image, NO_CACHE=1 to build without the
# layer cache. Exit status 0 if every check passed (SKIP allowed), 1 otherwise. Needs
# python3 on the host (reads the JSON logs). Durations: docs/deploy.md "Smoke test and
# measurements".
set -euo pipefail

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
SHARED="$ROOT/../shared"
ENGINE=${ENGINE:-podman}
IMAGE=${IMAGE:-localhost/coretrain:smoke}
if [ "$ENGINE" = podman ]; then
  BASE_IMAGE=${BASE_IMAGE:-localhost/python-base:bookworm} # made by podman-setup.sh
else
  BASE_IMAGE=${BASE_IMAGE:-} # empty: the Dockerfile's digest-pinned default
fi
RUN="smoke-$$"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/coretrain-smoke.XXXXXX")
START=$SECONDS

LOG_TAG=smoke
# shellcheck source=tests/container/lib.sh
source "$ROOT/tests/container/lib.sh"

# The user's view of the files in a named volume: "uid:gid mode path" per entry.
list_volume() {
  "$ENGINE" run --rm --user 0:0 --network none -v "$1:/output:ro" --entrypoint python "$IMAGE" -c '
import os, stat
for d, dirs, files in os.walk("/output"):
    for n in sorted(dirs + files):
        p = os.path.join(d, n); s = os.lstat(p)
        print(f"{s.st_uid}:{s.st_gid} {stat.S_IMODE(s.st_mode):o} {p}")'
}

new_volume() { # new_volume SUFFIX: creates "$RUN-SUFFIX" (removed on exit)
  "$ENGINE" volume create "$RUN-$1" >/dev/null
  VOLUMES+=("$RUN-$1")
}

# Small, fast training settings: 240 samples, batches of 40 (6 steps per epoch).
TRAIN_ARGS=(--batch-size 40 --eval-every 5 --checkpoint-every 5)
train_run() { # train_run NAME VOLUME [engine run options...] -- [train options...]
  local name=$1 volume=$2; shift 2
  local opts=()
  while [ $# -gt 0 ] && [ "$1" != "--" ]; do opts+=("$1"); shift; done
  shift
  CONTAINERS+=("$RUN-$name")
  "$ENGINE" run --name "$RUN-$name" --network none --read-only --tmpfs /tmp \
    -v "$WORK/data:/data:ro" -v "$volume:/output" "${opts[@]}" \
    "$IMAGE" train "${TRAIN_ARGS[@]}" "$@"
}

# --- engine and image ----------------------------------------------------------------------
setup_and_build
size=$("$ENGINE" image inspect -f '{{.Size}}' "$IMAGE")
log "image $IMAGE: $((size / 1000000)) MB"
if [ "$size" -le 1000000000 ]; then
  pass size "$size bytes ≤ 1,000 MB"
else
  fail size "$size bytes > 1,000 MB"
fi
BYTECODE_PROBE='import os
dirs = [os.path.join(d, n) for d, names, _ in os.walk("/opt/venv")
        for n in names if n == "__pycache__"]
print(len(dirs), sum(not os.access(d, os.R_OK | os.X_OK) for d in dirs))'
read -r pycache unreadable < <("$ENGINE" run --rm --network none --entrypoint python "$IMAGE" \
  -c "$BYTECODE_PROBE" 2>&1 || echo "0 error")
if [ "$pycache" -gt 0 ] && [ "$unreadable" = 0 ]; then
  pass bytecode "the image user reads all $pycache __pycache__ directories"
else
  fail bytecode "$unreadable of $pycache __pycache__ directories unreadable to the image user"
fi

# --- plan: the CPU budget the container was given --------------------------------------------
if "$ENGINE" run --rm --network none --cpus=1.5 "$IMAGE" plan --format json >"$WORK/plan-cpus.json" &&
  [ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cpu_quota"])' "$WORK/plan-cpus.json")" = 1.5 ]; then
  pass plan-cpus "--cpus=1.5 → cpu_quota 1.5"
else
  fail plan-cpus "--cpus=1.5: $(head -c 600 "$WORK/plan-cpus.json")"
fi

if [ "$(nproc --all)" -lt 2 ]; then
  skip plan-cpuset "this machine has one CPU; --cpuset-cpus=1 needs two"
elif "$ENGINE" run --rm --network none --cpuset-cpus=1 "$IMAGE" plan --format json >"$WORK/plan-cpuset.json" &&
  [ "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["cpuset"])' "$WORK/plan-cpuset.json")" = "[1]" ]; then
  pass plan-cpuset "--cpuset-cpus=1 → cpuset [1]"
else
  fail plan-cpuset "--cpuset-cpus=1: $(head -c 600 "$WORK/plan-cpuset.json")"
fi

# --- exec: a user's own program on the planned CPUs -------------------------------------------
# Under --cpus=0.5 the program's numpy BLAS pool and TensorFlow's variable say 1 thread (bare,
# OpenBLAS would count every CPU it sees); its exit code is the container's.
EXEC_PROBE='import json, os, threadpoolctl, numpy
print(json.dumps([[p["num_threads"] for p in threadpoolctl.threadpool_info()], os.environ.get("TF_NUM_INTRAOP_THREADS")]))'
if "$ENGINE" run --rm --network none --cpus=0.5 "$IMAGE" exec -- python -c "$EXEC_PROBE" \
  >"$WORK/exec.out" 2>"$WORK/exec.err" &&
  [ "$(tail -n 1 "$WORK/exec.out")" = '[[1], "1"]' ]; then
  pass exec-threads "--cpus=0.5: exec -- python → BLAS [1], TF_NUM_INTRAOP_THREADS 1"
else
  fail exec-threads "--cpus=0.5: $(head -c 300 "$WORK/exec.out") $(tail -c 600 "$WORK/exec.err")"
fi
rc=0
"$ENGINE" run --rm --network none "$IMAGE" exec -- sh -c 'exit 7' >/dev/null 2>&1 || rc=$?
if [ "$rc" = 7 ]; then
  pass exec-exit-code "exec -- sh -c 'exit 7' → the container exits 7"
else
  fail exec-exit-code "exec -- sh -c 'exit 7' → exit $rc"
fi

# --- a tiny data set, written by the image itself, mounted read-only below -------------------
mkdir -m 0777 "$WORK/data"
log "generate tiny data set"
if ! "$ENGINE" run --rm --network none -v "$WORK/data:/gen" "$IMAGE" \
  generate --out /gen --train 240 --test 60 --seed 1 >"$WORK/generate.log" 2>&1; then
  cat "$WORK/generate.log"
  fail generate "coretrain generate failed in the container (log above)"
  exit 1
fi
# The image user writes 0640 files (umask 0027: docs/security.md); a data mount is the
# operator's to share, so open these to the other UIDs the checks below run as.
chmod -R a+rX "$WORK/data"

# --- train to completion as the image user ---------------------------------------------------
new_volume out
out=$RUN-out
log "train (image user, --read-only, tmpfs /tmp, --cpus=1.5)"
rc=0
train_run train "$out" --cpus=1.5 -- --max-steps 10 >"$WORK/train.log" 2>&1 || rc=$?
files=$(list_volume "$out" || true)
status=$(query "$WORK/train.log" 'ev("end")[-1]["status"] if ev("end") else None')
budget=$(query "$WORK/train.log" 'ev("start")[0]["plan"]["cpu_budget"] if ev("start") else None' || true)
missing=""
for f in checkpoints model logs/train.jsonl metrics.json; do
  grep -q " /output/$f\$" <<<"$files" || missing="$missing $f"
done
owner=$(grep ' /output/metrics.json$' <<<"$files" | cut -d' ' -f1 || true)
if [ "$rc" = 0 ] && [ "$status" = completed ] && [ -z "$missing" ] && [ "${owner%%:*}" = 10001 ]; then
  pass train "exit 0, status completed, cpu_budget $budget, output complete, owner $owner"
else
  show "$WORK/train.log"
  fail train "exit $rc, status $status, missing:${missing:- none}, metrics.json owner ${owner:-none}"
fi

# --- SIGTERM during training: checkpoint, exit 143, preempted --------------------------------
new_volume preempt
pre=$RUN-preempt
# No periodic checkpoint in this run: the only one can come from the SIGTERM path.
log "train in the background, then stop -t 60 after the first progress event"
CONTAINERS+=("$RUN-preempt")
"$ENGINE" run -d --name "$RUN-preempt" --network none --read-only --tmpfs /tmp \
  --cpus=1.5 -v "$WORK/data:/data:ro" -v "$pre:/output" \
  "$IMAGE" train --batch-size 40 --eval-every 5 --checkpoint-every 100000 --max-steps 100000 \
  >/dev/null || true
deadline=$((SECONDS + 300))
# The log is copied first: under pipefail, `logs | grep -q` fails once grep stops reading
# before the log is all written (SIGPIPE), and the loop waited out its deadline.
until "$ENGINE" logs "$RUN-preempt" >"$WORK/poll.log" 2>&1 && grep -q '"event": "progress"' "$WORK/poll.log"; do
  if [ "$("$ENGINE" inspect -f '{{.State.Running}}' "$RUN-preempt" 2>&1)" != true ] ||
    [ $SECONDS -gt $deadline ]; then
    break
  fi
  sleep 1
done
"$ENGINE" stop -t 60 "$RUN-preempt" >/dev/null || true
rc=$("$ENGINE" inspect -f '{{.State.ExitCode}}' "$RUN-preempt" 2>&1 || true)
"$ENGINE" logs "$RUN-preempt" >"$WORK/preempt.log" 2>&1 || true
status=$(query "$WORK/preempt.log" 'ev("end")[-1]["status"] if ev("end") else None')
saved=$(query "$WORK/preempt.log" 'ev("checkpoint")[-1]["step"] if ev("checkpoint") else None')
final=$(query "$WORK/preempt.log" 'ev("end")[-1].get("final_step") if ev("end") else None')
on_disk=$(list_volume "$pre" | grep -c " /output/checkpoints/ckpt-$saved.index\$" || true)
if [ "$rc" = 143 ] && [ "$status" = preempted ] && [ "$saved" != None ] && [ "$saved" = "$final" ] &&
  [ "$on_disk" = 1 ]; then
  pass preempt "exit 143, checkpoint ckpt-$saved on the volume, end status preempted"
else
  show "$WORK/preempt.log"
  fail preempt "exit $rc, status $status, last checkpoint step $saved (on volume: $on_disk), end final_step $final"
fi

# --- the rerun resumes from that step ---------------------------------------------------------
if [ "$saved" != None ] && [ -n "$saved" ]; then
  target=$((saved + 5))
  rc=0
  train_run resume "$pre" --cpus=1.5 -- --max-steps "$target" >"$WORK/resume.log" 2>&1 || rc=$?
  resumed=$(query "$WORK/resume.log" 'ev("resume")[0]["step"] if ev("resume") else None')
  status=$(query "$WORK/resume.log" 'ev("end")[-1]["status"] if ev("end") else None')
  final=$(query "$WORK/resume.log" 'ev("end")[-1].get("final_step") if ev("end") else None')
  if [ "$rc" = 0 ] && [ "$resumed" = "$saved" ] && [ "$status" = completed ] && [ "$final" = "$target" ]; then
    pass resume "resume event at step $resumed, completed at step $final"
  else
    show "$WORK/resume.log"
    fail resume "exit $rc, resume step $resumed (want $saved), status $status, final step $final"
  fi
else
  fail resume "no checkpoint from the preempted run to resume from"
fi

# --- an arbitrary non-root UID in group 0 (OpenShift) ---------------------------------------
new_volume anyuid
anyuid=$RUN-anyuid
log "train as --user 123456:0"
rc=0
train_run anyuid "$anyuid" --cpus=1.5 --user 123456:0 -- --max-steps 5 >"$WORK/anyuid.log" 2>&1 || rc=$?
status=$(query "$WORK/anyuid.log" 'ev("end")[-1]["status"] if ev("end") else None')
owner=$(list_volume "$anyuid" | grep ' /output/metrics.json$' | cut -d' ' -f1 || true)
if [ "$rc" = 0 ] && [ "$status" = completed ] && [ "$owner" = 123456:0 ]; then
  pass arbitrary-uid "--user 123456:0: exit 0, status completed, files owned by $owner"
else
  show "$WORK/anyuid.log"
  fail arbitrary-uid "exit $rc, status $status, metrics.json owner ${owner:-none}"
fi

log "total $((SECONDS - START)) s"
if [ "$FAILED" = 0 ]; then
  echo "container smoke test: PASS"
else
  echo "container smoke test: FAIL"
fi
exit "$FAILED"
