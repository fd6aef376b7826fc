"""app/report/gateway.py and the push's hostile cases: real socket servers on a loopback port
that drip, hang, answer garbage, fail or redirect, and real ``coretrain train`` processes
signalled mid-push. The runs fail fast on an empty data directory (exit 3, no TensorFlow):
the push comes after the run, so its end keeps the run's own exit code.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge

from app.report import MAX_CHARS, ReportOptions
from app.report.gateway import DEADLINE_S, send
from app.report.push import Recorder, push
from tests.conftest import PINNED, REPO, events, json_lines, run_cli

OK = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
#: Seconds a test waits for a server to receive the push (a hang, not a slow machine).
WAIT = 120.0


class Server:
    """A TCP server on a loopback port that reads each request whole (headers and
    ``Content-Length`` body), records it and answers it with ``answer(conn, request)``."""

    def __init__(self, answer: Callable[[socket.socket, bytes], None]) -> None:
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.requests: list[bytes] = []
        self.received = threading.Event()
        self.closed = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = next(
                (int(line.split(b":")[1]) for line in head.split(b"\r\n")
                 if line.lower().startswith(b"content-length:")),
                0,
            )  # fmt: skip
            while len(body) < length:
                body += conn.recv(65536)
            self.requests.append(head + b"\r\n\r\n" + body)
            self.received.set()
            with suppress(OSError):  # the client went away
                self.answer(conn, head)

    def drip(self, answer: bytes, every_s: float) -> Callable[[socket.socket, bytes], None]:
        """An answer that sends ``answer`` one byte every ``every_s`` seconds."""

        def send_slowly(conn: socket.socket, head: bytes) -> None:
            for i in range(len(answer)):
                conn.sendall(answer[i : i + 1])
                if self.closed.wait(every_s):
                    return

        return send_slowly

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


@contextmanager
def serving(answer: Callable[[Server], Callable[[socket.socket, bytes], None]]) -> Iterator[Server]:
    """A :class:`Server` answering with ``answer(server)``, closed after the block."""
    server = Server(lambda conn, head: None)
    server.answer = answer(server)
    try:
        yield server
    finally:
        server.close()


def hang(server: Server) -> Callable[[socket.socket, bytes], None]:
    return lambda conn, head: server.closed.wait()


def drip_4s(server: Server) -> Callable[[socket.socket, bytes], None]:
    """The gateway of the bad night: one byte every 4 s (of a good answer)."""
    return server.drip(OK, 4.0)


def raw(answer: bytes) -> Callable[[Server], Callable[[socket.socket, bytes], None]]:
    return lambda server: lambda conn, head: conn.sendall(answer)


def redirect_to_ok(server: Server) -> Callable[[socket.socket, bytes], None]:
    """302 to /ok for the push; /ok answers 200 to a GET (as a web server would)."""

    def answer(conn: socket.socket, head: bytes) -> None:
        if head.startswith(b"GET /ok "):
            conn.sendall(OK)
        else:
            conn.sendall(
                b"HTTP/1.1 302 Found\r\nLocation: " + server.url.encode() + b"/ok\r\n"
                b"Content-Length: 0\r\nConnection: close\r\n\r\n"
            )

    return answer


def redirect_loop(server: Server) -> Callable[[socket.socket, bytes], None]:
    def answer(conn: socket.socket, head: bytes) -> None:
        path = head.split(b" ")[1]
        conn.sendall(
            b"HTTP/1.1 307 Temporary Redirect\r\nLocation: " + server.url.encode() + path
            + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )  # fmt: skip

    return answer


def close_at_once(server: Server) -> Callable[[socket.socket, bytes], None]:
    return lambda conn, head: conn.shutdown(socket.SHUT_RDWR)


def registry() -> CollectorRegistry:
    families = CollectorRegistry()
    Gauge("coretrain_run_exit_code", "Exit code of the run", registry=families).set(0)
    return families


def test_a_dripping_answer_is_cut_at_the_deadline_of_the_whole_push() -> None:
    """A good answer one byte every 0.1 s: each read comes within any socket timeout, the
    answer in about 4 s; the push ends at its deadline, 1 s, however the bytes come."""
    with serving(lambda server: server.drip(OK, 0.1)) as server:
        error = send(server.url, "drip", registry(), deadline_s=1.0)
        assert error == "no complete answer within 1 s: the push was abandoned"
        assert server.received.is_set()  # the request went out: the answer was cut


def test_a_prompt_gateway_takes_the_push() -> None:
    with serving(raw(OK)) as server:
        assert send(server.url, "fine", registry()) == ""
        (request,) = server.requests
    assert request.startswith(b"POST /metrics/job/fine HTTP/1.1\r\n")  # POST: pushadd
    assert b"\ncoretrain_run_exit_code 0.0\n" in request


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (raw(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n"),
         "HTTPError: HTTP Error 500: Internal Server Error"),
        (raw(b"NOT HTTP AT ALL\r\n\r\n"), "BadStatusLine: NOT HTTP AT ALL"),
        (raw(b"HTTP/1.1 " + b"9" * 70_000 + b"\r\n\r\n"), "LineTooLong: got more than 65536"),
        (close_at_once, "RemoteDisconnected: Remote end closed connection without response"),
        (redirect_to_ok, "HTTPError: HTTP Error 302: Found: redirected to http://127.0.0.1:"),
        (redirect_loop, "HTTPError: HTTP Error 307: Temporary Redirect: redirected to"),
    ],
    ids=["500", "garbage", "huge-line", "closed", "redirect-to-a-200", "redirect-loop"],
)  # fmt: skip
def test_every_failure_of_the_push_is_a_warning(
    answer: Callable[[Server], Callable[[socket.socket, bytes], None]],
    error: str,
    tmp_path: Path,
    logged: list[logging.LogRecord],
) -> None:
    """Whatever goes wrong, a short ``metrics_push_failed`` warning naming it; a redirect is
    not followed (urllib would repeat the POST as a GET without its body, and a 200 for the
    GET would pass for a push that never arrived)."""
    with serving(answer) as server:
        options = ReportOptions(metrics_push=server.url, metrics_job="hostile")
        assert not push(options, tmp_path, Recorder(), "completed", 0)
        requests = list(server.requests)
    (warning,) = [r for r in logged if getattr(r, "event", None) == "metrics_push_failed"]
    assert warning.levelno == logging.WARNING
    assert warning.__dict__["error"].startswith(error), warning.__dict__["error"]
    assert len(warning.getMessage()) < 500  # a log line under 2,000 characters
    assert not [r for r in logged if getattr(r, "event", None) == "metrics_pushed"]
    assert all(not r.startswith(b"GET ") for r in requests)


def _train(url: str, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    """``coretrain train ARGS`` on an empty data directory (exit 3 before any training),
    its outcome pushed to ``url``."""
    (tmp_path / "data").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("CORETRAIN_")}
    env.update(PINNED)
    return subprocess.Popen(
        [sys.executable, "-m", "app", "train", "--data", str(tmp_path / "data"),
         "--output", str(tmp_path / "out"), "--metrics-push", url, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("answer", "sig"),
    [(drip_4s, signal.SIGTERM), (drip_4s, signal.SIGINT), (hang, signal.SIGTERM)],
    ids=["drip-sigterm", "drip-sigint", "hang-sigterm"],
)
def test_a_signal_during_the_push_ends_it_with_the_runs_exit_code(
    answer: Callable[[Server], Callable[[socket.socket, bytes], None]],
    sig: signal.Signals,
    tmp_path: Path,
) -> None:
    """The bad night: a gateway that drips (or never answers) and a SIGTERM or SIGINT once
    the push is waiting for it: the process exits at once, within 5 s (the push's own
    deadline is 10 s), with the run's exit code, 3, and one line on stderr."""
    with serving(answer) as server:
        proc = _train(server.url, tmp_path)
        try:
            assert server.received.wait(WAIT), "the push never reached the server"
            proc.send_signal(sig)
            stdout, stderr = proc.communicate(timeout=5)
        finally:
            proc.kill()
            proc.wait()
    assert proc.returncode == 3, stderr
    (warning,) = events(json_lines(stdout), "metrics_push_failed")
    assert warning["error"] == f"stopped by {sig.name}: the push was abandoned"
    assert stderr.splitlines() == [stderr.splitlines()[0]]
    assert stderr.startswith("coretrain: ") and "missing data file" in stderr


