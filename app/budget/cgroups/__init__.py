"""Read-only detection of the CPU budget a process was given: CFS quota, cpuset, memory limit.

Works on cgroup v1, v2 and hybrid layouts, inside or outside containers, with or without a
cgroup namespace. Every file is read under a ``root`` directory (default ``/``) so tests can
point it at fake ``/proc`` + ``/sys`` trees; nothing here imports TensorFlow or changes the
process (the apply step in ``app.budget.apply`` does that). docs/cpu-budget.md lists every
rule and fallback.

Modules, each importing only the ones before it:

- :mod:`~app.budget.cgroups.proc_cgroup`: the process's cgroup paths (``/proc/self/cgroup``).
- :mod:`~app.budget.cgroups.hierarchy`: a controller's mount and chain of cgroup directories.
- :mod:`~app.budget.cgroups.usual_mounts`: the usual mount points, without mountinfo.
- :mod:`~app.budget.cgroups.locate`: which hierarchy holds a controller's files.
- :mod:`~app.budget.cgroups.limits`: CFS quota, memory limit and cpuset along the chain.
- :mod:`~app.budget.cgroups.hints`: the ``CPU_LIMIT``/``CPU_REQUEST`` environment hints.
- :mod:`~app.budget.cgroups.affinity`: affinity and online CPUs, the CPU set's intersection.
- :mod:`~app.budget.cgroups.detect`: :func:`~app.budget.cgroups.detect.detect_budget`, the
  :class:`~app.budget.cgroups.detect.CpuBudget` it returns.
"""
