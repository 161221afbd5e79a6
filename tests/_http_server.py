"""A local HTTP file server for remote-storage tests: a directory tree served on 127.0.0.1,
with ranged GETs (``Range: bytes=A-B``, answered 206) as object stores serve them.

Directory listings are the standard library's (``SimpleHTTPRequestHandler``), which fsspec's
HTTP filesystem parses. Faults are injected per path (relative to the served root, ``/``-joined):
a delay on every request, a 503 on the first GET of some paths (``fail_once``), a fixed status
on every GET of others (``fail_always``: 503, 404...), a longer delay for some (``slow``). The
server counts GETs per path and the largest number of requests waiting for their answer at
once (from arrival to the answer's first byte), and keeps the ``X-Test`` request headers it
saw. HTTP/1.0 (one request per connection) by default, or
HTTP/1.1 keep-alive (``keep_alive=True``: idle connections are dropped after 2 s), and
non-daemon handler threads: :meth:`close` stops the server and joins every handler thread.
"""

from __future__ import annotations

import re
import threading
import urllib.parse
from collections import Counter
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class FileServer:
    """Serve ``root`` on ``127.0.0.1:<free port>`` from a background thread until :meth:`close`.

    ``delay_s``: sleep before answering each request (seconds). ``fail_once``: paths whose
    first GET answers 503. ``fail_always``: path -> status answered on every GET. ``slow``:
    path -> delay (seconds) instead of ``delay_s``.
    """

    def __init__(self, root: str | Path, *, delay_s: float = 0.0,
                 fail_once: set[str] | None = None,
                 fail_always: dict[str, int] | None = None,
                 slow: dict[str, float] | None = None, keep_alive: bool = False) -> None:
        self.root = Path(root)
        self.delay_s = delay_s
        self.fail_once = set(fail_once or ())
        self.fail_always = dict(fail_always or {})
        self.slow = dict(slow or {})
        self.headers_seen: set[str] = set()  # values of the X-Test request header
        self.gets: Counter[str] = Counter()  # GETs per path, listings included
        self.failed: Counter[str] = Counter()  # error answers per path
        self.active = 0
        self.max_active = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        handler = partial(_KeepAliveHandler if keep_alive else _Handler, self,
                          directory=str(self.root))
        self.httpd = _Server(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = False  # joined by server_close()
        self.httpd.block_on_close = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name="test-http-server", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (no trailing slash)."""
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def requests(self) -> int:
        """GETs answered so far (listings and files, errors included)."""
        with self._lock:
            return sum(self.gets.values())

    def file_gets(self, suffix: str = ".jpg") -> Counter[str]:
        """GETs per file path ending in ``suffix`` (case-insensitive)."""
        with self._lock:
            return Counter({p: n for p, n in self.gets.items() if p.lower().endswith(suffix)})

    def reset_counts(self) -> None:
        with self._lock:
            self.gets.clear()
            self.failed.clear()
            self.max_active = 0

    def close(self) -> None:
        """Stop serving, wait for the handler threads and the server thread (5 s at most)."""
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()  # joins the request threads (block_on_close)
        self._thread.join(timeout=5)

    def __enter__(self) -> FileServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _begin(self, path: str, header: str | None) -> int | None:
        """Count a GET of ``path``; the error status to answer, or None to serve it."""
        with self._lock:
            if header is not None:
                self.headers_seen.add(header)
            self.gets[path] += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            status = self.fail_always.get(path)
            if status is None and path in self.fail_once and self.gets[path] == 1:
                status = 503
            if status is not None:
                self.failed[path] += 1
            return status

    def _end(self) -> None:
        with self._lock:
            self.active -= 1


class _Server(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        if not isinstance(sys.exc_info()[1], ConnectionError):  # a client that timed out and left
            super().handle_error(request, client_address)


class _Handler(SimpleHTTPRequestHandler):
    protocol_version = "HTTP/1.0"

    def __init__(self, server_state: FileServer, *args: Any, **kwargs: Any) -> None:
        self.state = server_state
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:  # noqa: N802 - the standard library's name
        path = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
        state = self.state
        status = state._begin(path, self.headers.get("X-Test"))
        try:
            delay_s = state.slow.get(path, state.delay_s)
            stopping = bool(delay_s) and state._stop.wait(delay_s)
        finally:
            # Active until its answer begins, not until this thread is done: a client that has
            # read the whole answer may send its next request before this thread runs again (on
            # a loaded machine), and that request did not overlap this one.
            state._end()
        if stopping:
            self.send_error(503, "server stopping")
            return
        if status is not None:
            self.send_error(status, "injected failure")
            return
        if self.headers.get("Range") and self._send_range():
            return
        super().do_GET()

    def _send_range(self) -> bool:
        """Answer ``Range: bytes=A-B`` of a file with 206 and those bytes (what object stores
        do); False for anything else, which the standard handler answers whole."""
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", "").strip())
        target = Path(self.translate_path(self.path))
        if match is None or not target.is_file():
            return False
        size = target.stat().st_size
        start = int(match.group(1))
        end = min(size - 1, int(match.group(2))) if match.group(2) else size - 1
        if start >= size:
            self.send_error(416, "range not satisfiable")
            return True
        with open(target, "rb") as f:
            f.seek(start)
            body = f.read(end - start + 1)
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        self.wfile.write(body)
        return True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - base signature
        pass  # quiet: pytest would show every request


class _KeepAliveHandler(_Handler):
    protocol_version = "HTTP/1.1"
    timeout = 2.0  # seconds an idle connection is kept (then its thread ends)
