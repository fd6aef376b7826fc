"""``coretrain generate``: a synthetic data set in the seed's format (app/data/synthetic.py)."""

from __future__ import annotations

import sys

from app import logs
from app.atomic import restrict_umask
from app.config import GenerateConfig
from app.data import synthetic
from app.report import LogOptions


def run(config: GenerateConfig, log: LogOptions) -> None:
    """Write the four data files into ``config.out``; the ``generated`` event says where
    (a line for people on a terminal: ``log``). Raises StorageError when they can't be
    written."""
    logs.setup(text=log.text(sys.stdout))
    restrict_umask()
    written = synthetic.generate(
        config.out, train=config.train, test=config.test, seed=config.seed, kind=config.kind
    )
    logs.event(
        "generated",
        f"synthetic {config.kind} data in {config.out}: {config.train} training and "
        f"{config.test} test samples",
        kind=config.kind,
        train=config.train,
        test=config.test,
        files={k: str(v) for k, v in written.items()},
    )