def test_a_dripping_gateway_holds_the_run_no_longer_than_the_deadline(tmp_path: Path) -> None:
    """No signal: the push is abandoned at its deadline, the run ends with its own code."""
    with serving(drip_4s) as server:
        proc = _train(server.url, tmp_path)
        try:
            stdout, stderr = proc.communicate(timeout=WAIT)
        finally:
            proc.kill()
            proc.wait()
        assert server.received.is_set()
    assert proc.returncode == 3, stderr
    (warning,) = events(json_lines(stdout), "metrics_push_failed")
    assert warning["error"] == f"no complete answer within {DEADLINE_S:g} s: the push was abandoned"
    assert len(stderr.splitlines()) == 1


def test_a_push_failing_with_no_os_error_is_a_warning_not_the_runs_failure(
    tmp_path: Path,
) -> None:
    """A garbage answer makes http.client raise BadStatusLine, an HTTPException and no
    OSError: still a warning, and the run ends with its own code and one stderr line."""
    with serving(raw(b"NOT HTTP AT ALL\r\n\r\n")) as server:
        proc = _train(server.url, tmp_path)
        stdout, stderr = proc.communicate(timeout=WAIT)
    assert proc.returncode == 3, stderr
    (warning,) = events(json_lines(stdout), "metrics_push_failed")
    assert warning["level"] == "WARNING" and warning["url"] == server.url
    assert warning["error"].startswith("BadStatusLine")
    assert not events(json_lines(stdout), "metrics_pushed")
    assert len(stderr.splitlines()) == 1, stderr


