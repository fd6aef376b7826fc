"""Command-line interface (placeholder until the commands land)."""


def main() -> None:
    raise SystemExit("coretrain: not implemented yet")
