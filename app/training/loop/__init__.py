"""The loop: the Controller owns *when* (controller.py), the Trainer *what* (trainer.py, the
step and its recipe), over one process or N (replicas.py); how it ended is a type
(outcome.py); the extras it runs at its boundaries implement one interface (hooks.py)."""
