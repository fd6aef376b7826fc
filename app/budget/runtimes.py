"""Each runtime's own thread variables, from the thread plan: what ``coretrain exec`` sets.

TensorFlow, OpenMP, the BLAS libraries, numexpr, Go and the JVM each size their pools from
the CPUs they can see (affinity) unless a variable of their own says otherwise; none reads
the CFS quota of every ancestor and the cpuset together (docs/cpu-budget.md, "Layouts
compared"). :data:`RUNTIME_VARIABLES` is the table of those variables, which runtime reads
each and the documentation that says so; docs/cpu-budget.md prints the same table
("Other programs: `coretrain exec`") and a test keeps the two equal. :func:`runtime_env` is
pure: plan + the environment as it is → the variables to set, the ones the user had set
(kept), and one reason per decision. JAX/XLA has no stable variable for its CPU thread
count (jax-ml/jax#1539): only the affinity (``--pin``) reaches it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from app.budget.plan import INTER_ENV, INTRA_ENV, ONEDNN_ENV, ThreadPlan

#: The JVM option that overrides its CPU count (HotSpot, ``java`` man page).
JVM_CPU_OPTION = "-XX:ActiveProcessorCount"
JAVA_TOOL_OPTIONS = "JAVA_TOOL_OPTIONS"


@dataclass(frozen=True)
class RuntimeVariable:
    """One row of the table: a variable, the runtimes that read it, the documentation that
    says so, and which planned number it gets (``value``: plan → text, None = not set).
    ``setting``: the plan's own explicit setting this variable is (TensorFlow's variables,
    which the plan already reads: app/budget/plan.py ``overrides_from``), else None."""

    name: str
    runtimes: str
    source: str
    value: Callable[[ThreadPlan], str | None]
    setting: str | None = None


def _intra(plan: ThreadPlan) -> str:
    return str(plan.intra_op_threads)


def _inter(plan: ThreadPlan) -> str:
    return str(plan.inter_op_threads)


def _onednn(plan: ThreadPlan) -> str | None:
    return None if plan.onednn is None else str(int(plan.onednn))


def _jvm(plan: ThreadPlan) -> str:
    return f"{JVM_CPU_OPTION}={plan.intra_op_threads}"


#: Every variable ``coretrain exec`` sets, in the order of docs/cpu-budget.md's table. The
#: thread count of every pool but TensorFlow's inter-op pool is the plan's intra-op count:
#: the CPU budget rounded by ``--rounding`` (one busy thread per CPU of the budget).
RUNTIME_VARIABLES: tuple[RuntimeVariable, ...] = (
    RuntimeVariable(
        INTRA_ENV,
        "TensorFlow",
        "tensorflow/core/common_runtime/process_util.cc (`NumIntraOpThreadsFromEnvironment`)",
        _intra,
        "intra_op_threads",
    ),
    RuntimeVariable(
        INTER_ENV,
        "TensorFlow",
        "tensorflow/core/common_runtime/process_util.cc (`NumInterOpThreadsFromEnvironment`)",
        _inter,
        "inter_op_threads",
    ),
    RuntimeVariable(
        ONEDNN_ENV,
        "TensorFlow (x86 and Arm wheels)",
        "tensorflow/core/util/port.cc (`IsMklEnabled`, `DefaultOneDnnPolicy`)",
        _onednn,
        "onednn",
    ),
    RuntimeVariable(
        "OMP_NUM_THREADS",
        "OpenMP runtimes (libgomp, LLVM/Intel libomp), PyTorch's intra-op pool, "
        "OpenBLAS (fallback)",
        'OpenMP API specification, "Environment Variables"; PyTorch docs, "CPU threading '
        'and TorchScript inference"; OpenBLAS README, "Setting the number of threads using '
        'environment variables"',
        _intra,
    ),
    RuntimeVariable(
        "MKL_NUM_THREADS",
        "Intel oneMKL (numpy/scipy MKL builds), PyTorch's MKL calls",
        'oneMKL Developer Guide, "Techniques to Set the Number of Threads"; PyTorch docs, '
        '"CPU threading and TorchScript inference"',
        _intra,
    ),
    RuntimeVariable(
        "OPENBLAS_NUM_THREADS",
        "OpenBLAS (numpy's and scipy's wheels)",
        'OpenBLAS README, "Setting the number of threads using environment variables"',
        _intra,
    ),
    RuntimeVariable(
        "BLIS_NUM_THREADS",
        "BLIS",
        "BLIS docs/Multithreading.md",
        _intra,
    ),
    RuntimeVariable(
        "NUMEXPR_NUM_THREADS",
        "numexpr (pandas' eval)",
        'numexpr doc/user_guide.rst, "Threadpool Configuration"',
        _intra,
    ),
    RuntimeVariable(
        "NUMEXPR_MAX_THREADS",
        "numexpr (the pool's size cap)",
        'numexpr doc/user_guide.rst, "Threadpool Configuration"',
        _intra,
    ),
    RuntimeVariable(
        "VECLIB_MAXIMUM_THREADS",
        "Apple Accelerate/vecLib (macOS only; no effect on Linux)",
        "vecLib man page (`VECLIB_MAXIMUM_THREADS`); threadpoolctl's list of BLAS variables",
        _intra,
    ),
    RuntimeVariable(
        "GOMAXPROCS",
        "Go runtime",
        'Go `runtime` package documentation, "Environment Variables"',
        _intra,
    ),
    RuntimeVariable(
        JAVA_TOOL_OPTIONS,
        f"JVM (HotSpot): `{JVM_CPU_OPTION}=N` appended",
        "JVM TI specification (`JAVA_TOOL_OPTIONS`); `java` man page, "
        f'"Advanced Runtime Options" (`{JVM_CPU_OPTION}`)',
        _jvm,
    ),
)


@dataclass(frozen=True)
class RuntimeEnv:
    """What :func:`runtime_env` decided: ``set`` the variables to add (name → value),
    ``kept`` the user's own values left as they are, ``reasons`` one line per variable."""

    set: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    reasons: tuple[str, ...] = ()

    def environ(self, environ: Mapping[str, str]) -> dict[str, str]:
        """``environ`` with :attr:`set` added (the program's environment)."""
        return {**environ, **self.set}


