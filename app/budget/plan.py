"""The thread plan: a pure function from a detected CPU budget to TensorFlow's sizes.

``make_plan`` never reads files and never changes the process; it returns the
numbers *and* one reason per decision (as uber-go/automaxprocs reports
"quota used / undefined / minimum used"). :mod:`app.budget.apply` applies the plan.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from app.budget.cpulist import format_cpulist
from app.errors import ConfigError
from app.options import check_bounds, option

if TYPE_CHECKING:
    from app.budget.cgroups.detect import CpuBudget
    from app.budget.topology import CpuModel, Topology

ROUNDING_RULES = ("ceil", "floor", "tf-default")
PIN_MODES = ("auto", "none", "cores", "physical", "numa")
# Share of the memory limit that tf.data's autotuner may use for buffers.
TFDATA_RAM_SHARE = 0.25
DEFAULT_ROUNDING = "ceil"


@dataclass(frozen=True)
class PlanOptions:
    """The command-line settings that shape the thread plan (``plan`` and ``train``)."""

    cpus: float | None = option(
        None,
        "CPU budget in CPUs (may be fractional), instead of detecting it from cgroups.",
        above=0,
        shown_default="detected",
        metavar="CPUS",
    )
    intra_op_threads: int | None = option(
        None,
        "TensorFlow intra-op threads (TF_NUM_INTRAOP_THREADS also sets it).",
        minimum=1,
        shown_default="from the CPU budget",
    )
    inter_op_threads: int | None = option(
        None,
        "TensorFlow inter-op threads (TF_NUM_INTEROP_THREADS also sets it).",
        minimum=1,
        shown_default="from the CPU budget",
    )
    pin: str = option(
        "auto",
        "CPU affinity: auto (no pinning; see docs/cpu-budget.md), none, cores (first N "
        "allowed CPUs), physical (one CPU per physical core), numa.",
        choices=PIN_MODES,
    )
    rounding: str = option(
        DEFAULT_ROUNDING,
        "How a fractional CPU budget becomes a thread count.",
        choices=ROUNDING_RULES,
    )

    def __post_init__(self) -> None:
        check_bounds(self)


@dataclass(frozen=True)
class Overrides:
    """Explicit user settings; each one wins over detection.

    ``cpus``: CPUs (may be fractional); ``intra_op_threads`` / ``inter_op_threads``:
    threads (from flags or ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS``).
    """

    cpus: float | None = None
    intra_op_threads: int | None = None
    inter_op_threads: int | None = None
    pin: str = "auto"
    rounding: str = DEFAULT_ROUNDING
    onednn: bool | None = None  # TF_ENABLE_ONEDNN_OPTS as the user set it
    bfloat16: bool = False  # the run may compute in bfloat16 (--precision bfloat16)
    sources: Mapping[str, str] = field(default_factory=dict)  # override name → where it came from


#: /proc/cpuinfo flags of native bfloat16 dot products (x86 AVX512_BF16, AMX; Arm BF16).
BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")

#: Environment variables that count as explicit settings (TensorFlow reads them itself).
INTRA_ENV, INTER_ENV, ONEDNN_ENV = (
    "TF_NUM_INTRAOP_THREADS",
    "TF_NUM_INTEROP_THREADS",
    "TF_ENABLE_ONEDNN_OPTS",
)


def _thread_env(environ: Mapping[str, str], name: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r}: not a whole number of threads") from None
    if value < 1:
        raise ConfigError(f"{name}={raw!r}: must be at least 1")
    return value


def _bool_env(environ: Mapping[str, str], name: str) -> bool | None:
    """TensorFlow's reading of a boolean variable: 0/1/true/false, any case (env_var.cc)."""
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    value = raw.strip().lower()
    if value in ("1", "true"):
        return True
    if value in ("0", "false"):
        return False
    raise ConfigError(f"{name}={raw!r}: must be 0, 1, true or false")


def _thread_setting(
    flag_value: int | None, flag: str, environ: Mapping[str, str], name: str
) -> tuple[int | None, str | None]:
    """A thread count and where it came from: the flag when given, else TensorFlow's
    variable ``name`` (``(None, None)``: neither). Raises ConfigError for a bad variable."""
    if flag_value is not None:
        return flag_value, flag
    value = _thread_env(environ, name)
    return value, None if value is None else f"{name} env"


