"""gpufeed.sources.pack / LMDBDataset round trips, map growth, failures, and the CLI."""

from __future__ import annotations

import json
import os
import sys

import lmdb
import numpy as np
import pytest

from gpufeed.cli import main
from gpufeed.decode import backends, decode, read_header
from gpufeed.errors import DecodeError
from gpufeed.sources import ImageFolder, LMDBDataset, pack
from gpufeed.sources.packed import META_KEY, _put_all, sample_key
from gpufeed.synth import encode, make_image_folder, photo_like


@pytest.fixture
def src(tmp_path):
    make_image_folder(tmp_path / "src", num_classes=3, per_class=5,
                      size=((60, 200), (60, 200)), seed=1)
    return tmp_path / "src"


def test_round_trip_keeps_bytes_labels_and_classes(src, tmp_path):
    result = pack(src, tmp_path / "db.lmdb", progress=False)
    folder = ImageFolder(src)
    ds = LMDBDataset(tmp_path / "db.lmdb")
    assert result.count == len(ds) == len(folder) == 15 and result.reencoded == 0
    assert ds.classes == folder.classes and ds.class_to_idx == folder.class_to_idx
    assert result.bytes_read == result.bytes_written
    for i in range(len(ds)):
        assert ds.read(i) == folder.read(i)
        assert ds.label(i) == folder.label(i)
    assert np.array_equal(ds.labels, folder.labels)
    assert ds.describe(4).startswith("lmdb:0000000004 in ")
    assert ds.describe(4).endswith(f"(packed from {os.path.join('class_00', 'img_00004.jpg')})")
    assert not any(p.name.startswith("db.lmdb.partial") for p in tmp_path.iterdir())


def test_max_side_downscales_only_large_images(src, tmp_path):
    pack(src, tmp_path / "db.lmdb", max_side=100, progress=False)
    folder, ds = ImageFolder(src), LMDBDataset(tmp_path / "db.lmdb")
    assert ds.meta["max_side"] == 100
    for i in range(len(ds)):
        original, stored = read_header(folder.read(i)), read_header(ds.read(i))
        longest = max(original.height, original.width)
        if longest <= 100:
            assert ds.read(i) == folder.read(i)
        else:
            assert max(stored.height, stored.width) == 100
            ratio = original.width / original.height
            assert abs(stored.width / stored.height - ratio) < 0.05 * ratio + 0.02
            assert stored.fmt == "jpeg"


def test_quality_reencodes_everything_as_jpeg(tmp_path):
    make_image_folder(tmp_path / "png", num_classes=1, per_class=3, size=(40, 50), fmt="png")
    result = pack(tmp_path / "png", tmp_path / "db.lmdb", quality=80, progress=False)
    ds = LMDBDataset(tmp_path / "db.lmdb")
    assert result.reencoded == 3 and result.bytes_written < result.bytes_read
    folder = ImageFolder(tmp_path / "png")
    for i in range(3):
        assert read_header(ds.read(i)).fmt == "jpeg"
        expect = decode(encode(decode(folder.read(i)), quality=80))  # same encoder and quality
        assert np.abs(decode(ds.read(i)).astype(np.int16) - expect).mean() < 1


def test_exif_oriented_image_keeps_its_orientation_when_reencoded(tmp_path):
    from gpufeed.synth import with_exif_orientation

    (tmp_path / "src" / "c").mkdir(parents=True)
    data = with_exif_orientation(encode(photo_like(100, 200, seed=2)), 6)
    (tmp_path / "src" / "c" / "x.jpg").write_bytes(data)
    pack(tmp_path / "src", tmp_path / "db.lmdb", max_side=50, progress=False)
    stored = read_header(LMDBDataset(tmp_path / "db.lmdb").read(0))
    assert (stored.height, stored.width, stored.orientation) == (50, 25, 1)


def lmdb_content(path) -> list[tuple[bytes, bytes]]:
    """Every (key, value) of an LMDB, in key order."""
    env = lmdb.open(str(path), readonly=True, lock=False)
    try:
        with env.begin() as txn:
            return list(txn.cursor())
    finally:
        env.close()


def test_bad_file_stops_pack_naming_it_and_a_rerun_resumes_there(src, tmp_path):
    bad = src / "class_01" / "img_00002.jpg"
    good = bad.read_bytes()
    bad.write_bytes(b"")
    with pytest.raises(DecodeError) as info:
        pack(src, tmp_path / "db.lmdb", progress=False, txn_bytes=1)
    assert str(bad) in str(info.value) and "sample index 7" in str(info.value)
    assert "resume at sample 7" in "\n".join(getattr(info.value, "__notes__", []))
    assert not (tmp_path / "db.lmdb").exists() and (tmp_path / "db.lmdb.partial").is_dir()
    bad.write_bytes(good)
    result = pack(src, tmp_path / "db.lmdb", progress=False)
    assert result.resumed_from == 7 and result.count == 15
    pack(src, tmp_path / "fresh.lmdb", progress=False)
    assert lmdb_content(tmp_path / "db.lmdb") == lmdb_content(tmp_path / "fresh.lmdb")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["db.lmdb", "fresh.lmdb", "src"]


