"""The host cache shared by a job's processes (docs/design/host-cache.md), with plain processes
that share a job key: a process SIGKILLed while it fills, isolation, and nothing left after
the last process exits. Rows carry their key and a checksum, verified on every read."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import uuid
import zlib

import numpy as np
import pytest

from gpufeed.cache._attach import peer_allowed, socket_prefix, try_receive
from gpufeed.cache._shared import SharedHostCache, fingerprint
from tests._procs import live_children

pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="the host cache needs memfd (Linux)")]

ROW_BYTES = 192 * 1024
NUM_KEYS = 400
BUDGET = 48 << 20  # holds ~250 of the 400 rows: fills stop when it is spent
FP = fingerprint(["test rows", str(ROW_BYTES)])
CTX = mp.get_context("fork")


def make_row(key: int) -> np.ndarray:
    row = np.random.default_rng(key).integers(0, 256, ROW_BYTES, dtype=np.uint8)
    row[:8] = np.frombuffer(np.int64(key).tobytes(), np.uint8)
    row[-4:] = np.frombuffer(np.uint32(zlib.crc32(row[:-4])).tobytes(), np.uint8)
    return row


def check_row(key: int, row: np.ndarray) -> bool:
    return (len(row) == ROW_BYTES and int(row[:8].view(np.int64)[0]) == key
            and int(row[-4:].view(np.uint32)[0]) == zlib.crc32(row[:-4]))


def _attach(job: str, digest: bytes = FP):
    cache = SharedHostCache(job, BUDGET, str(BUDGET))
    return cache, cache.namespace(digest, NUM_KEYS)


def filler(job: str, first: int, progress, inode, go=None) -> None:
    """Fill keys first.. (wrapping) until the budget is spent, then wait to be killed; with
    ``go``, wait for it after the first 40 rows."""
    cache, space = _attach(job)
    inode.value = os.fstat(cache._fd).st_ino
    for i in range(0, NUM_KEYS, 4):  # batches of 4 rows: reserved together, then published
        if i == 40 and go is not None:
            go.wait(30)
        keys = [(first + j) % NUM_KEYS for j in range(i, i + 4)]
        space.put_many(keys, [make_row(k) for k in keys])
        progress.value += 4
    signal.pause()


def reader(job: str, digest: bytes, conn) -> None:
    """Attach, fill what is missing, read every key: (rows seen, bad rows, created)."""
    cache, space = _attach(job, digest)
    for key in range(NUM_KEYS):
        if space.peek(key) is None:
            space.put(key, make_row(key))
    rows = space.get_many(list(range(NUM_KEYS)))
    seen = [k for k, r in enumerate(rows) if r is not None]
    bad = [k for k in seen if not check_row(k, rows[k])]
    conn.send((len(seen), bad, cache.created, os.fstat(cache._fd).st_ino))
    conn.recv()  # stay attached until told
    cache.close()


def _start(target, *args):
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def _wait(predicate, timeout_s: float = 30.0) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _memfd_holders(inode: int) -> list[str]:
    """Every descriptor of any process (that we may read) open on the memfd ``inode``."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    if "gpufeed-host-cache" in os.readlink(f"/proc/{pid}/fd/{fd}") and \
                            os.stat(f"/proc/{pid}/fd/{fd}").st_ino == inode:
                        found.append(f"{pid}/{fd}")
                except OSError:
                    continue
        except OSError:
            continue
    return found