def overrides_from(
    environ: Mapping[str, str], options: PlanOptions | None = None, bfloat16: bool = False
) -> Overrides:
    """The explicit settings: command-line values first, then TensorFlow's own variables.

    ``TF_NUM_INTRAOP_THREADS`` / ``TF_NUM_INTEROP_THREADS`` count only where the
    matching flag is not given; ``TF_ENABLE_ONEDNN_OPTS`` is read as TensorFlow reads
    it. Raises ConfigError for a value TensorFlow would not accept.
    """
    opts = options or PlanOptions()
    intra, intra_source = _thread_setting(
        opts.intra_op_threads, "--intra-op-threads/CORETRAIN_INTRA_OP_THREADS", environ, INTRA_ENV
    )
    inter, inter_source = _thread_setting(
        opts.inter_op_threads, "--inter-op-threads/CORETRAIN_INTER_OP_THREADS", environ, INTER_ENV
    )
    onednn = _bool_env(environ, ONEDNN_ENV)
    found = {
        "cpus": None if opts.cpus is None else "--cpus/CORETRAIN_CPUS",
        "intra_op_threads": intra_source,
        "inter_op_threads": inter_source,
        "onednn": None if onednn is None else f"{ONEDNN_ENV}={environ[ONEDNN_ENV].strip()} env",
    }
    return Overrides(
        cpus=opts.cpus,
        intra_op_threads=intra,
        inter_op_threads=inter,
        pin=opts.pin,
        rounding=opts.rounding,
        onednn=onednn,
        bfloat16=bfloat16,
        sources={name: source for name, source in found.items() if source is not None},
    )


@dataclass(frozen=True)
class ThreadPlan:
    """What TensorFlow will be told, and why.

    ``cpu_quota`` and ``cpu_budget`` in CPUs (``cpu_quota`` None = unlimited);
    ``cpuset`` the allowed CPU ids; thread counts in threads; ``pin_cpus`` the
    affinity to set (None = leave it); ``memory_limit`` and ``tfdata_ram_budget``
    in bytes (None = unlimited / tf.data's default); ``onednn`` the value of
    ``TF_ENABLE_ONEDNN_OPTS`` to set (None = leave it to TensorFlow); ``cpu_model``
    the CPU's model name; ``budget_source`` what set ``cpu_budget``; ``cpu_request`` the
    ``CPU_REQUEST`` hint in CPUs (reported, never sizing: the reasons say why).
    """

    cpu_quota: float | None
    cpuset: tuple[int, ...]
    cpu_budget: float
    intra_op_threads: int
    inter_op_threads: int
    tfdata_threads: int
    pin_cpus: tuple[int, ...] | None
    memory_limit: int | None
    tfdata_ram_budget: int | None
    rounding: str
    reasons: tuple[str, ...]
    inputs: Mapping[str, str]
    onednn: bool | None = None
    cpu_model: str = "unknown"
    budget_source: str = "cpuset"  # what set cpu_budget: "--cpus", "cpu quota (…)", "cpuset"
    cpu_request: float | None = None  # the CPU_REQUEST hint, reported only (see reasons)
    cpu_stat: str | None = None  # cpu.stat of the limiting cgroup (app.budget.usage)
    native_bf16: bool = False  # the CPU has bfloat16 dot products (BF16_FLAGS)
    overrides: Overrides = field(default_factory=lambda: Overrides())  # what the user set

    def threads(self) -> tuple[int, int, tuple[int, ...] | None]:
        """What TensorFlow's runtime is sized by: intra-op, inter-op threads, affinity."""
        return (self.intra_op_threads, self.inter_op_threads, self.pin_cpus)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict (lists for tuples); the contract of ``coretrain plan``."""
        out = asdict(self)
        out["cpuset"] = list(self.cpuset)
        out["pin_cpus"] = None if self.pin_cpus is None else list(self.pin_cpus)
        out["reasons"] = list(self.reasons)
        out["inputs"] = dict(self.inputs)
        out["overrides"] = {
            k: v for k, v in asdict(self.overrides).items() if v is not None and k != "sources"
        }
        out["overrides"]["sources"] = dict(self.overrides.sources)
        return out

    def brief(self) -> dict[str, Any]:
        """:meth:`to_json` without what the plan was decided from (the files read,
        ``inputs``, and the ``reasons``), CPU lists in the kernel's form (``"0-63"``): the
        ``start`` event's ``plan``, one log line at any CPU count; the whole plan goes to the
        output directory's ``logs/plan.json`` (docs/architecture.md, "Logs")."""
        out = self.to_json()
        del out["inputs"], out["reasons"]
        out["cpuset"] = format_cpulist(self.cpuset)
        out["pin_cpus"] = None if self.pin_cpus is None else format_cpulist(self.pin_cpus)
        return out


