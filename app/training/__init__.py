"""The training job: one run from its inputs to the exported model (app/training/run.py)."""