def test_the_longest_warning_is_a_lean_log_line(tmp_path: Path) -> None:
    """The longest URL and job the options take, and an answer of one 70,000-byte line:
    the warning is still a log line under 2,000 characters."""
    with serving(raw(b"HTTP/1.1 " + b"9" * 70_000 + b"\r\n\r\n")) as server:
        url = server.url + "/" + "p" * (MAX_CHARS - len(server.url) - 1)
        proc = _train(url, tmp_path, "--metrics-job", "j" * MAX_CHARS)
        stdout, stderr = proc.communicate(timeout=WAIT)
        assert server.received.is_set()
    assert proc.returncode == 3, stderr
    (warning,) = events(json_lines(stdout), "metrics_push_failed")
    assert warning["url"] == url and len(url) == MAX_CHARS
    assert max(len(line) for line in stdout.splitlines()) <= 2000


def test_a_closed_port_is_a_warning_not_a_failed_run(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = _train(closed, tmp_path)
    stdout, stderr = proc.communicate(timeout=WAIT)
    assert proc.returncode == 3  # the run's own code, not the push's
    (warning,) = events(json_lines(stdout), "metrics_push_failed")
    assert warning["level"] == "WARNING" and warning["url"] == closed
    assert "Connection refused" in warning["error"]
    assert len(stderr.splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--metrics-push", "ftp://gateway:9091"], "the scheme must be http or https"),
        (["--metrics-push", "http://gateway:port"], "give the Pushgateway's host and port"),
        (["--metrics-push", "http://gateway:70000"], "give the Pushgateway's host and port"),
        (["--metrics-push", "http://[::1:9091"], "give the Pushgateway's host and port"),
        (["--metrics-push", "http://gateway:9091/?x=1"], "no query or fragment"),
        (["--metrics-push", "gateway:9091 "], "give the Pushgateway's URL"),
        (["--metrics-push", ""], "give the Pushgateway's URL"),
        (["--metrics-push", "http://ops:s3cret@gateway:9091"], "no user or password"),
        (["--metrics-push", "http://gateway:9091", "--metrics-job", ""], "--metrics-job must"),
        (["--metrics-push", "http://gateway:9091", "--metrics-job", " "], "--metrics-job must"),
        (["--metrics-push", "http://gateway:9091", "--metrics-job", "x" * 201], "--metrics-job"),
        (["--metrics-push", "http://gateway:9091", "--metrics-job", "a\tb"], "--metrics-job"),
        (["--metrics-push", "http://gateway:9091/" + "p" * 200], "at most 200"),
    ],
)  # fmt: skip
def test_a_push_url_no_push_could_reach_is_refused_at_the_start(
    args: list[str], says: str, tmp_path: Path
) -> None:
    """Exit 2 before anything is written (not a warning after a night of training), one
    line naming the option; a password in the URL is never echoed."""
    out = tmp_path / "out"
    proc = run_cli("train", "--data", str(tmp_path), "--output", str(out), *args)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("coretrain: --metrics-") and says in line, line
    assert "s3cret" not in proc.stdout + proc.stderr
    assert not out.exists()


def test_a_push_url_from_the_variable_is_named_in_the_refusal(tmp_path: Path) -> None:
    proc = run_cli(
        "train", "--data", str(tmp_path), "--output", str(tmp_path / "out"),
        env={"CORETRAIN_METRICS_PUSH": "ftp://gateway:9091"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.rstrip().endswith("(--metrics-push: from CORETRAIN_METRICS_PUSH)")