def _java_options(user: str, option: str) -> tuple[str | None, str]:
    """(new ``JAVA_TOOL_OPTIONS`` or None to keep the user's, reason): the planned CPU
    count appended unless the user's options already hold a ``-XX:ActiveProcessorCount=``
    option (a word of its own, not a part of another option's value)."""
    if any(word.startswith(f"{JVM_CPU_OPTION}=") for word in user.split()):
        return None, f"{JAVA_TOOL_OPTIONS} kept: the user's value sets {JVM_CPU_OPTION}"
    if user.strip():
        return f"{user} {option}", f"{JAVA_TOOL_OPTIONS}: {option} appended to the user's value"
    return option, f"{JAVA_TOOL_OPTIONS}={option}"


def _decide(var: RuntimeVariable, plan: ThreadPlan, user: str) -> tuple[str | None, str]:
    """(value to set or None to keep the user's, reason) for one variable of the table."""
    value = var.value(plan)
    if value is None:
        return None, f"{var.name} not set: the plan leaves it to {var.runtimes}"
    if var.name == JAVA_TOOL_OPTIONS:
        return _java_options(user, value)
    if var.setting is not None:  # TensorFlow's own: the plan has read it already
        source = plan.overrides.sources.get(var.setting, "")
        if user.strip() and source.startswith(var.name):
            return None, f"{var.name}={user} kept (set by the user; the plan took it)"
        if user.strip():
            return value, f"{var.name}={value}: {source or 'the plan'} wins over the user's {user}"
        return value, f"{var.name}={value} for {var.runtimes}"
    if user.strip():
        return None, f"{var.name}={user} kept (set by the user; planned {value})"
    return value, f"{var.name}={value} for {var.runtimes}"


def runtime_env(plan: ThreadPlan, environ: Mapping[str, str]) -> RuntimeEnv:
    """The runtimes' thread variables for ``plan`` (:data:`RUNTIME_VARIABLES`).

    A variable already in ``environ`` (set and not empty) is the user's and is kept, named
    in ``kept``. TensorFlow's own variables are explicit settings the plan has read already
    (app/budget/plan.py): kept when the plan took them, replaced when a flag won over them
    (``--intra-op-threads``), as in ``coretrain train``. ``JAVA_TOOL_OPTIONS`` is a list of
    options: the CPU count is appended to it unless it names one. Pure; raises nothing.
    """
    to_set: dict[str, str] = {}
    kept: dict[str, str] = {}
    reasons: list[str] = []
    for var in RUNTIME_VARIABLES:
        user = environ.get(var.name, "")
        value, why = _decide(var, plan, user)
        if value is not None:
            to_set[var.name] = value
        elif user.strip():
            kept[var.name] = user
        reasons.append(why)
    return RuntimeEnv(set=to_set, kept=kept, reasons=tuple(reasons))