def _request_note(cpu_request: float | None) -> str:
    """Why a CPU request without a quota does not size the pools (None: no request)."""
    if cpu_request is None:
        return ""
    return (
        f"; the CPU request {cpu_request:g} is a weight under contention (cpu.shares), not a "
        "cap: the pools use every CPU of the cpuset, which measured as fast or faster with "
        'a busy neighbour and faster on an idle node (docs/cpu-budget.md, "Requests '
        'without limits")'
    )


def inter_op_threads_for(cpu_budget: float) -> int:
    """Inter-op threads for a budget of ``cpu_budget`` CPUs: 1 under 2 CPUs, else 2 (two
    ops at a time fill the intra-op pool where the backward pass branches; measured in
    docs/cpu-budget.md)."""
    return 1 if cpu_budget < 2 else 2


def round_threads(budget: float, rule: str, visible_cpus: int) -> int:
    """Threads for a CPU budget: ``ceil`` / ``floor`` of the budget, or ``tf-default``.

    ``tf-default`` is what TensorFlow does by itself: the number of CPUs in the
    affinity mask, ignoring any CFS quota (tensorflow/tensorflow#17206).
    Result is clamped to [1, visible_cpus]. Raises ConfigError for an unknown rule.
    """
    if rule == "ceil":
        threads = math.ceil(budget - 1e-9)
    elif rule == "floor":
        threads = math.floor(budget + 1e-9)
    elif rule == "tf-default":
        threads = visible_cpus
    else:
        raise ConfigError(f"unknown rounding rule {rule!r}; choose one of {ROUNDING_RULES}")
    return max(1, min(threads, max(1, visible_cpus)))


def _pin(mode: str, threads: int, cpuset: Sequence[int], topo: Topology | None) -> tuple:
    """(pin_cpus or None, reason) for a pin mode; pins only inside ``cpuset``."""
    allowed = list(cpuset)
    if mode in ("auto", "none"):
        why = (
            "pin: none (auto: other containers on a shared node would pick the same CPUs; "
            "the kernel's cpuset already bounds us)"
            if mode == "auto"
            else "pin: none (--pin none)"
        )
        return None, why
    if mode == "cores":
        chosen = allowed[:threads]
        return tuple(chosen), f"pin: {chosen} (--pin cores: first {threads} allowed CPUs)"
    cores = [c for c in (topo.cores if topo else ()) if any(x in allowed for x in c)]
    if mode == "physical":
        firsts = [min(x for x in core if x in allowed) for core in cores] or allowed
        chosen = sorted(firsts)[:threads]
        return tuple(chosen), f"pin: {chosen} (--pin physical: one logical CPU per core)"
    if mode == "numa":
        nodes = [[x for x in n if x in allowed] for n in (topo.numa_nodes if topo else ())]
        nodes = [n for n in nodes if n] or [allowed]
        best = max(nodes, key=len)
        chosen = best if len(best) >= threads else allowed
        return tuple(sorted(chosen)), f"pin: {sorted(chosen)} (--pin numa: largest allowed node)"
    raise ConfigError(f"unknown pin mode {mode!r}; choose one of {PIN_MODES}")


