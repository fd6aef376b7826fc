"""The run's state on disk: who writes where (workspace.py), the checkpoints and the best
validated step beside them, the run's identity and its measured choice, kept for a resume,
and the rerun of a finished run (docs/architecture.md, "Output layout")."""
