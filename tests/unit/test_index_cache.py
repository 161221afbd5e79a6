"""ImageFolder(index_cache=...): a hit gives the scan's samples; any change to the tree misses."""

from __future__ import annotations

import json
import os
import pickle
import time

import numpy as np
import pytest

from gpufeed.sources import ImageFolder, _index_cache
from gpufeed.sources._index_cache import FORMAT, IndexCacheWarning


@pytest.fixture
def tree(tmp_path):
    root = tmp_path / "tree"
    for k in range(3):
        for j in range(4):
            path = root / f"class{k}" / ("nested" if j == 3 else "") / f"{j}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"x" * (10 + j))
    return root


def cached(root, cache, index_check="directories"):
    """(dataset, whether the cache file was (re)written by building it)."""
    before = os.stat(cache).st_ino if os.path.exists(cache) else None
    ds = ImageFolder(root, index_cache=cache, index_check=index_check)
    return ds, os.stat(cache).st_ino != before  # os.replace puts a new inode in place


def check(root, cache, index_check="directories"):
    """Build with the cache; the result must equal a fresh scan. Returns whether it rewrote."""
    ds, wrote = cached(root, cache, index_check)
    fresh = ImageFolder(root)
    assert ds.samples == fresh.samples and ds.classes == fresh.classes
    return wrote


def test_a_hit_gives_identical_samples_and_leaves_the_file(tree, tmp_path):
    cache = str(tmp_path / "index.npz")
    assert check(tree, cache)  # first run: written
    ds, wrote = cached(tree, cache)
    assert not wrote  # second run: read
    assert ds.samples == ImageFolder(tree).samples and ds.labels.dtype == np.int64
    assert not ds.labels.flags.writeable
    assert pickle.loads(pickle.dumps(ds)).samples == ds.samples
    assert sorted(os.listdir(tmp_path)) == ["index.npz", "tree"]  # no temporary file left
    with np.load(cache, allow_pickle=False) as npz:  # plain arrays, no pickle inside
        meta = json.loads(npz["meta"].tobytes())
        assert meta["format"] == FORMAT and len(npz["labels"]) == len(ds) == 12


CHANGES = ["add", "remove", "rename", "size", "size_same_mtime", "add_class",
           "add_same_dir_mtime", "nested_dir", "relink"]


@pytest.mark.parametrize("index_check", ["directories", "files"])
@pytest.mark.parametrize("change", CHANGES)
def test_any_change_to_the_tree_invalidates(tree, tmp_path, change, index_check):
    """Every change of names misses; a file rewritten in place misses only the "files" check
    (the index itself, paths and labels, is the same: ``check`` compares it with a scan)."""
    cache = str(tmp_path / "index.npz")
    os.symlink(tree / "class0", tree / "class2" / "link")
    check(tree, cache, index_check)
    target = tree / "class1" / "nested" / "3.jpg"
    if change == "add":
        (tree / "class1" / "new.jpg").write_bytes(b"new")
    elif change == "remove":
        target.unlink()
    elif change == "rename":
        target.rename(target.with_name("renamed.jpg"))
    elif change == "size":
        target.write_bytes(b"longer than before")
    elif change == "size_same_mtime":  # a coarse clock: the mtime did not move, the size did
        st = os.stat(target)
        target.write_bytes(b"longer than before")
        os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "add_class":
        (tree / "class9").mkdir()
        (tree / "class9" / "a.jpg").write_bytes(b"x")
    elif change == "add_same_dir_mtime":  # a coarse clock: the directory's mtime did not move
        st = os.stat(tree / "class0")
        (tree / "class0" / "late.jpg").write_bytes(b"x" * 10)
        os.utime(tree / "class0", ns=(st.st_atime_ns, st.st_mtime_ns))
    elif change == "nested_dir":
        (tree / "class2" / "deeper" / "more").mkdir(parents=True)
        (tree / "class2" / "deeper" / "more" / "m.png").write_bytes(b"x")
    elif change == "relink":  # a linked directory now points elsewhere
        os.symlink(tree / "class1", tree / "class2" / "link.new")
        os.replace(tree / "class2" / "link.new", tree / "class2" / "link")
    in_place = change.startswith("size")
    if in_place and index_check == "directories":
        assert not check(tree, cache, index_check)  # reused, and equal to a fresh scan
    else:
        assert check(tree, cache, index_check), f"{change}: the cache was reused"
    assert not check(tree, cache, index_check)  # and the rewritten cache is used next time