def _onednn(cpu: CpuModel | None, ov: Overrides) -> tuple[bool | None, str]:
    """(TF_ENABLE_ONEDNN_OPTS to set, reason): the user's value, else TensorFlow's own rule."""
    if ov.onednn is not None:
        state = "on" if ov.onednn else "off"
        return ov.onednn, f"oneDNN {state} from {ov.sources.get('onednn', ONEDNN_ENV)} (explicit)"
    if cpu is None or not cpu.readable:
        return None, (
            "warning: oneDNN left to TensorFlow (/proc/cpuinfo unreadable: its flags decide "
            "whether TensorFlow turns oneDNN on)"
        )
    native = [f for f in BF16_FLAGS if f in cpu.flags]
    if ov.bfloat16 and native:
        return True, (
            f"oneDNN on ({ONEDNN_ENV}=1): the run may compute in bfloat16 (--precision "
            f"bfloat16, or auto where it is the faster), which only oneDNN's kernels do "
            f"natively; the CPU has {', '.join(native)} "
            f"(/proc/cpuinfo: {cpu.name})"
        )
    on, evidence = cpu.onednn_default()
    return on, (
        f"oneDNN {'on' if on else 'off'} ({ONEDNN_ENV}={int(on)}): TensorFlow's default on "
        f"Linux, {evidence} (/proc/cpuinfo: {cpu.name})"
    )


def _cpu_budget(budget: CpuBudget, ov: Overrides) -> tuple[float, str, str]:
    """(CPUs, what set them, reason): ``--cpus`` if given, else ``min(CFS quota, |cpuset|)``,
    or ``|cpuset|`` without a quota. Raises ConfigError for ``--cpus`` <= 0."""
    visible = len(budget.cpuset)
    if ov.cpus is not None:
        if not ov.cpus > 0:
            raise ConfigError(f"--cpus must be > 0, got {ov.cpus}")
        cpus, source = float(ov.cpus), ov.sources.get("cpus", "--cpus")
        return cpus, source, f"cpu budget {cpus:g} from {source} (detected {budget.cpu_budget:g})"
    cpus = float(budget.cpu_budget)
    if budget.cpu_quota is None:
        why = f"cpu budget {cpus:g}: no CPU quota, {visible} CPUs in cpuset"
        return cpus, "cpuset", why + _request_note(budget.cpu_request)
    why = f"cpu budget {cpus:g} = min(quota {budget.cpu_quota:g}, cpuset {visible})"
    if visible < budget.cpu_quota:  # the cpuset binds, not the quota
        return cpus, "cpuset", why
    return cpus, f"cpu quota ({budget.quota_source})", why


def _explicit_threads(ov: Overrides, name: str, flag: str) -> tuple[int, str] | None:
    """(threads, reason) of the thread count ``name`` the user set; None when unset."""
    threads = getattr(ov, name)
    if threads is None:
        return None
    what = name.replace("_op_threads", "-op threads")  # intra_op_threads: "intra-op threads"
    return threads, f"{what} {threads} from {ov.sources.get(name, flag)} (explicit setting wins)"


def _intra_op_threads(cpu_budget: float, visible: int, ov: Overrides) -> tuple[int, str]:
    """(threads, reason): the explicit setting, else the budget rounded by ``ov.rounding``."""
    explicit = _explicit_threads(ov, "intra_op_threads", "--intra-op-threads")
    if explicit is not None:
        return explicit
    intra = round_threads(cpu_budget, ov.rounding, visible)
    return intra, f"intra-op threads {intra} = {ov.rounding}(budget {cpu_budget:g})"


def _inter_op_threads(cpu_budget: float, ov: Overrides) -> tuple[int, str]:
    """(threads, reason): the explicit setting, else :func:`inter_op_threads_for` the budget."""
    explicit = _explicit_threads(ov, "inter_op_threads", "--inter-op-threads")
    if explicit is not None:
        return explicit
    inter = inter_op_threads_for(cpu_budget)
    why = (
        "under 2 CPUs one op at a time"
        if inter == 1
        else "two ops at a time fill the intra-op pool where the backward pass branches "
        "(docs/cpu-budget.md)"
    )
    return inter, f"inter-op threads {inter} (budget {cpu_budget:g}: {why})"


def _tfdata_ram_budget(memory_limit: int | None) -> tuple[int | None, list[str]]:
    """(bytes, reasons): :data:`TFDATA_RAM_SHARE` of the memory limit; None without one."""
    if memory_limit is None:
        return None, []
    ram = int(memory_limit * TFDATA_RAM_SHARE)
    return ram, [f"tf.data RAM budget {ram} bytes = 25% of memory limit"]


def _inputs(budget: CpuBudget, topology: Topology | None, cpu: CpuModel | None) -> dict[str, str]:
    """Every input read: the budget's, then the topology's and the CPU model's."""
    inputs = dict(budget.inputs)
    if topology is not None:
        inputs.update(topology.inputs)
    if cpu is not None:
        inputs.update(cpu.inputs)
    return inputs


