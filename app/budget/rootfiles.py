"""The one reader of kernel files under a root directory, recording what it read and why.

Detection never reads the live ``/proc`` or ``/sys`` directly: every path is read under a
``root`` (default ``/``), so tests point it at fixture trees (``tests/fixtures/cgroup/<case>``)
and a support case can be replayed from a copy. Every file read, or tried, is recorded in
``inputs`` with its value; every decision taken on the way goes to ``reasons``.
"""

from __future__ import annotations

import os


class RootFiles:
    """Reads text files under ``root`` and collects ``inputs`` and ``reasons``.

    ``inputs`` maps each path (as seen from ``root``) to its stripped text, or
    ``"<missing>"`` / ``"<unreadable: …>"``. ``reasons`` holds one line per decision;
    fallbacks start with ``"warning: "``.
    """

    def __init__(self, root: str | os.PathLike[str] = "/") -> None:
        self.root = os.fspath(root)
        self.inputs: dict[str, str] = {}
        self.reasons: list[str] = []

    @property
    def is_live(self) -> bool:
        """True when ``root`` is the real ``/`` (then the live process may be asked too)."""
        return os.path.abspath(self.root) == os.sep

    def read(self, path: str) -> str | None:
        """Text of ``path`` (as seen from root), or None; records the stripped value."""
        try:
            with open(os.path.join(self.root, path.lstrip("/")), encoding="utf-8") as handle:
                text = handle.read()
        except FileNotFoundError:
            self.inputs[path] = "<missing>"
            return None
        except (OSError, UnicodeDecodeError) as error:
            detail = getattr(error, "strerror", None) or type(error).__name__
            self.inputs[path] = f"<unreadable: {detail}>"
            return None
        self.inputs[path] = text.strip()
        return text

    def read_or_warn(self, path: str, rest: str, missing_is_normal: bool = False) -> str | None:
        """:meth:`read`, and when that gives nothing the warning ``"<path> <why><rest>"``
        (``why``: :meth:`status`; ``rest`` from its separator on, e.g. ``": not used"``).

        A missing file is not warned when ``missing_is_normal``; an unreadable one always is.
        """
        text = self.read(path)
        if text is None and not (missing_is_normal and self.status(path) == "missing"):
            self.warn(f"{path} {self.status(path)}{rest}")
        return text

    def exists(self, path: str) -> bool:
        """True when ``path`` (as seen from root) exists, readable or not; not an input."""
        return os.path.lexists(os.path.join(self.root, path.lstrip("/")))

    def is_dir(self, path: str) -> bool:
        """True when ``path`` (as seen from root) is a directory; not an input."""
        return os.path.isdir(os.path.join(self.root, path.lstrip("/")))

    def listdir(self, path: str) -> list[str]:
        """Names in directory ``path`` (as seen from root); [] when it can't be listed."""
        try:
            return os.listdir(os.path.join(self.root, path.lstrip("/")))
        except OSError:
            return []

    def status(self, path: str) -> str:
        """Why ``path`` gave nothing: ``"missing"`` or ``"unreadable: ..."``."""
        return self.inputs.get(path, "<missing>").strip("<>")

    def note(self, message: str) -> None:
        """Record a decision."""
        self.reasons.append(message)

    def warn(self, message: str) -> None:
        """Record a fallback (``"warning: "`` + message)."""
        self.reasons.append(f"warning: {message}")
