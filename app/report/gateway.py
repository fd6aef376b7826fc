"""One push to a Prometheus Pushgateway, with a deadline for the whole of it.

prometheus-client's ``pushadd_to_gateway`` (HTTP POST to ``/metrics/job/<job>``) runs in a
daemon thread while the caller waits at most ``deadline_s`` seconds for all of it: the
socket timeout bounds each read, not the request, so a gateway that answers a byte every
few seconds held a finished run for minutes. SIGTERM or SIGINT during the wait (a pod
deleted, Ctrl-C) ends it at once: the push is abandoned (its thread dies with the process)
and the caller goes on to exit with the run's own code. A redirect is a failure naming its
target: urllib would repeat a redirected POST as a GET without its body, and the gateway
behind it would answer 200 to a push that never arrived. No TensorFlow here.
"""

from __future__ import annotations

import signal
import threading
import time
import urllib.request
from collections.abc import Callable
from email.message import Message
from typing import IO
from urllib.error import HTTPError

from prometheus_client import CollectorRegistry, pushadd_to_gateway

from app.signals import stops_noted

#: Seconds the whole push may take (connect, send, the answer), then it is abandoned.
DEADLINE_S = 10.0
#: How often the wait looks at the push, the deadline and the signals (seconds).
POLL_S = 0.05
#: The longest error text kept in the warning (a garbage answer can be 64 KiB on one line).
ERROR_CHARS = 300


def send(url: str, job: str, registry: CollectorRegistry, deadline_s: float = DEADLINE_S) -> str:
    """POST ``registry``'s families to the Pushgateway at ``url`` (with its scheme) under
    the grouping key ``job=<job>`` (module docstring); "" when the gateway took them, else
    why not: the exception of any failure (URL, network, HTTP status, a garbage answer),
    no complete answer within ``deadline_s``, or the signal that stopped it."""
    outcome: list[BaseException | None] = []

    def call() -> None:
        try:
            pushadd_to_gateway(
                url, job=job, registry=registry, timeout=deadline_s, handler=_no_redirects
            )
            outcome.append(None)
        except Exception as exc:  # any failure of the push is the caller's warning
            outcome.append(exc)

    thread = threading.Thread(target=call, name="metrics-push", daemon=True)
    end = time.monotonic() + deadline_s
    with stops_noted(pass_on=False) as signals:  # the run is over: its stop request too
        thread.start()
        while thread.is_alive() and not signals and time.monotonic() < end:
            thread.join(max(0.0, min(POLL_S, end - time.monotonic())))
    if outcome:
        return "" if outcome[0] is None else failure(outcome[0])
    if signals:
        return f"stopped by {signal.Signals(signals[0]).name}: the push was abandoned"
    return f"no complete answer within {deadline_s:g} s: the push was abandoned"


def failure(exc: BaseException) -> str:
    """``exc`` as the warning's ``error``: its type and message, cut at ERROR_CHARS."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_CHARS]


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Every redirect answered is an HTTPError naming its target."""

    def redirect_request(
        self,
        req: urllib.request.Request,
        fp: IO[bytes],
        code: int,
        msg: str,
        headers: Message,
        newurl: str,
    ) -> urllib.request.Request | None:
        why = f"{msg}: redirected to {newurl} (give the Pushgateway's own URL)"
        raise HTTPError(req.full_url, code, why, headers, fp)


def _no_redirects(
    url: str, method: str, timeout: float | None, headers: list[tuple[str, str]], data: bytes
) -> Callable[[], None]:
    """prometheus-client's push handler (its ``default_handler``'s request, without
    following redirects): raises HTTPError for any answer that is not 2xx."""

    def handle() -> None:
        request = urllib.request.Request(url, data=data, headers=dict(headers), method=method)
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=timeout):
            pass

    return handle
