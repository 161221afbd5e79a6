"""Remote sources: ImageFolder and ImageDataset over URLs, against a local HTTP server.

The server (tests/_http_server.py) serves a synthetic image tree on 127.0.0.1 with a delay per
request and injected failures, counts the requests per path and the most in flight at once, and
is stopped by each test's fixture. Results must equal the same tree read from local disk.
"""

from __future__ import annotations

import logging
import pickle
import random
import shutil
import sys
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import Dataset

from gpufeed import FastLoader, ImageDataset, ImageFolder, ResizeCenterCrop
from gpufeed.errors import ReadError
from gpufeed.sources import RemoteOptions
from gpufeed.sources._remote import RemoteReader, is_transient, is_url
from tests._http_server import FileServer

pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

T = ResizeCenterCrop(40, 48)
FAST = RemoteOptions(retries=2, backoff_s=0.005, max_backoff_s=0.02, timeout_s=10)
DELAY_S = 0.02


@pytest.fixture(scope="module")
def tree(image_folder) -> Path:
    """3 classes x 6 JPEGs, plus a nested folder with a space, an upper-case extension and a
    file that is not an image (left out by the extension filter)."""
    root = image_folder(num_classes=3, per_class=6, size=((48, 64), (56, 72)), seed=4, private=True)
    nested = root / "class_01" / "sub dir"
    nested.mkdir()
    shutil.copy(root / "class_00" / "img_00000.jpg", nested / "Extra Image.JPG")
    (root / "class_02" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture
def serve(tree):
    """``serve(**faults) -> FileServer`` of ``tree``; every server is closed and its threads
    joined when the test ends."""
    servers: list[FileServer] = []

    def start(**kwargs) -> FileServer:
        kwargs.setdefault("delay_s", DELAY_S)
        servers.append(FileServer(tree, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
    left = [t.name for t in threading.enumerate()
            if t.name == "test-http-server" or "process_request_thread" in t.name]
    assert not left, f"server threads still alive: {left}"


def _batches(ds, num_workers: int, **kwargs) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader = FastLoader(ds, batch_size=5, num_workers=num_workers, shuffle=True,
                        generator=torch.Generator().manual_seed(7), **kwargs)
    return [(x.clone(), y.clone()) for x, y in loader]


def _files(tree: Path) -> list[str]:
    return [p.relative_to(tree).as_posix() for p in tree.rglob("*") if p.suffix.lower() == ".jpg"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_imagefolder_over_http_gives_the_local_batches(tree, serve, num_workers):
    files = sorted(_files(tree))
    flaky = set(files[::4])  # every 4th file answers 503 once
    server = serve(fail_once=flaky)
    remote = ImageFolder(server.url + "/", T, remote_options=FAST)
    local = ImageFolder(tree, T)
    assert remote.classes == local.classes and remote.class_to_idx == local.class_to_idx
    assert remote.targets == local.targets
    assert [u[len(server.url) + 1:] for u, _ in remote.samples] == [
        p[len(str(tree)) + 1:].replace(" ", "%20") for p, _ in local.samples]
    assert remote.read_concurrency == 16 and local.read_concurrency == 1
    server.reset_counts()  # the listing's GETs aside
    got, want = _batches(remote, num_workers), _batches(local, num_workers)
    assert len(got) == len(want) == 4
    for (x, y), (u, v) in zip(got, want):
        assert x.dtype == torch.uint8 and torch.equal(x, u) and torch.equal(y, v)
    # One GET per sample, plus one retry for each 503: the requests are bounded.
    assert server.file_gets() == {f: 1 + (f in flaky) for f in files}
    assert sum(server.failed.values()) == len(flaky)


@pytest.mark.timeout(120)
def test_reads_overlap_at_the_server(tree, serve):
    server = serve()
    for concurrency, num_workers in ((1, 1), (8, 1), (16, 2)):
        ds = ImageFolder(server.url, T, read_concurrency=concurrency)
        server.reset_counts()
        _batches(ds, num_workers)
        if concurrency == 1:
            assert server.max_active == 1  # one worker, one read at a time
        else:
            assert server.max_active > 1, (concurrency, num_workers)
        assert sum(server.file_gets().values()) == len(ds)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_file_that_always_fails_raises_naming_url_and_index(tree, serve, num_workers):
    bad = "class_01/img_00003.jpg"
    server = serve(fail_always={bad: 503})
    ds = ImageFolder(server.url, T, remote_options=FAST)
    index = next(i for i, (u, _) in enumerate(ds.samples) if u.endswith(bad))
    with pytest.raises(ReadError) as info:
        list(FastLoader(ds, batch_size=4, num_workers=num_workers))
    text = str(info.value)
    assert f"{server.url}/{bad} (sample index {index})" in text
    assert "503" in text and "gave up after 3 attempts" in text
    assert server.gets[bad] == 3  # retries=2: three requests, no more
    assert isinstance(info.value, OSError)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_missing_file_is_not_retried_and_skip_counts_it(tree, serve, num_workers, caplog):
    caplog.set_level(logging.WARNING, logger="gpufeed")
    gone, flaky = "class_00/img_00002.jpg", "class_02/img_00005.jpg"
    server = serve(fail_always={gone: 404}, fail_once={flaky})
    ds = ImageFolder(server.url, T, remote_options=FAST)
    index = next(i for i, (u, _) in enumerate(ds.samples) if u.endswith(gone))
    loader = FastLoader(ds, batch_size=4, num_workers=num_workers, on_error="skip")
    got = list(loader)
    labels = torch.cat([y for _, y in got])
    want = [t for i, t in enumerate(ds.targets) if i != index]
    assert labels.tolist() == want
    local = ImageFolder(tree, T)
    want_rows = torch.stack([local[i][0] for i in range(len(ds)) if i != index])
    assert torch.equal(torch.cat([x for x, _ in got]), want_rows)
    assert loader.stats()["skipped"] == 1
    assert server.gets[gone] == 1 and server.gets[flaky] == 2  # 404: never retried
    assert any(f"{server.url}/{gone}" in r.getMessage() and "not retried" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(ReadError, match=rf"{gone} \(sample index {index}\).*FileNotFoundError"):
        list(FastLoader(ds, batch_size=4, num_workers=num_workers))


@pytest.mark.timeout(60)
def test_timeout_counts_as_transient(tree, serve):
    slow = "class_00/img_00001.jpg"
    server = serve(slow={slow: 5.0})
    # 1 s: 50x a served file's 20 ms, so that the read after the timeouts never times out on a
    # loaded machine; 5x shorter than the slow file's delay
    reader = RemoteReader(options=RemoteOptions(timeout_s=1.0, retries=1, backoff_s=0.01))
    with pytest.raises(ReadError, match="TimeoutError.*gave up after 2 attempts"):
        reader.read(f"{server.url}/{slow}", 3)
    assert server.gets[slow] == 2
    assert len(reader.read(f"{server.url}/class_00/img_00000.jpg")) > 100


@pytest.mark.timeout(120)
def test_image_dataset_of_urls_and_storage_options(tree, serve):
    server = serve()
    local = ImageFolder(tree, T)
    urls = [(f"{server.url}/{Path(p).relative_to(tree).as_posix()}", c) for p, c in local.samples]
    ds = ImageDataset(urls, T, storage_options={"headers": {"X-Test": "from-options"}})
    assert ds.read_concurrency == 16
    got, want = _batches(ds, 2), _batches(local, 2)
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(got, want))
    assert server.headers_seen == {"from-options"}  # storage_options reached fsspec

    class Items(Dataset):  # a user dataset whose items are (URL, label): read one at a time
        def __len__(self):
            return len(urls)

        def __getitem__(self, i):
            return urls[i]

    wrapped = ImageDataset(Items(), T)
    assert wrapped.read_concurrency == 1
    got = _batches(wrapped, 0)
    assert all(torch.equal(x, u) and torch.equal(y, v) for (x, y), (u, v) in zip(got, want))


def test_file_urls_list_like_a_local_tree(tree):
    remote, local = ImageFolder(f"file://{tree}", T), ImageFolder(tree, T)
    assert remote.classes == local.classes and remote.targets == local.targets
    assert [u for u, _ in remote.samples] == [f"file://{p}" for p, _ in local.samples]
    assert torch.equal(remote[5][0], local[5][0])
    valid = ImageFolder(f"file://{tree}", T, is_valid_file=lambda u: u.endswith((".jpg", ".txt")))
    local = ImageFolder(tree, T, is_valid_file=lambda u: u.endswith((".jpg", ".txt")))
    assert [u for u, _ in valid.samples] == [f"file://{p}" for p, _ in local.samples]
    assert len(valid) == 19 and valid.samples[-1][0].endswith("notes.txt")


def test_reader_pickles_without_its_filesystem(tree, serve):
    server = serve(delay_s=0)
    ds = ImageFolder(server.url, T)
    assert ds.remote._filesystems  # the listing opened one here
    copy = pickle.loads(pickle.dumps(ds))
    assert copy.remote._filesystems == {} and copy.remote.options == ds.remote.options
    assert torch.equal(copy[0][0], ds[0][0])


def test_options_and_messages(tree, monkeypatch):
    with pytest.raises(ValueError, match="`retries` must be an int >= 0"):
        RemoteOptions(retries=-1)
    with pytest.raises(ValueError, match="`timeout_s`"):
        RemoteOptions(timeout_s=0)
    backoff = RemoteOptions(backoff_s=0.1, max_backoff_s=0.3)
    assert all(0.05 <= backoff.backoff(0) <= 0.1 for _ in range(20))
    assert all(0.15 <= backoff.backoff(5) <= 0.3 for _ in range(20))
    random.seed(3)
    first = random.random()
    random.seed(3)
    backoff.backoff(1)  # the jitter has its own generator: the global state is the user's
    assert random.random() == first
    with pytest.raises(ValueError, match="apply to URL roots"):
        ImageFolder(tree, T, storage_options={"anon": True})
    with pytest.raises(ValueError, match="`loader` takes a local file path"):
        ImageFolder(f"file://{tree}", None, loader=lambda p: p)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        ImageFolder(f"file://{tree}/nowhere", T)
    assert is_url("s3://b/k") and is_url("simplecache::s3://b/k") and not is_url(str(tree))
    assert not is_url(Path("s3://b/k"))
    assert is_transient(ConnectionResetError()) and is_transient(TimeoutError())
    assert not is_transient(FileNotFoundError("x")) and not is_transient(PermissionError())
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if fsspec were not installed
    with pytest.raises(ImportError, match=r"pip install gpufeed\[remote\]"):
        ImageFolder("s3://bucket/train", T)
