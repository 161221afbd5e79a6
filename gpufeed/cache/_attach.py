"""How the processes of one job on a host reach one memfd: every holder serves it on an
abstract Unix socket, newcomers receive it with ``SCM_RIGHTS``; both sides check the peer's
uid (``SO_PEERCRED``). docs/design/host-cache.md, "Attaching".
"""

from __future__ import annotations

import errno
import hashlib
import logging
import os
import select
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable

log = logging.getLogger(__name__)

MAX_MEMBERS = 256  # serving names per job and host (one per attached cache object)
HELLO = b"gpufeed-host-cache-1"
RECV_TIMEOUT_S = 2.0  # per name: a server that accepted answers at once
ATTACH_TIMEOUT_S = 30.0
RETRY_S = 0.01
SERVER_THREAD = "gpufeed-cache-server"

_live_servers: weakref.WeakSet[MemberServer] = weakref.WeakSet()
_fork_hook_set = False


def socket_prefix(job_key: str, uid: int | None = None) -> str:
    """The abstract socket names' prefix of ``job_key`` for this (or ``uid``'s) user."""
    digest = hashlib.blake2b(job_key.encode(), digest_size=8).hexdigest()
    return f"gpufeed-cache-{os.getuid() if uid is None else uid}-{digest}"


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket (``SO_PEERCRED``)."""
    _pid, uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    return int(uid)


def peer_allowed(sock: socket.socket, uid: int | None = None) -> bool:
    """Whether the peer runs as ``uid`` (default: this process's uid)."""
    return peer_uid(sock) == (os.getuid() if uid is None else uid)


def _close_in_child() -> None:
    # A forked child (a loader's worker) never uses the cache: drop what would keep the
    # socket answering nobody, or a dead parent's lock held (docs/design/host-cache.md).
    for server in list(_live_servers):
        server.forget_in_child()


def _ensure_fork_hook() -> None:
    global _fork_hook_set
    if not _fork_hook_set:
        os.register_at_fork(after_in_child=_close_in_child)
        _fork_hook_set = True


class MemberServer:
    """Serves ``fd`` (the memfd) to processes of the same uid on the first free name
    ``PREFIX-K``, from a daemon thread, until ``close()``. ``child_fds``: descriptors of the
    owner to close as well in a forked child."""

    def __init__(self, prefix: str, fd: int, child_fds: Callable[[], list[int]]) -> None:
        self._fd = fd
        self._child_fds = child_fds
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        for k in range(MAX_MEMBERS):
            try:
                self._sock.bind(f"\0{prefix}-{k}")
                break
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
        else:
            self._sock.close()
            raise RuntimeError(f"gpufeed host cache: all {MAX_MEMBERS} socket names {prefix}-K are taken; "
                               "too many loaders share one job key. Fix: cache_scope='rank'.")
        self.name = f"{prefix}-{k}"
        self._sock.listen(64)
        self._wake_r, self._wake_w = os.pipe()
        self._pid = os.getpid()
        _ensure_fork_hook()
        _live_servers.add(self)
        self._thread = threading.Thread(target=self._serve, name=SERVER_THREAD, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                ready, _, _ = select.select([self._sock.fileno(), self._wake_r], [], [])
            except (OSError, ValueError):
                return
            if self._wake_r in ready:
                return
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(RECV_TIMEOUT_S)
                    if peer_allowed(conn):
                        socket.send_fds(conn, [HELLO], [self._fd])
                    else:
                        log.warning("gpufeed host cache: refused a process of uid %d on %s",
                                    peer_uid(conn), self.name)
                except OSError as exc:  # the peer went away: nothing to serve
                    log.debug("gpufeed host cache: a peer left during its attach: %s", exc)

    def forget_in_child(self) -> None:
        """In a forked child: close the inherited socket, pipe and the owner's descriptors."""
        if os.getpid() == self._pid:
            return
        for fd in (self._wake_r, self._wake_w, *self._child_fds()):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            os.close(self._sock.detach())  # the child's copy of the listening socket
        except OSError:
            pass
        self._wake_w = -1

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop serving (idempotent): the name vanishes with this process's descriptor."""
        if os.getpid() != self._pid or self._wake_w < 0:
            return
        os.write(self._wake_w, b"x")
        self._thread.join(timeout_s)
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        self._wake_w = -1
        _live_servers.discard(self)


def try_receive(prefix: str) -> int | None:
    """The memfd from the first server of ``prefix`` that runs as this uid and answers, or None."""
    for k in range(MAX_MEMBERS):
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(RECV_TIMEOUT_S)
            try:
                sock.connect(f"\0{prefix}-{k}")
            except OSError:  # unbound (refused at once) or full backlog
                continue
            if not peer_allowed(sock):
                log.warning("gpufeed host cache: %s-%d runs as uid %d, not ours: skipped", prefix, k, peer_uid(sock))
                continue
            try:
                msg, fds, _flags, _addr = socket.recv_fds(sock, len(HELLO), 1)
            except OSError:  # a server that accepted nothing (timeout) or went away
                continue
            if msg == HELLO and len(fds) == 1:
                return fds[0]
            for fd in fds:
                os.close(fd)
    return None


def attach_or_create(prefix: str, create: Callable[[], int], timeout_s: float = ATTACH_TIMEOUT_S) -> tuple[int, bool]:
    """(memfd, created): receive the job's memfd from a holder, or create it (``create()``)
    under the creation lock when nobody serves it. The caller serves it next (before the lock
    is released here, a creator's memfd must be served: ``create`` starts the server)."""
    deadline = time.monotonic() + timeout_s
    while True:
        fd = try_receive(prefix)
        if fd is not None:
            return fd, False
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0{prefix}-create")
        except OSError as exc:
            lock.close()
            if exc.errno != errno.EADDRINUSE:
                raise
        else:
            with lock:
                fd = try_receive(prefix)  # a creator may have finished in between
                return (fd, False) if fd is not None else (create(), True)
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"gpufeed host cache: no process served the job's cache on \\0{prefix}-K and the "
                f"creation lock \\0{prefix}-create stayed taken for {timeout_s:.0f} s (the limit). "
                "Fix: cache_scope='rank' (a cache per loader), or set GPUFEED_CACHE_JOB to another key."
            )
        time.sleep(RETRY_S)