def make_plan(
    budget: CpuBudget,
    topology: Topology | None = None,
    overrides: Overrides | None = None,
    cpu: CpuModel | None = None,
) -> ThreadPlan:
    """Decide intra-op, inter-op and tf.data threads, affinity and tf.data RAM budget.

    Rules: the CPU budget is ``--cpus`` if given, else ``min(CFS quota, |cpuset|)``;
    intra-op threads = the budget rounded by ``overrides.rounding`` (docs/cpu-budget.md
    has the measurement behind the default); inter-op threads = 1 under 2 CPUs, else
    2 (the backward pass has independent branches that fill idle intra-op threads;
    more would only queue: the CNN is mostly a chain of ops);
    tf.data private threads = intra-op threads; tf.data RAM budget = 25 % of the
    memory limit; oneDNN on where TensorFlow would turn it on by itself for ``cpu``
    (set explicitly, so the run says which it was). Explicit settings win over all
    of this. Raises ConfigError for bad overrides.
    """
    ov = overrides or Overrides()
    cpuset = tuple(budget.cpuset)
    cpu_budget, source, budget_why = _cpu_budget(budget, ov)
    intra, intra_why = _intra_op_threads(cpu_budget, len(cpuset), ov)
    inter, inter_why = _inter_op_threads(cpu_budget, ov)
    if intra < 1 or inter < 1:
        raise ConfigError("thread counts must be at least 1")
    tfdata = max(1, intra)
    tfdata_why = f"tf.data threads {tfdata} = intra-op threads (private threadpool, autotune)"
    pin_cpus, pin_why = _pin(ov.pin, intra, cpuset, topology)
    ram, ram_why = _tfdata_ram_budget(budget.memory_limit)
    onednn, onednn_why = _onednn(cpu, ov)
    steps = (budget_why, intra_why, inter_why, tfdata_why, pin_why, *ram_why, onednn_why)
    return ThreadPlan(
        cpu_quota=budget.cpu_quota,
        cpuset=cpuset,
        cpu_budget=cpu_budget,
        intra_op_threads=intra,
        inter_op_threads=inter,
        tfdata_threads=tfdata,
        pin_cpus=pin_cpus,
        memory_limit=budget.memory_limit,
        tfdata_ram_budget=ram,
        rounding=ov.rounding,
        reasons=(*budget.reasons, *steps),
        inputs=_inputs(budget, topology, cpu),
        onednn=onednn,
        cpu_model=cpu.name if cpu is not None else "unknown",
        budget_source=source,
        cpu_request=budget.cpu_request,
        cpu_stat=budget.cpu_stat,
        native_bf16=cpu is not None and any(f in cpu.flags for f in BF16_FLAGS),
        overrides=ov,
    )


def format_text(plan: ThreadPlan) -> str:
    """Human-readable plan: one line per number, then the reasons and inputs read."""
    lines = [
        f"cpu_quota         {plan.cpu_quota if plan.cpu_quota is not None else 'unlimited'}",
        f"cpuset            {list(plan.cpuset)}",
        f"cpu_budget        {plan.cpu_budget:g}",
        f"budget_source     {plan.budget_source}",
        f"cpu_request       {f'{plan.cpu_request:g}' if plan.cpu_request is not None else 'none'}",
        f"intra_op_threads  {plan.intra_op_threads}",
        f"inter_op_threads  {plan.inter_op_threads}",
        f"tfdata_threads    {plan.tfdata_threads}",
        f"pin_cpus          {list(plan.pin_cpus) if plan.pin_cpus is not None else 'none'}",
        f"memory_limit      {plan.memory_limit if plan.memory_limit is not None else 'unlimited'}",
        f"onednn            {_onoff(plan.onednn)}",
        f"cpu_model         {plan.cpu_model}",
        "reasons:",
        *(f"  - {r}" for r in plan.reasons),
        "inputs read:",
        *(f"  {k} = {v}" for k, v in plan.inputs.items()),
    ]
    return "\n".join(lines)


def _onoff(value: bool | None) -> str:
    return "TensorFlow's choice" if value is None else ("on" if value else "off")
