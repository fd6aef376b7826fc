#!/usr/bin/env bash
# Multi-worker container smoke test (docs/distributed.md): two containers of the image,
# named and addressed like the pods of k8s/distributed.yaml's Indexed Job, each told
# only JOB_COMPLETION_INDEX, CORETRAIN_WORKERS and the CORETRAIN_WORKER_HOSTS pattern.
#
# Checks, one PASS/FAIL line each:
#   train     both containers exit 0; the chief (index 0) wrote checkpoints/, model/ and
#             metrics.json (workers 2); worker 1 wrote only workers/worker-1/; both
#             logged the same test RMSE and every record carries its worker index
#   preempt   `stop -t 60` of worker 1 alone during a longer run: both exit 143 after
#             the same step, with the chief's checkpoint of that step on the volume
#
# A user-defined network gives the containers DNS (netavark + aardvark-dns):
# coretrain-distributed-<i>.coretrain-workers resolves like the pod host names behind
# the headless Service. Environment: ENGINE (podman), IMAGE
# (localhost/coretrain:distributed), BASE_IMAGE, SKIP_SETUP=1 / SKIP_BUILD=1 as in
# smoke.sh. Exit status 0 if every check passed. About 3 minutes with the image cached.
set -euo pipefail

ROOT=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
SHARED="$ROOT/../shared"
ENGINE=${ENGINE:-podman}
IMAGE=${IMAGE:-localhost/coretrain:distributed}
BASE_IMAGE=${BASE_IMAGE:-localhost/python-base:bookworm}
RUN="dist-$$"
NET="$RUN-net"
JOB=coretrain-distributed
SERVICE=coretrain-workers
WORK=$(mktemp -d "${TMPDIR:-/tmp}/coretrain-distributed.XXXXXX")
START=$SECONDS

LOG_TAG=distributed
# shellcheck source=tests/container/lib.sh
source "$ROOT/tests/container/lib.sh"
VOLUMES+=("$RUN-out")
NETWORKS+=("$NET")

setup_and_build

mkdir -m 0777 "$WORK/data"
"$ENGINE" run --rm --network none -v "$WORK/data:/gen" "$IMAGE" \
  generate --out /gen --train 240 --test 60 --seed 1 >/dev/null
"$ENGINE" network create "$NET" >/dev/null
"$ENGINE" volume create "$RUN-out" >/dev/null

# start_worker INDEX NAME [train options...]: one "pod" of the Indexed Job, detached.
start_worker() {
  local index=$1 name=$2
  shift 2
  CONTAINERS+=("$name")
  "$ENGINE" run -d --name "$name" --hostname "$JOB-$index" \
    --network "$NET" --network-alias "$JOB-$index.$SERVICE" \
    --read-only --tmpfs /tmp --cpus 1 \
    -v "$WORK/data:/data:ro" -v "$RUN-out:/output" \
    -e JOB_COMPLETION_INDEX="$index" -e CORETRAIN_WORKERS=2 \
    -e CORETRAIN_WORKER_HOSTS="$JOB-{index}.$SERVICE:12345" \
    -e CORETRAIN_BATCH_SIZE=20 -e CORETRAIN_EVAL_EVERY=3 \
    "$IMAGE" train "$@" >/dev/null
}
wait_exit() { "$ENGINE" wait "$1" 2>/dev/null | tail -n 1; }

# --- train to completion -----------------------------------------------------------------
log "two workers train 6 steps"
for i in 0 1; do start_worker "$i" "$RUN-train-$i" --max-steps 6 --checkpoint-every 3; done
codes="$(wait_exit "$RUN-train-0") $(wait_exit "$RUN-train-1")"
for i in 0 1; do "$ENGINE" logs "$RUN-train-$i" >"$WORK/train-$i.log" 2>&1; done
files=$("$ENGINE" run --rm --user 0:0 --network none -v "$RUN-out:/output:ro" \
  --entrypoint sh "$IMAGE" -c 'cd /output && find . -maxdepth 3 | sort')
rmse0=$(query "$WORK/train-0.log" '[p["test_rmse"] for p in ev("progress")]')
rmse1=$(query "$WORK/train-1.log" '[p["test_rmse"] for p in ev("progress")]')
tagged=$(query "$WORK/train-0.log" 'all(r.get("worker") == 0 for r in records) and bool(records)')
tagged1=$(query "$WORK/train-1.log" 'all(r.get("worker") == 1 for r in records) and bool(records)')
other=$(grep -c '^\./workers/worker-1/' <<<"$files" || true)
if [ "$codes" = "0 0" ] && [ "$rmse0" = "$rmse1" ] && [ "$tagged $tagged1" = "True True" ] &&
  grep -qx './checkpoints/ckpt-6.index' <<<"$files" && grep -qx './metrics.json' <<<"$files" &&
  grep -qx './model' <<<"$files" && [ "$other" -ge 3 ]; then
  pass train "exit $codes, same test RMSE $rmse0, chief wrote checkpoints/model/metrics"
else
  show "$WORK/train-0.log"
  show "$WORK/train-1.log"
  fail train "exit $codes, rmse $rmse0 vs $rmse1, tagged $tagged/$tagged1, files: $(tr '\n' ' ' <<<"$files")"
fi

# --- SIGTERM to worker 1 only --------------------------------------------------------------
log "two workers train on; stop -t 60 worker 1 after its first progress event"
for i in 0 1; do
  start_worker "$i" "$RUN-pre-$i" --max-steps 100000 --checkpoint-every 1000
done
deadline=$((SECONDS + 300))
# The log is copied first: under pipefail, `logs | grep -q` fails once grep stops reading
# before the log is all written (SIGPIPE), and the loop waited out its deadline.
until "$ENGINE" logs "$RUN-pre-1" >"$WORK/poll.log" 2>&1 && grep -q '"event": "progress"' "$WORK/poll.log"; do
  [ $SECONDS -gt $deadline ] && break
  sleep 1
done
"$ENGINE" stop -t 60 "$RUN-pre-1" >/dev/null
codes="$(wait_exit "$RUN-pre-0") $(wait_exit "$RUN-pre-1")"
for i in 0 1; do "$ENGINE" logs "$RUN-pre-$i" >"$WORK/pre-$i.log" 2>&1; done
step0=$(query "$WORK/pre-0.log" 'ev("end")[-1].get("final_step") if ev("end") else None')
step1=$(query "$WORK/pre-1.log" 'ev("end")[-1].get("final_step") if ev("end") else None')
saved=$("$ENGINE" run --rm --user 0:0 --network none -v "$RUN-out:/output:ro" --entrypoint sh \
  "$IMAGE" -c "test -f /output/checkpoints/ckpt-$step0.index && echo yes || echo no")
if [ "$codes" = "143 143" ] && [ "$step0" = "$step1" ] && [ "$saved" = yes ]; then
  pass preempt "exit $codes after step $step0 on both, chief's ckpt-$step0 on the volume"
else
  show "$WORK/pre-0.log"
  show "$WORK/pre-1.log"
  fail preempt "exit $codes, final steps $step0/$step1, chief checkpoint: $saved"
fi

log "total $((SECONDS - START)) s"
if [ "$FAILED" = 0 ]; then echo "distributed container smoke test: PASS"; else echo "distributed container smoke test: FAIL"; fi
exit "$FAILED"
