"""Multi-worker training (app/cluster/, app/training/loop/replicas.py, docs/distributed.md).

Cluster resolution and input shards are pure functions, tested directly. The
behaviour is tested with real worker processes of the real CLI on localhost
ports: two workers train to identical weights; SIGTERM to one worker stops
both at the same step with a checkpoint and exit 143; a rerun resumes; a
worker killed with SIGKILL makes the other exit 6; a worker whose peer never
starts gives up after --cluster-timeout. The same with an output directory per
worker (as with a volume per pod) and the cluster in TF_CONFIG as the manifest gives
it: a rerun with an empty worker directory resumes both from the chief's checkpoint,
with the losses of an uninterrupted run bit for bit; workers given different data or
options stop with exit 6 naming what differs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from app.cluster import spec
from app.cluster.spec import Cluster, ClusterOptions, free_ports
from app.config import TrainConfig
from app.data import synthetic
from app.errors import ClusterError, ConfigError
from app.training.state import workspace
from tests.conftest import PINNED, REPO, TINY, events, json_lines, run_cli


def resolve(environ: dict[str, str], hosts: str | None = None, **options: object) -> Cluster | None:
    return spec.resolve(environ, ClusterOptions(worker_hosts=hosts, **options))  # type: ignore[arg-type]


# --- cluster resolution (no TensorFlow) ------------------------------------------------------


def test_no_tf_config_and_no_workers_means_a_single_process() -> None:
    assert resolve({}) is None
    assert resolve({"TF_CONFIG": "  "}) is None
    assert resolve({}, workers=1) is None
    assert resolve({"JOB_COMPLETION_INDEX": "3"}) is None


def test_tf_config_with_workers() -> None:
    tf_config = {
        "cluster": {"worker": ["a:1", "b:2", "c:3"]},
        "task": {"type": "worker", "index": 2},
    }
    cluster = resolve({"TF_CONFIG": json.dumps(tf_config)})
    assert cluster is not None
    assert cluster.hosts == ("a:1", "b:2", "c:3")
    assert (cluster.count, cluster.index, cluster.is_chief) == (3, 2, False)
    assert cluster.source == "TF_CONFIG"
    assert cluster.tf_config() == tf_config
    assert cluster.to_json()["heartbeat_timeout_s"] == spec.DEFAULT_HEARTBEAT_TIMEOUT


def test_tf_config_chief_is_worker_zero() -> None:
    cluster_spec = {"chief": ["c:1"], "worker": ["w0:1", "w1:1"]}
    chief = resolve(
        {"TF_CONFIG": json.dumps({"cluster": cluster_spec, "task": {"type": "chief", "index": 0}})}
    )
    worker = resolve(
        {"TF_CONFIG": json.dumps({"cluster": cluster_spec, "task": {"type": "worker", "index": 1}})}
    )
    assert chief is not None and worker is not None
    assert chief.hosts == ("c:1", "w0:1", "w1:1")
    assert (chief.index, chief.is_chief) == (0, True)
    assert (worker.index, worker.is_chief, worker.task_type, worker.task_id) == (
        2,
        False,
        "worker",
        1,
    )


def test_tf_config_with_one_worker_is_a_single_process() -> None:
    one = {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}}
    assert resolve({"TF_CONFIG": json.dumps(one)}) is None


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("{not json", "not valid JSON"),
        ('{"task": {"type": "worker", "index": 0}}', '"cluster" object'),
        ('{"cluster": {"worker": ["a:1", "b:1"]}}', '"task" object'),
        ('{"cluster": {"worker": ["a:1"], "ps": ["p:1"]}, "task": {"type": "worker"}}', "'ps'"),
        ('{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}', "non-empty"),
        ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 2}}', "0..1"),
        ('{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}', "chief"),
        (
            '{"cluster": {"chief": ["a:1", "b:1"]}, "task": {"type": "chief", "index": 0}}',
            "one chief",
        ),
    ],
)
def test_bad_tf_config_is_a_config_error(value: str, problem: str) -> None:
    with pytest.raises(ConfigError, match="TF_CONFIG") as info:
        resolve({"TF_CONFIG": value})
    assert problem in str(info.value)


def test_indexed_job_pattern_with_job_completion_index() -> None:
    cluster = resolve(
        {"JOB_COMPLETION_INDEX": "1"},
        workers=3,
        hosts="coretrain-{index}.coretrain-workers",
        cluster_timeout=30,
        heartbeat_timeout=5,
    )
    assert cluster is not None
    assert cluster.hosts == tuple(
        f"coretrain-{i}.coretrain-workers:{spec.DEFAULT_PORT}" for i in range(3)
    )
    assert (cluster.index, cluster.task_type, cluster.task_id) == (1, "worker", 1)
    assert "JOB_COMPLETION_INDEX" in cluster.source
    assert (cluster.cluster_timeout, cluster.heartbeat_timeout) == (30, 5)
    assert cluster.tf_config() == {
        "cluster": {"worker": list(cluster.hosts)},
        "task": {"type": "worker", "index": 1},
    }


def test_worker_index_option_wins_over_job_completion_index_and_lists_keep_ports() -> None:
    cluster = resolve(
        {"JOB_COMPLETION_INDEX": "1"}, workers=2, worker_index=0, hosts="10.0.0.5:2222, 10.0.0.6"
    )
    assert cluster is not None
    assert cluster.hosts == ("10.0.0.5:2222", f"10.0.0.6:{spec.DEFAULT_PORT}")
    assert cluster.is_chief
    assert cluster.source == "--workers/--worker-hosts/--worker-index"


@pytest.mark.parametrize(
    ("environ", "kwargs", "problem"),
    [
        ({}, {"workers": 2, "worker_index": 0}, "needs --worker-hosts"),
        ({}, {"workers": 2, "hosts": "w{index}"}, "JOB_COMPLETION_INDEX"),
        ({"JOB_COMPLETION_INDEX": "x"}, {"workers": 2, "hosts": "w{index}"}, "not a worker index"),
        ({}, {"workers": 2, "worker_index": 2, "hosts": "w{index}"}, "not in 0..1"),
        ({}, {"workers": 3, "worker_index": 0, "hosts": "a,b"}, "lists 2 hosts for --workers 3"),
        ({}, {"workers": 2, "worker_index": 0, "hosts": "a:1,a:1"}, "appears twice"),
        ({}, {"workers": 2, "worker_index": 0, "hosts": "a:b:c,d"}, "must be a number"),
        ({}, {"hosts": "w{index}"}, "need --workers"),
        (
            {},
            {"workers": 2, "worker_index": 0, "hosts": "w{index}", "heartbeat_timeout": 0},
            "greater than 0",
        ),
        (
            {"TF_CONFIG": '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker"}}'},
            {"workers": 2},
            "don't also give",
        ),
    ],
)
def test_incomplete_or_contradictory_cluster_options(
    environ: dict[str, str], kwargs: dict, problem: str
) -> None:
    with pytest.raises(ConfigError) as info:
        resolve(environ, **kwargs)
    assert problem in str(info.value)


def test_only_the_chief_writes_to_the_output_directory_itself(tmp_path: Path) -> None:
    chief = resolve({}, workers=2, worker_index=0, hosts="w{index}")
    other = resolve({}, workers=2, worker_index=1, hosts="w{index}")
    assert chief is not None and other is not None
    config = TrainConfig.of(data_dir=tmp_path / "data", output_dir=tmp_path / "out")
    assert workspace.for_run(config, None).own == config.output_dir
    assert workspace.for_run(config, chief).own == config.output_dir
    assert workspace.for_run(config, other).own == tmp_path / "out/workers/worker-1"
    assert workspace.for_run(config, chief).cache == tmp_path / "out/cache"  # no HOME (conftest)
    assert workspace.for_run(config, other).cache == tmp_path / "out/workers/worker-1/cache"
    shared = TrainConfig.of(
        data_dir=config.data.data_dir, output_dir=config.output_dir, cache_dir=Path("/c")
    )
    assert workspace.for_run(shared, other).cache == Path("/c/worker-1")
    assert workspace.for_run(shared, chief).cache == Path("/c")
    assert not workspace.for_run(config, other).is_chief


# --- input shards -----------------------------------------------------------------------------


@pytest.mark.parametrize(("workers", "batch", "n"), [(2, 40, 240), (3, 7, 50), (4, 64, 100)])
def test_shards_split_the_single_process_batch(workers: int, batch: int, n: int) -> None:
    from app.data.input.order import batch_indices, batch_rows

    for step in (0, 1, 5, 17):
        shards = [batch_rows(3, step, batch, n, workers, i) for i in range(workers)]
        single = np.sort(batch_indices(3, step, batch * workers, n))  # the 1-process order
        for i, rows in enumerate(shards):
            assert rows.shape == (batch,) and rows.dtype == np.int64
            assert np.array_equal(rows, single[i::workers])
            assert np.all(np.diff(rows) >= 0), "sorted for sequential reads"
        assert np.array_equal(np.sort(np.concatenate(shards)), single)
    one = batch_rows(3, 4, batch, n)
    assert np.array_equal(one, np.sort(batch_indices(3, 4, batch, n)))


def test_the_loss_is_the_rmse_plus_the_weight_decay() -> None:
    # The multi-worker step adds the decay to an all-reduced RMSE itself, so it must be the
    # very term of the single-process loss.
    import numpy as np
    import tensorflow as tf

    from app import model as model_lib

    model = model_lib.build_model(3, seed=4)
    y = tf.random.stateless_normal((5, 3), seed=(1, 2))
    pred = model(tf.random.stateless_normal((5, 20, 195, 1), seed=(3, 4)))
    total, rmse = model_lib.regularized_loss(model, pred, y)
    decay = float(model_lib.weight_decay(model))
    # total = fl(rmse + decay) is off by at most half an ulp of total, and the float32
    # subtraction below adds at most half an ulp of the difference: 2 ulps of total bound it
    # whatever the CPU's kernels (oneDNN or Eigen) round in between.
    ulp = float(np.spacing(np.float32(total)))
    assert abs(float(total - rmse) - decay) <= 2 * ulp
    assert decay > 0


# --- failures as the other workers see them --------------------------------------------------


@pytest.fixture
def chief() -> Cluster:
    cluster = resolve({}, workers=2, worker_index=0, hosts="w{index}")
    assert cluster is not None
    return cluster


def test_a_reported_failure_names_the_worker_and_its_error(chief: Cluster) -> None:
    import tensorflow as tf

    from app.cluster import collectives

    exc = tf.errors.AbortedError(
        None,
        None,
        "Collective ops is aborted by: coretrain worker 1 failed: StorageError: /o: disk full\n"
        "\t [[{{node CollectiveReduceV2}}]]",
    )
    error = collectives.lost_worker_error(exc, chief, "training step 7")
    assert error.exit_code == 6
    assert str(error).startswith(
        "worker 0: training step 7 failed: worker 1 failed (StorageError: /o: disk full); "
    )


def test_a_heartbeat_timeout_names_the_silent_worker(chief: Cluster) -> None:
    import tensorflow as tf

    from app.cluster import collectives

    exc = tf.errors.UnavailableError(
        None,
        None,
        "Graph execution error:\n\nDetected at node CollectiveReduceV2\nCollective ops is "
        "aborted by: Error reported from /job:worker/task:1: The following tasks are unhealthy "
        "(stopped sending heartbeats):\n/job:worker/replica:0/task:1\n",
    )
    error = collectives.lost_worker_error(exc, chief, "evaluation")
    assert str(error).startswith(
        "worker 0: evaluation failed: worker 1 stopped responding (heartbeat timeout 30 s "
    )
    assert "Collective ops is aborted" in str(error)
    assert "Detected at node" not in str(error)


def test_collective_turns_only_peer_failures_into_cluster_errors(
    chief: Cluster,
) -> None:
    import tensorflow as tf

    from app.cluster import collectives

    lost = tf.errors.DeadlineExceededError(None, None, "Deadline Exceeded")
    cancelled = tf.errors.CancelledError(None, None, "cancelled")
    for raised in (lost, cancelled):
        with (
            pytest.raises(ClusterError, match="restore failed: another worker") as info,
            collectives.collective(chief, "restore"),
        ):
            raise raised
        assert info.value.__cause__ is raised
    for other in (tf.errors.InvalidArgumentError(None, None, "bad shape"), ValueError("plain")):
        with pytest.raises(type(other)) as info, collectives.collective(chief, "restore"):
            raise other
        assert info.value is other


def test_failures_every_worker_meets_together_are_not_reported(
    chief: Cluster,
) -> None:
    from app.cluster import strategy
    from app.errors import Preempted, TrainingDiverged

    for exc in (
        Preempted("stopped"),
        TrainingDiverged("nan"),
        ClusterError("lost"),
    ):
        assert strategy.report_failure(chief, exc) is False


# --- CLI usage errors (exit 2 before TensorFlow is imported) ----------------------------------


def test_workers_without_hosts_is_a_usage_error(tiny_data: Path, tmp_path: Path) -> None:
    proc = run_cli(
        "train", "--data", str(tiny_data), "--output", str(tmp_path / "o"), "--workers", "2"
    )
    assert proc.returncode == 2, proc.stderr
    assert "--worker-hosts" in proc.stderr
    assert not (tmp_path / "o").exists()


def test_tf_config_and_worker_options_conflict(tiny_data: Path, tmp_path: Path) -> None:
    tf_config = {"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}
    proc = run_cli(
        "train",
        "--data",
        str(tiny_data),
        "--output",
        str(tmp_path / "o"),
        env={"TF_CONFIG": json.dumps(tf_config), "CORETRAIN_WORKERS": "2"},
    )
    assert proc.returncode == 2, proc.stderr
    assert "TF_CONFIG is set" in proc.stderr


# --- real worker processes on localhost -------------------------------------------------------

# Per-worker batch 20: the global batch of two workers is the single-process default of the
# other CLI tests (40). One intra-op thread each: two workers share this machine's 2 cores.
WORKER_ARGS = ["--batch-size", "20", "--eval-every", "3", "--intra-op-threads", "1"]
# Generous bounds for a loaded 2-core machine: they only stop a hung test.
RUN_TIMEOUT = 400
HEARTBEAT = 10.0


class Worker:
    """One ``python -m app train`` worker process; stdout goes to a file we can poll.

    The cluster is given as ``--workers/--worker-index/--worker-hosts``, or with
    ``chief_job`` as k8s/distributed.yaml gives it: TF_CONFIG with a "chief" job (the
    first host) and a "worker" job (the others).
    """

    def __init__(
        self, index: int, hosts: str, data: Path, out: Path, *args: str, chief_job: bool = False
    ) -> None:
        self.index = index
        self.log = out.parent / f"{out.name}-worker{index}-{time.monotonic_ns()}.stdout"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("CORETRAIN_", "TF_NUM"))}
        env.update(PINNED)
        env.pop("TF_CONFIG", None)
        cluster = ["--workers", "2", "--worker-index", str(index), "--worker-hosts", hosts]
        if chief_job:
            chief, *others = hosts.split(",")
            task = (
                {"type": "chief", "index": 0}
                if index == 0
                else {"type": "worker", "index": index - 1}
            )
            env["TF_CONFIG"] = json.dumps(
                {"cluster": {"chief": [chief], "worker": others}, "task": task}
            )
            cluster = []
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "w", encoding="utf-8") as stdout:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "app",
                    "train",
                    "--data",
                    str(data),
                    "--output",
                    str(out),
                    *cluster,
                    *WORKER_ARGS,
                    *args,
                ],
                stdout=stdout,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=REPO,
            )
        self.stderr = ""

    def records(self) -> list[dict]:
        text = self.log.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.endswith("}")]

    def wait_for(self, event: str, timeout: float = RUN_TIMEOUT, **fields: object) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for record in events(self.records(), event):
                if all(record.get(k) == v for k, v in fields.items()):
                    return record
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        self.finish(timeout=5)
        raise AssertionError(f"worker {self.index}: no {event} {fields}: {self.stderr[-2000:]}")

    def finish(self, timeout: float = RUN_TIMEOUT) -> int:
        try:
            _, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
            self.stderr += err
            raise AssertionError(f"worker {self.index} still running after {timeout} s") from None
        self.stderr += err
        return self.proc.returncode


def _start_pair(
    data: Path | tuple[Path, Path],
    out: Path | tuple[Path, Path],
    *args: str,
    chief_job: bool = False,
    other: tuple[str, ...] = (),
) -> list[Worker]:
    """Workers 0 and 1 on free localhost ports, with ``args``; ``data`` and ``out`` are one
    directory for both or one each; ``other``: more arguments for worker 1 only."""
    hosts = ",".join(f"localhost:{p}" for p in free_ports(2))
    datas = data if isinstance(data, tuple) else (data, data)
    outs = out if isinstance(out, tuple) else (out, out)
    return [
        Worker(i, hosts, datas[i], outs[i], *args, *(other if i else ()), chief_job=chief_job)
        for i in range(2)
    ]


def _checkpoint_tensors(prefix: Path) -> dict[str, np.ndarray]:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }


def _same_checkpoints(a: Path, b: Path) -> dict[str, np.ndarray]:
    """Assert that checkpoints ``a`` and ``b`` hold the same training state (step, model,
    optimizer), bit for bit; return ``a``'s. ``save_counter`` counts one process's saves."""
    ours, theirs = _checkpoint_tensors(a), _checkpoint_tensors(b)
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        if not name.startswith("save_counter/"):
            assert np.array_equal(value, theirs[name]), name
    return ours


@pytest.fixture(scope="module")
def pair_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory):
    """Two workers train 6 steps into one output directory (shared by the tests below)."""
    out = tmp_path_factory.mktemp("pair") / "output"
    workers = _start_pair(tiny_data, out, "--max-steps", "6", "--checkpoint-every", "3")
    codes = [w.finish() for w in workers]
    return out, workers, codes


@pytest.mark.slow
def test_two_workers_train_to_identical_weights(pair_run) -> None:
    out, workers, codes = pair_run
    assert codes == [0, 0], [w.stderr[-2000:] for w in workers]
    chief = _same_checkpoints(
        out / "checkpoints" / "ckpt-6", out / "workers" / "worker-1" / "checkpoints" / "ckpt-6"
    )
    assert any("dense2" in name for name in chief)
    assert int(chief["step/.ATTRIBUTES/VARIABLE_VALUE"]) == 6
    assert int(chief["optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE"]) == 6
    # Training moved the weights away from the (seeded, shared) initialisation.
    from app import model as model_lib

    initial = model_lib.build_model(3, seed=0)
    assert not np.array_equal(
        initial.dense2.kernel.numpy(), chief["model/dense2/_kernel/.ATTRIBUTES/VARIABLE_VALUE"]
    )


@pytest.mark.slow
def test_two_workers_follow_the_single_process_run_with_the_global_batch(
    pair_run, tiny_data: Path, tmp_path: Path
) -> None:
    """Same batches, same dropout mask, the gradient of the global RMSE: same trajectory."""
    out, workers, codes = pair_run
    assert codes == [0, 0]
    single_out = tmp_path / "single"
    proc = run_cli(
        "train",
        "--data",
        str(tiny_data),
        "--output",
        str(single_out),
        "--max-steps",
        "6",
        "--batch-size",
        "40",
        "--eval-every",
        "3",
        "--checkpoint-every",
        "3",
        "--intra-op-threads",
        "1",
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    single = events(json_lines(proc.stdout), "progress")
    pair = events(workers[0].records(), "progress")
    assert [p["step"] for p in pair] == [p["step"] for p in single] == [3, 6]
    # Not bit for bit: two workers sum the squared errors and the gradients in another
    # order (an all-reduce of per-worker sums), ~1 ulp per step, which 6 SGD steps amplify;
    # 1e-5 relative is ~80 float32 ulps of the loss, the weights below the same.
    for a, b in zip(pair, single, strict=True):
        for key in ("loss", "train_rmse", "val_rmse"):
            assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
    ours = _checkpoint_tensors(out / "checkpoints" / "ckpt-6")
    theirs = _checkpoint_tensors(single_out / "checkpoints" / "ckpt-6")
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        np.testing.assert_allclose(value, theirs[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.slow
def test_workers_log_their_index_and_agree_on_every_evaluation(pair_run) -> None:
    out, workers, codes = pair_run
    assert codes == [0, 0]
    logs = [w.records() for w in workers]
    for index, records in enumerate(logs):
        assert records and all(r.get("worker") == index for r in records), index
        start = events(records, "start")[0]
        assert start["cluster"]["index"] == index
        assert start["cluster"]["workers"] == 2
        assert start["global_batch_size"] == 40
        assert [p["step"] for p in events(records, "progress")] == [3, 6]
        assert events(records, "end")[-1]["status"] == "completed"
    # One global RMSE: the workers' shard statistics are all-reduced.
    rmse = [[p["val_rmse"] for p in events(records, "progress")] for records in logs]
    assert rmse[0] == rmse[1]
    losses = [[p["loss"] for p in events(records, "progress")] for records in logs]
    assert losses[0] == losses[1]
    file_records = json_lines((out / "workers" / "worker-1" / "logs" / "train.jsonl").read_text())
    assert {r["worker"] for r in file_records} == {1}
    chief_file = json_lines((out / "logs" / "train.jsonl").read_text())
    assert {r["worker"] for r in chief_file} == {0}


#: What the chief writes in its output directory (sorted).
CHIEF_FILES = [".lock", "cache", "checkpoints", "logs", "metrics.json", "model", "tensorboard"]


@pytest.mark.slow
def test_only_the_chief_writes_checkpoints_model_and_metrics(pair_run) -> None:
    out, _, codes = pair_run
    assert codes == [0, 0]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final_step"] == 6
    assert metrics["workers"] == 2 and metrics["global_batch_size"] == 40
    assert (out / "model" / "model.keras").is_file()
    best = f"best-{metrics['exported_step']}.index"  # the best validated step, exported
    assert sorted(p.name for p in (out / "checkpoints").glob("*.index")) == sorted(
        [best, "ckpt-3.index", "ckpt-6.index"]
    )
    other = out / "workers" / "worker-1"
    assert sorted(p.name for p in other.iterdir()) == [".lock", "cache", "checkpoints", "logs"]
    # A worker's own (disposable) directory: every save is collective, so it writes too.
    assert sorted(p.name for p in (other / "checkpoints").glob("*.index")) == sorted(
        [best, "ckpt-6.index"]
    )
    assert sorted(p.name for p in out.iterdir()) == [*CHIEF_FILES, "workers"]


@pytest.fixture(scope="module")
def preempted_run(pair_run, tiny_data: Path):
    """The pair resumes, then worker 1 (not the chief) gets SIGTERM."""
    out, _, codes = pair_run
    assert codes == [0, 0]
    workers = _start_pair(tiny_data, out, "--max-steps", "100000", "--checkpoint-every", "1000")
    workers[1].wait_for("progress", step=9)
    workers[1].proc.send_signal(signal.SIGTERM)
    return out, workers, [w.finish() for w in workers]


def _stopped_together(
    workers: list[Worker], codes: list[int], checkpoints: tuple[Path, Path], signalled: int
) -> int:
    """Assert that both workers stopped (exit 143) after the same step S, each with its
    checkpoint of S in ``checkpoints``, and that only worker ``signalled`` got the signal.
    Returns S."""
    assert codes == [143, 143], [w.stderr[-2000:] for w in workers]
    ends = [events(w.records(), "end")[-1] for w in workers]
    assert [e["status"] for e in ends] == ["preempted", "preempted"]
    stopped = ends[0]["final_step"]
    assert ends[1]["final_step"] == stopped
    for w, where in zip(workers, checkpoints, strict=True):
        assert bool(events(w.records(), "signal")) == (w.index == signalled), w.index
        assert events(w.records(), "checkpoint")[-1]["step"] == stopped
        assert (where / f"ckpt-{stopped}.index").is_file()
    assert "rerun to resume" in workers[1 - signalled].stderr
    return int(stopped)


@pytest.mark.slow
def test_sigterm_to_one_worker_stops_both_after_the_same_step_with_a_checkpoint(
    preempted_run,
) -> None:
    out, workers, codes = preempted_run
    checkpoints = (out / "checkpoints", out / "workers" / "worker-1" / "checkpoints")
    stopped = _stopped_together(workers, codes, checkpoints, signalled=1)
    assert stopped > 9
    # Resumed from the first run's last checkpoint, on both workers.
    assert [events(w.records(), "resume")[0]["step"] for w in workers] == [6, 6]


@pytest.mark.slow
def test_rerun_after_preemption_resumes_from_the_saved_step(preempted_run, tiny_data: Path) -> None:
    out, workers, codes = preempted_run
    assert codes == [143, 143]
    stopped = events(workers[0].records(), "end")[-1]["final_step"]
    rerun = _start_pair(tiny_data, out, "--max-steps", str(stopped + 2))
    assert [w.finish() for w in rerun] == [0, 0], [w.stderr[-2000:] for w in rerun]
    for w in rerun:
        records = w.records()
        assert events(records, "resume")[0]["step"] == stopped
        end = events(records, "end")[-1]
        assert (end["status"], end["start_step"], end["final_step"]) == (
            "completed",
            stopped,
            stopped + 2,
        )
    assert json.loads((out / "metrics.json").read_text())["final_step"] == stopped + 2


# --- each worker with its own output directory (one volume per pod: k8s/distributed.yaml) ---

#: Every step evaluated, so the ``progress`` events carry every step's loss; long enough
#: that a SIGTERM after step 2 stops the run well before its end.
OWN_STEPS = 12
#: A constant learning rate: the stopped run (--max-steps FAR_STEPS) and its rerun train
#: with the rates of the uninterrupted one (under cosine the rate depends on --max-steps).
OWN_ARGS = (
    "--max-steps", str(OWN_STEPS), "--eval-every", "1", "--checkpoint-every", "1000",
    "--lr-schedule", "constant",
)  # fmt: skip
#: A step a signalled run can't reach before its signal lands, however slow the machine:
#: the stop is the signal's, never the end of the run.
FAR_STEPS = 100_000


def _own_outputs(base: Path) -> tuple[Path, Path]:
    """Output directories on two "volumes": the chief's and worker 1's."""
    return base / "chief-volume" / "output", base / "worker-volume" / "output"


@pytest.fixture(scope="module")
def own_volumes_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory):
    """The pair trains OWN_STEPS steps, each worker into its own directory, the cluster in
    TF_CONFIG with a chief job (as the manifest gives it)."""
    outs = _own_outputs(tmp_path_factory.mktemp("own"))
    workers = _start_pair(tiny_data, outs, *OWN_ARGS, chief_job=True)
    return outs, workers, [w.finish() for w in workers]


@pytest.mark.slow
def test_workers_with_their_own_output_directories_train(own_volumes_run) -> None:
    (chief_out, worker_out), workers, codes = own_volumes_run
    assert codes == [0, 0], [w.stderr[-2000:] for w in workers]
    clusters = [events(w.records(), "start")[0]["cluster"] for w in workers]
    assert [(c["source"], c["index"], c["chief"]) for c in clusters] == [
        ("TF_CONFIG", 0, True),
        ("TF_CONFIG", 1, False),
    ]
    assert sorted(p.name for p in chief_out.iterdir()) == CHIEF_FILES
    assert json.loads((chief_out / "metrics.json").read_text())["final_step"] == OWN_STEPS
    # Worker 1 wrote its scratch directory on its own volume, and nothing else anywhere.
    assert [p.relative_to(worker_out).as_posix() for p in worker_out.glob("*/*")] == [
        "workers/worker-1"
    ]
    _same_checkpoints(
        chief_out / "checkpoints" / f"ckpt-{OWN_STEPS}",
        worker_out / "workers" / "worker-1" / "checkpoints" / f"ckpt-{OWN_STEPS}",
    )


@pytest.fixture(scope="module")
def own_volumes_preempted(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory):
    """The same on fresh directories, to a step it can't reach; the chief gets SIGTERM
    after its step 2."""
    outs = _own_outputs(tmp_path_factory.mktemp("own-preempted"))
    far = ("--max-steps", str(FAR_STEPS), *OWN_ARGS[2:])
    workers = _start_pair(tiny_data, outs, *far, chief_job=True)
    workers[0].wait_for("progress", step=2)
    workers[0].proc.send_signal(signal.SIGTERM)
    return outs, workers, [w.finish() for w in workers]


@pytest.mark.slow
def test_sigterm_to_the_chief_stops_both_with_a_checkpoint_on_each_volume(
    own_volumes_preempted,
) -> None:
    (chief_out, worker_out), workers, codes = own_volumes_preempted
    checkpoints = (chief_out / "checkpoints", worker_out / "workers" / "worker-1" / "checkpoints")
    stopped = _stopped_together(workers, codes, checkpoints, signalled=0)
    assert 2 <= stopped < FAR_STEPS


@pytest.fixture(scope="module")
def own_volumes_resumed(own_volumes_preempted, tiny_data: Path):
    """Both rerun; worker 1's volume is new and empty, as a replaced pod's emptyDir."""
    outs, first, codes = own_volumes_preempted
    assert codes == [143, 143]
    stopped = events(first[0].records(), "end")[-1]["final_step"]
    if stopped >= OWN_STEPS:  # an event, not a speed: then there is nothing to resume
        pytest.skip(f"the signal landed after step {stopped}: nothing left before {OWN_STEPS}")
    shutil.rmtree(outs[1])
    workers = _start_pair(tiny_data, outs, *OWN_ARGS, chief_job=True)
    return outs, first, workers, [w.finish() for w in workers]


@pytest.mark.slow
def test_rerun_resumes_both_from_the_chiefs_checkpoint_with_an_empty_worker_volume(
    own_volumes_resumed,
) -> None:
    (chief_out, worker_out), first, workers, codes = own_volumes_resumed
    assert codes == [0, 0], [w.stderr[-2000:] for w in workers]
    stopped = events(first[0].records(), "end")[-1]["final_step"]
    (chief, *more), (other, *others) = (events(w.records(), "resume") for w in workers)
    assert (chief["step"], other["step"], more, others) == (stopped, stopped, [], [])
    # The chief read its checkpoint; worker 1 read nothing and got the state by broadcast.
    assert chief["path"] == str(chief_out / "checkpoints" / f"ckpt-{stopped}")
    assert isinstance(chief["read_s"], float) and isinstance(chief["broadcast_s"], float)
    assert (other["path"], other["read_s"]) == (None, None)
    assert isinstance(other["broadcast_s"], float)
    for w in workers:
        end = events(w.records(), "end")[-1]
        assert (end["status"], end["start_step"], end["final_step"]) == (
            "completed",
            stopped,
            OWN_STEPS,
        )
    scratch = worker_out / "workers" / "worker-1" / "checkpoints"
    assert (scratch / f"ckpt-{OWN_STEPS}.index").is_file()


@pytest.mark.slow
def test_a_resumed_run_has_the_losses_and_weights_of_an_uninterrupted_one_bit_for_bit(
    own_volumes_run, own_volumes_resumed
) -> None:
    (reference_out, _), reference, codes = own_volumes_run
    assert codes == [0, 0]
    (resumed_out, _), first, resumed, codes = own_volumes_resumed
    assert codes == [0, 0]

    def steps(worker: Worker) -> list[tuple]:
        return [
            (p["step"], p["loss"], p["train_rmse"], p["val_rmse"], p["lr"])
            for p in events(worker.records(), "progress")
        ]

    for index in range(2):
        uninterrupted = steps(reference[index])
        assert [s[0] for s in uninterrupted] == list(range(1, OWN_STEPS + 1))
        # JSON floats round-trip exactly: equal values are equal bits.
        assert steps(first[index]) + steps(resumed[index]) == uninterrupted, index
    _same_checkpoints(
        reference_out / "checkpoints" / f"ckpt-{OWN_STEPS}",
        resumed_out / "checkpoints" / f"ckpt-{OWN_STEPS}",
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("differs", "field", "values"),
    [
        ("data", "training data, test data", (TINY["train"], TINY["train"] - 40)),
        ("max_steps", "max_steps", (6, 7)),
    ],
)
def test_workers_that_disagree_stop_with_exit_6_naming_what_differs(
    differs: str, field: str, values: tuple[int, int], tiny_data: Path, tmp_path: Path
) -> None:
    data: Path | tuple[Path, Path] = tiny_data
    other: tuple[str, ...] = ()
    if differs == "data":  # worker 1 is given another data set
        other_data = tmp_path / "other-data"
        synthetic.generate(other_data, train=values[1], test=TINY["test"], seed=2)
        data = (tiny_data, other_data)
    else:
        other = ("--max-steps", str(values[1]))
    outs = _own_outputs(tmp_path)
    workers = _start_pair(data, outs, "--max-steps", str(values[0]), chief_job=True, other=other)
    codes = [w.finish() for w in workers]
    assert codes == [6, 6], [w.stderr[-2000:] for w in workers]
    for w, value in zip(workers, values, strict=True):
        # Only the differing parts (the run's identity: app/training/state/identity.py), or the
        # differing field with this worker's value; a disagreement, not a lost peer.
        expected = (
            f"worker {w.index}: the workers disagree on the run's identity ({field} not the "
            "chief's on 1 worker(s); give every worker the same data and options)"
            if differs == "data"
            else f"worker {w.index}: the workers disagree on the data set and training options "
            f"({field}={value} here; give every worker the same data and options)"
        )
        assert expected in w.stderr
        assert "stopped responding" not in w.stderr
        end = events(w.records(), "end")[-1]
        assert (end["status"], end["exit_code"]) == ("failed", 6)
    assert not (outs[0] / "checkpoints").exists()


@pytest.mark.slow
def test_a_killed_worker_makes_the_other_exit_6_within_the_heartbeat_timeout(
    tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "output"
    workers = _start_pair(
        tiny_data,
        out,
        "--max-steps",
        "100000",
        "--checkpoint-every",
        "1000",
        "--heartbeat-timeout",
        str(HEARTBEAT),
    )
    workers[0].wait_for("progress", step=3)
    workers[1].proc.kill()
    assert workers[1].finish() == -signal.SIGKILL
    # Documented bound: the heartbeat timeout plus the end of a step; 120 s only stops a hang.
    code = workers[0].finish(timeout=HEARTBEAT + 120)
    assert code == 6, workers[0].stderr[-3000:]
    assert "worker 1" in workers[0].stderr and "rerun" in workers[0].stderr
    end = events(workers[0].records(), "end")[-1]
    assert end["status"] == "failed" and end["exit_code"] == 6


@pytest.mark.slow
def test_a_worker_whose_peer_never_starts_gives_up_after_the_cluster_timeout(
    tiny_data: Path, tmp_path: Path
) -> None:
    out = tmp_path / "output"
    ports = free_ports(2)
    hosts = ",".join(f"localhost:{p}" for p in ports)
    chief = Worker(0, hosts, tiny_data, out, "--max-steps", "3", "--cluster-timeout", "5")
    chief.wait_for("cluster_wait")
    code = chief.finish(timeout=5 + 120)
    assert code == 6, chief.stderr[-3000:]
    assert "did not all start within 5 s" in chief.stderr
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())