def test_a_filler_killed_mid_fill_leaves_only_whole_rows_and_nothing_after_the_last_exit():
    job = f"test-{uuid.uuid4().hex}"
    shm_before = set(os.listdir("/dev/shm"))
    progress, inode, go = CTX.Value("i", 0), CTX.Value("q", 0), CTX.Event()
    first = _start(filler, job, 0, progress, inode, go)  # creates the cache, pauses after 40 rows
    _wait(lambda: progress.value >= 40)
    progress2, inode2 = CTX.Value("i", 0), CTX.Value("q", 0)
    second = _start(filler, job, NUM_KEYS // 2, progress2, inode2)  # fills alongside
    _wait(lambda: progress2.value >= 4)
    assert inode2.value == inode.value  # attached to the creator's cache
    go.set()
    _wait(lambda: progress.value >= 44)
    assert progress.value < NUM_KEYS  # still filling (the budget holds ~250 rows)
    os.kill(first.pid, signal.SIGKILL)  # the creator dies in the middle of its fill
    first.join(10)
    ours, theirs = CTX.Pipe()
    late = _start(reader, job, FP, theirs)  # attaches through the survivor, fills the rest
    seen, bad, created, late_inode = ours.recv()
    assert not created and late_inode == inode.value  # the same cache, served by the survivor
    assert bad == [] and seen >= 200  # every row read is whole; the budget was filled
    pids = {first.pid, second.pid, late.pid}
    os.kill(second.pid, signal.SIGKILL)
    second.join(10)
    ours.send("done")
    late.join(10)
    assert late.exitcode == 0
    assert [c.pid for c in live_children() if c.pid in pids] == []  # (earlier tests' may linger)
    assert [n for n in set(os.listdir("/dev/shm")) - shm_before  # (other programs make files there)
            if "gpufeed" in n or any(str(pid) in n for pid in pids)] == []
    assert _memfd_holders(inode.value) == []
    assert try_receive(socket_prefix(job)) is None  # the socket names went with their holders


def test_another_job_or_fingerprint_gets_no_rows_and_another_uid_is_refused():
    job = f"test-{uuid.uuid4().hex}"
    progress, inode = CTX.Value("i", 0), CTX.Value("q", 0)
    owner = _start(filler, job, 0, progress, inode)
    _wait(lambda: progress.value >= 20)
    results = []
    for other_job, digest in ((f"other-{uuid.uuid4().hex}", FP), (job, fingerprint(["another transform"]))):
        ours, theirs = CTX.Pipe()
        proc = _start(reader, other_job, digest, theirs)
        # (reader fills what it misses: count what it found before, from a fresh namespace)
        results.append(ours.recv())
        ours.send("done")
        proc.join(10)
    (_, bad_job, created_job, inode_job), (_, bad_fp, created_fp, inode_fp) = results
    assert created_job and inode_job != inode.value  # another job: a cache of its own
    assert not created_fp and inode_fp == inode.value and bad_fp == []  # same cache, own rows
    if os.getuid() == 0:
        ours, theirs = CTX.Pipe()
        proc = _start(_as_other_user, socket_prefix(job), theirs)
        assert ours.recv() is None  # refused: no descriptor
        proc.join(10)
    os.kill(owner.pid, signal.SIGKILL)
    owner.join(10)
    assert [c.pid for c in live_children() if c.pid == owner.pid] == []


def _as_other_user(prefix: str, conn) -> None:
    os.setuid(65534)
    conn.send(try_receive(prefix))


def test_the_peer_check_compares_the_uid_of_the_other_end():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert peer_allowed(a) and not peer_allowed(a, uid=os.getuid() + 1)


def test_a_spent_budget_refuses_new_rows_and_keeps_the_first_ones():
    job = f"test-{uuid.uuid4().hex}"
    cache = SharedHostCache(job, 4 * 4096, "16KiB")
    try:
        space = cache.namespace(FP, 8)
        kept = [space.put(k, bytes([k]) * 4000) for k in range(8)]
        assert kept == [True] * 4 + [False] * 4  # a 64-byte table + 4 rows of 4032 aligned bytes
        assert space.put(0, b"other") is False  # fill-once: never replaced
        assert [None if r is None else bytes(r[:1]) for r in space.get_many([0, 3, 4])] == [
            b"\x00", b"\x03", None]
        assert (space.hits, space.misses) == (2, 1) and cache.nbytes <= cache.budget_bytes
    finally:
        cache.close()