def test_a_change_in_the_same_clock_tick_is_caught_by_listing_recent_directories(tree, tmp_path):
    """A coarse clock: a file added after the listing leaves its directory's time as it was.
    The directory was modified within RACY_NS of the cache's writing, so it is listed again."""
    cache = str(tmp_path / "index.npz")
    folder = tree / "class0"
    st = os.stat(folder)
    check(tree, cache)
    (folder / "same_tick.jpg").write_bytes(b"x")
    os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert check(tree, cache)


def test_directory_times_past_the_window_are_trusted_and_the_cache_refreshed(tree, tmp_path,
                                                                                monkeypatch):
    monkeypatch.setattr(_index_cache, "RACY_NS", 50_000_000)  # 50 ms instead of 2 s
    cache = str(tmp_path / "index.npz")
    check(tree, cache)  # directories modified just now: racy
    time.sleep(0.2)
    assert check(tree, cache)  # a hit, listed again, then rewritten with a later time...
    assert not check(tree, cache)  # ...so later hits only stat the directories
    # past the window, a change that keeps its directory's time is not seen by "directories"
    # (the limit, documented), and is by "files"
    by_files = str(tmp_path / "by_files.npz")
    check(tree, by_files, "files")
    assert not check(tree, by_files, "files")
    folder = tree / "class1"
    st = os.stat(folder)
    (folder / "hidden.jpg").write_bytes(b"x")
    os.utime(folder, ns=(st.st_atime_ns, st.st_mtime_ns))
    ds, wrote = cached(tree, cache)
    assert not wrote and len(ds) == len(ImageFolder(tree)) - 1
    assert check(tree, by_files, "files")


def test_an_unknown_check_is_refused(tree, tmp_path):
    with pytest.raises(ValueError, match="`index_check` must be one of 'directories', 'files'"):
        ImageFolder(tree, index_cache=str(tmp_path / "i.npz"), index_check="mtime")


def test_a_changed_option_misses(tree, tmp_path):
    cache = str(tmp_path / "index.npz")
    check(tree, cache)
    (tree / "class0" / "notes.txt").write_bytes(b"")  # also changes the tree, so: two steps
    check(tree, cache)
    ds = ImageFolder(tree, index_cache=cache, is_valid_file=lambda p: p.endswith(".txt"),
                     allow_empty=True)
    assert [os.path.basename(p) for p, _ in ds.samples] == ["notes.txt"]


@pytest.mark.parametrize("content", ["garbage", "truncated", "foreign_npz", "pickle_npz",
                                     "other_version"])
def test_a_corrupt_or_foreign_file_is_ignored_with_a_warning_and_rewritten(tree, tmp_path,
                                                                            content):
    cache = tmp_path / "index.npz"
    check(tree, str(cache))
    if content == "garbage":
        cache.write_bytes(b"\x00not a zip file at all" * 10)
    elif content == "truncated":
        cache.write_bytes(cache.read_bytes()[:200])
    elif content == "foreign_npz":
        np.savez(cache, weights=np.zeros(3))
    elif content == "pickle_npz":
        np.savez(cache, meta=np.array([{"format": FORMAT}], dtype=object))
    elif content == "other_version":
        with np.load(cache) as npz:
            arrays = dict(npz)
        meta = json.loads(arrays["meta"].tobytes())
        meta["version"] = 99
        arrays["meta"] = np.frombuffer(json.dumps(meta).encode(), np.uint8)
        np.savez(cache, **arrays)
    with pytest.warns(IndexCacheWarning, match="index cache .* is not a valid gpufeed-index"):
        assert check(tree, str(cache))
    assert not check(tree, str(cache))  # rewritten: valid again


def test_an_unwritable_cache_location_only_costs_the_cache(tree, tmp_path, caplog):
    ds = ImageFolder(tree, index_cache=str(tmp_path / "missing_dir" / "index.npz"))
    assert ds.samples == ImageFolder(tree).samples
    assert "could not write the index cache" in caplog.text