KILL_AFTER_COMMITS = """
import os, signal, sys
import gpufeed.sources.packed as packed
commits = 0
real_put_all = packed._put_all
def put_all_then_die(env, items, *, append):
    global commits
    real_put_all(env, items, append=append)
    commits += 1
    if commits == 4:
        os.kill(os.getpid(), signal.SIGKILL)  # as a user's kill -9, mid-pack
packed._put_all = put_all_then_die
packed.pack(sys.argv[1], sys.argv[2], progress=False, txn_bytes=1, workers=3)
"""


def test_a_partial_pack_of_other_options_is_replaced_and_two_packs_never_share_one(src,
                                                                                   tmp_path):
    import fcntl

    with pytest.raises(DecodeError):
        (src / "class_02" / "img_00000.jpg").write_bytes(b"junk")
        pack(src, tmp_path / "db.lmdb", progress=False, txn_bytes=1)
    make_image_folder(src, num_classes=3, per_class=5, size=((60, 200), (60, 200)), seed=1)
    with pytest.warns(RuntimeWarning, match="partial pack of another source"):
        result = pack(src, tmp_path / "db.lmdb", progress=False, quality=80)
    assert result.resumed_from == 0 and result.reencoded == 15
    fd = os.open(tmp_path / "x.lmdb.partial.lock", os.O_CREAT | os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        with pytest.raises(RuntimeError, match="another gpufeed pack is writing"):
            pack(src, tmp_path / "x.lmdb", progress=False)
    finally:
        os.close(fd)


def test_refuses_existing_destination_and_bad_options(src, tmp_path):
    (tmp_path / "db.lmdb").mkdir()
    with pytest.raises(FileExistsError, match="already exists"):
        pack(src, tmp_path / "db.lmdb", progress=False)
    with pytest.raises(ValueError, match="`max_side` must be None or an int > 0. Found: 0."):
        pack(src, tmp_path / "x.lmdb", max_side=0)
    with pytest.raises(ValueError, match="`quality` must be None or an int in 1..100. Found: 101."):
        pack(src, tmp_path / "x.lmdb", quality=101)


def test_small_transactions(src, tmp_path):
    pack(src, tmp_path / "db.lmdb", txn_bytes=1, progress=False)  # one sample per transaction
    assert len(LMDBDataset(tmp_path / "db.lmdb")) == 15


def test_map_grows_when_full(tmp_path):
    env = lmdb.open(str(tmp_path / "tiny.lmdb"), map_size=64 << 10)
    items = [(sample_key(i), os.urandom(50_000)) for i in range(40)]  # 2 MB into 64 KB
    _put_all(env, items, append=True)
    assert env.info()["map_size"] >= 2 << 20
    with env.begin() as txn:
        assert txn.get(sample_key(39)) == items[39][1]
    env.close()


def test_incomplete_or_missing_lmdb_is_explained(tmp_path):
    with pytest.raises(FileNotFoundError, match="gpufeed pack SRC_FOLDER"):
        LMDBDataset(tmp_path / "none.lmdb")
    env = lmdb.open(str(tmp_path / "half.lmdb"))
    with env.begin(write=True) as txn:
        txn.put(sample_key(0), b"x")
    env.close()
    with pytest.raises(ValueError, match="not a complete gpufeed LMDB"):
        LMDBDataset(tmp_path / "half.lmdb")
    env = lmdb.open(str(tmp_path / "old.lmdb"))
    with env.begin(write=True) as txn:
        txn.put(META_KEY, json.dumps({"format": "gpufeed-lmdb", "version": 99}).encode())
        txn.put(b"__labels__", b"")
    env.close()
    with pytest.raises(ValueError, match="version 99"):
        LMDBDataset(tmp_path / "old.lmdb")


def test_progress_bar_and_log_fallback(src, tmp_path, capsys, caplog, monkeypatch):
    pack(src, tmp_path / "a.lmdb", progress=True)
    assert "15/15" in capsys.readouterr().err  # tqdm writes to stderr
    monkeypatch.setitem(sys.modules, "tqdm", None)  # as if tqdm were not installed
    with caplog.at_level("INFO", logger="gpufeed.sources.packed"):
        pack(src, tmp_path / "b.lmdb", progress=True)
    assert any("pack: 15/15 images (100%)" in r.getMessage() for r in caplog.records)


# --- CLI ---------------------------------------------------------------------------------------

def test_cli_pack_and_backends(src, tmp_path, capsys):
    assert main(["pack", str(src), str(tmp_path / "db.lmdb"), "--max-side", "64",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "packed 15 images in 3 classes" in out
    assert len(LMDBDataset(tmp_path / "db.lmdb")) == 15
    assert main(["pack", str(src), str(tmp_path / "db.lmdb"), "--no-progress"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["backends"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(backends()))


def test_cli_requires_a_command(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
