"""The extras the loop runs at its boundaries, one per module, each a hook
(app/training/loop/hooks.py): the TensorBoard summaries, the budget watch."""
