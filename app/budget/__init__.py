"""The CPU budget: detect (cgroups, topology, CPU model) → plan (pure) → apply (the process).

Nothing here imports TensorFlow except :func:`app.budget.apply.import_tensorflow`, and only
:mod:`app.budget.apply` changes the process (docs/architecture.md).
"""
