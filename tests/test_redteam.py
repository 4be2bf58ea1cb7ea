"""Red-team trials: attacks from outside the attack matrix's earlier rows (docs/security.md,
"Red team"). Each asserts that the honest side wins (or the agent reports the problem and keeps
working) and records its trial for ``scripts/bench_security.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from security_report import record


@contextmanager
def trial(name: str) -> Iterator[None]:
    ok = False
    try:
        yield
        ok = True
    finally:
        record("attack", f"redteam: {name}", ok)


# -- the trainer's artifact server answers slowly before any body -----------------------------------


@contextmanager
def raw_server(answer: Callable[[socket.socket], None]) -> Iterator[str]:
    """A TCP server that reads the request, then runs ``answer`` on the connection (one thread each)."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def handle(c: socket.socket) -> None:
        with c:
            try:
                c.recv(65536)
                answer(c)
            except OSError:
                pass

    def serve() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except OSError:
                continue
            threading.Thread(target=handle, args=(c,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        srv.close()


def _drip(prefix: bytes, endless: bytes) -> Callable[[socket.socket], None]:
    def answer(c: socket.socket) -> None:
        c.sendall(prefix)
        for _ in range(200):  # 40 s unless the reader hangs up
            c.sendall(endless)
            time.sleep(0.2)

    return answer


SLOW_ANSWERS = {
    # a byte of the status line every 0.2 s: each socket read succeeds within its timeout
    "status-line": _drip(b"HTTP/1.0 200", b"0"),
    # the status, then one header line that never ends
    "header-line": _drip(b"HTTP/1.0 200 OK\r\nX-Pad: ", b"a"),
    # headers without end, each short (http.client reads up to 100)
    "many-headers": _drip(b"HTTP/1.0 200 OK\r\n", b"X-A: b\r\n"),
    # a chunked body whose chunk-size line never ends (read inside one read1 call)
    "chunk-size-line": _drip(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n", b"0"),
}


@pytest.mark.parametrize("how", sorted(SLOW_ANSWERS))
def test_a_server_dripping_its_status_line_or_headers_is_cut_off_at_the_reads_deadline(how):
    """The trainer's server answers the auditor's read a byte at a time *before* the body (status
    line, headers, a chunk-size line): every socket read succeeds within its timeout, so before,
    the read waited without end (the deadline was checked only between body reads) and the
    auditor missed its game's clock. Now the whole read, retries included, ends at its deadline."""
    from protocol.store import ArtifactUnavailable, HttpArtifactReader

    with trial(f"artifact server drips its {how}"), raw_server(SLOW_ANSWERS[how]) as url:
        reader = HttpArtifactReader(url, retries=2, timeout=2.0, backoff=0.05, read_deadline=0.5)
        t0 = time.monotonic()
        with pytest.raises(ArtifactUnavailable, match="read's deadline"):
            reader.get_step(1, 1)
        assert time.monotonic() - t0 < 1.5  # one deadline for all attempts, not one each
