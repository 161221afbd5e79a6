"""Which job a process belongs to for the host cache, and when a loader shares it
(docs/design/host-cache.md, "Which loaders share")."""

from __future__ import annotations

import uuid

import pytest
from torch.distributed import HashStore

from gpufeed.cache._job import job_info, store_key, wants_host_cache
from gpufeed.cache._shared import SharedHostCache, fingerprint
from gpufeed.errors import GpufeedWarning

TORCHRUN = {"TORCHELASTIC_RUN_ID": "none", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500",
            "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1"}


def test_job_keys_come_from_the_launchers_environment_first_found():
    assert job_info({"GPUFEED_CACHE_JOB": "mine", **TORCHRUN}).key == "env:mine"
    assert job_info({**TORCHRUN, "TORCHELASTIC_RUN_ID": "abc"}).key == "elastic:abc:127.0.0.1:29500"
    info = job_info(TORCHRUN)  # torchrun without a run id ("none"): the master and world size
    assert info.key == "master:127.0.0.1:29500:4" and info.local_world_size == 2 and info.local_rank == 1
    assert job_info({}).key is None  # one process, no process group


@pytest.mark.parametrize(("env", "scope", "shared"), [
    (TORCHRUN, "auto", True),
    ({**TORCHRUN, "LOCAL_WORLD_SIZE": "1"}, "auto", False),  # one rank per host: nothing to share
    ({"MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "2"}, "auto", True),  # Lightning: no local size
    (TORCHRUN, "rank", False),
    ({}, "auto", False),
    ({"GPUFEED_CACHE_JOB": "x"}, "auto", True),
    ({}, "host", True),  # the caller raises: no job key
])
def test_auto_shares_only_between_several_local_ranks(env, scope, shared):
    assert wants_host_cache(scope, job_info(env)) is shared


def test_ranks_agree_on_a_store_key_without_waiting():
    store = HashStore()
    first, second = store_key(store, "host-a"), store_key(store, "host-a")
    assert first == second and len(first) == 32 and store_key(store, "host-b") != first


def test_a_second_budget_warns_and_keeps_the_hosts_and_loaders_share_it():
    job = f"test-{uuid.uuid4().hex}"
    first = SharedHostCache(job, 1 << 20, "1MB")
    try:
        with pytest.warns(GpufeedWarning, match="cache_bytes='1MB'"):
            second = SharedHostCache(job, 1 << 30, "1GB")
        try:
            assert second.budget_bytes == first.budget_bytes == 1 << 20 and not second.created
            train, val = first.namespace(fingerprint(["train"]), 10), second.namespace(fingerprint(["val"]), 10)
            train.put(0, b"t" * 1000)
            val.put(0, b"v" * 1000)
            assert first.nbytes == second.nbytes == 2 * 128 + 2 * 1024  # two tables, two rows: one budget
            assert bytes(val.peek(0)[:1]) == b"v" and bytes(train.peek(0)[:1]) == b"t"
        finally:
            second.close()
    finally:
        first.close()


def test_cache_scope_is_checked_at_construction_and_host_needs_a_job(tmp_path, monkeypatch):
    from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
    from gpufeed.synth import make_image_folder

    make_image_folder(tmp_path, num_classes=1, per_class=2, size=(20, 20))
    dataset = ImageFolder(tmp_path, transform=ResizeCenterCrop(16, 16))
    with pytest.raises(ValueError, match="`cache_scope` must be one of 'auto', 'host', 'rank'. Found: 'node'"):
        FastLoader(dataset, batch_size=2, cache_bytes="1MB", cache_scope="node")
    for name in ("GPUFEED_CACHE_JOB", "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    loader = FastLoader(dataset, batch_size=2, cache_bytes="1MB", cache_scope="host")
    assert loader.cache_scope == "host"
    with pytest.raises(ValueError, match="no job was found"):
        iter(loader)
    single = FastLoader(dataset, batch_size=2, cache_bytes="1MB")  # "auto", one process: as before
    assert [len(x) for x, _ in single] == [2] and single.stats()["cache_shared"] == 0
    assert single.stats()["cache_budget_bytes"] == 10**6


@pytest.mark.timeout(60)
def test_auto_warns_and_keeps_a_cache_of_its_own_when_the_host_cache_cannot_be_reached(
        tmp_path, monkeypatch, caplog):
    """A creator that holds the creation lock and never serves (stuck, stopped): under "auto"
    the attach times out, the loader warns and caches in its own LRU; under "host" it is the
    error (docs/design/host-cache.md, "Attaching")."""
    import logging
    import socket

    import gpufeed.cache._shared as shared_module
    from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
    from gpufeed.cache._attach import socket_prefix
    from gpufeed.synth import make_image_folder

    make_image_folder(tmp_path, num_classes=2, per_class=4, size=(20, 20))
    dataset = ImageFolder(tmp_path, transform=ResizeCenterCrop(16, 16))
    key = f"stuck-{uuid.uuid4().hex}"
    monkeypatch.setenv("GPUFEED_CACHE_JOB", key)
    monkeypatch.setattr(shared_module, "ATTACH_TIMEOUT_S", 0.3)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as squatter:
        # the creation lock, taken by a creator that never serves
        squatter.bind(f"\0{socket_prefix(job_info().key or '')}-create")
        loader = FastLoader(dataset, batch_size=4, cache_bytes="1MB")
        with caplog.at_level(logging.WARNING, logger="gpufeed"):
            epochs = [[x.clone() for x, _ in loader] for _ in range(2)]
        assert "the job's host cache could not be reached" in caplog.text
        assert "stayed taken" in caplog.text and "cache_scope='rank'" in caplog.text
        stats = loader.stats()
        assert stats["cache_shared"] == 0 and stats["cache_budget_bytes"] == 10**6
        assert stats["cache_hits"] == 8 and stats["cache_misses"] == 8  # its own LRU served epoch 2
        assert all(a.equal(b) for a, b in zip(*epochs, strict=True))
        host = FastLoader(dataset, batch_size=4, cache_bytes="1MB", cache_scope="host")
        with pytest.raises(TimeoutError, match="stayed taken"):
            iter(host)
