"""gpufeed.sources.pack / LMDBDataset round trips, map growth, failures, and the CLI."""

from __future__ import annotations

import json
import os
import sys
import warnings

import lmdb
import numpy as np
import pytest

from gpufeed.cli import main
from gpufeed.decoders import backends, decode, read_header
from gpufeed.errors import DecodeError, GpufeedWarning
from gpufeed.sources import ImageFolder, LMDBDataset, pack
from gpufeed.sources._pack import _put_all
from gpufeed.sources._packed import META_KEY, sample_key
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
import gpufeed.sources._pack as packed
commits = 0
real_put_all = packed._put_all
def put_all_then_die(env, items, **kwargs):
    global commits
    real_put_all(env, items, **kwargs)
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
    with pytest.warns(GpufeedWarning, match=r"starting .*db.lmdb.partial over: it packs another "
                                            r"--quality \(None; now 80\)"):
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


def _drawn_on_a_terminal(draw) -> str:
    """What ``draw(stream)`` writes to a pseudo-terminal."""
    import pty
    import select

    leader, follower = pty.openpty()
    try:
        with open(follower, "w", closefd=False) as terminal:
            draw(terminal)
            terminal.flush()
        out = b""
        while select.select([leader], [], [], 0.5)[0]:
            out += os.read(leader, 1 << 16)
        return out.decode(errors="replace")
    finally:
        os.close(leader)
        os.close(follower)


@pytest.mark.parametrize("tqdm_installed", [True, False])
def test_progress_bar_is_drawn_on_a_terminal_only(src, tmp_path, capfd, caplog, monkeypatch,
                                                  tqdm_installed):
    from gpufeed._progress import ProgressBar

    if not tqdm_installed:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # the built-in text bar

    def draw(stream):
        bar = ProgressBar(15, True, "pack db", unit="img", stream=stream)
        bar.done(15)
        bar.close()

    assert "/15" in _drawn_on_a_terminal(draw)
    with caplog.at_level("INFO", logger="gpufeed.sources._packed"):
        pack(src, tmp_path / "a.lmdb", progress=True)  # stderr is not a terminal here
    assert "/15" not in capfd.readouterr().err  # never drawn into a pipe
    assert not [r for r in caplog.records if "images (" in r.getMessage()]  # < 5 s: no log line


def truncate(path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_a_truncated_jpeg_is_refused_by_name_and_deleting_it_resumes_the_pack(src, tmp_path):
    bad = src / "class_01" / "img_00002.jpg"
    truncate(bad)  # its header is intact: only a decode finds it
    with pytest.raises(DecodeError) as info:
        pack(src, tmp_path / "db.lmdb", progress=False, txn_bytes=1)
    message = str(info.value)
    assert str(bad) in message and "sample index 7" in message and "Premature end" in message
    assert "Replace or delete the file" in message and "on_error='skip'" in message
    assert "resume at sample 7" in "\n".join(info.value.__notes__)
    bad.unlink()  # the advice followed: the list of files changes after the packed ones
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # it resumes: no warning that it starts over
        result = pack(src, tmp_path / "db.lmdb", progress=False)
    assert (result.resumed_from, result.count, result.skipped) == (7, 14, ())
    pack(src, tmp_path / "fresh.lmdb", progress=False)
    assert lmdb_content(tmp_path / "db.lmdb") == lmdb_content(tmp_path / "fresh.lmdb")


def test_skip_leaves_bad_files_out_counts_them_and_keeps_labels_aligned(src, tmp_path):
    truncate(src / "class_01" / "img_00002.jpg")
    (src / "class_02" / "img_00001.jpg").write_bytes(os.urandom(3000))  # not an image
    with pytest.raises(DecodeError, match="sample index 7"):
        pack(src, tmp_path / "db.lmdb", progress=False, txn_bytes=1)
    result = pack(src, tmp_path / "db.lmdb", progress=False, on_error="skip")  # resumes, skipping
    assert result.resumed_from == 7 and result.count == 13
    assert result.skipped == (os.path.join("class_01", "img_00002.jpg"),
                              os.path.join("class_02", "img_00001.jpg"))
    ds, folder = LMDBDataset(tmp_path / "db.lmdb"), ImageFolder(src)
    assert len(ds) == 13 and ds.meta["skipped"] == list(result.skipped)
    kept = [i for i in range(15) if i not in (7, 11)]
    assert [ds.read(j) for j in range(13)] == [folder.read(i) for i in kept]
    assert list(ds.labels) == [folder.label(i) for i in kept]
    assert ds.describe(12).endswith(f"(packed from {os.path.join('class_02', 'img_00004.jpg')})")


def test_every_truncated_jpeg_is_caught_by_many_pack_threads(tmp_path):
    # PyTurboJPEG reports truncation by a warning; threads decoding at once must not lose one.
    make_image_folder(tmp_path / "src", num_classes=1, per_class=24, size=(64, 80), seed=2)
    files = sorted((tmp_path / "src" / "class_00").iterdir())
    for path in files[::2]:
        truncate(path)
    for attempt in range(3):
        result = pack(tmp_path / "src", tmp_path / f"db{attempt}.lmdb", progress=False,
                      on_error="skip", workers=4)
        assert len(result.skipped) == 12 and result.count == 12


def test_no_verify_stores_a_truncated_jpeg_unchecked(src, tmp_path):
    truncate(src / "class_00" / "img_00001.jpg")
    result = pack(src, tmp_path / "db.lmdb", progress=False, verify=False)
    assert result.count == 15 and not result.verified
    with pytest.raises(ValueError, match="`on_error` must be 'raise' or 'skip'. Found: 'ignore'."):
        pack(src, tmp_path / "x.lmdb", on_error="ignore")


# --- CLI ---------------------------------------------------------------------------------------


def test_cli_pack_names_the_file_and_its_flags_and_skips_with_a_count(src, tmp_path, capsys):
    bad = src / "class_01" / "img_00002.jpg"
    truncate(bad)
    dst = str(tmp_path / "db.lmdb")
    assert main(["pack", str(src), dst, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"gpufeed pack: error: cannot pack {bad} (sample index 7)")
    assert "--on-error skip" in err and "on_error=" not in err and "Traceback" not in err
    assert "\n  the first 7 of 15 files are done in" in err
    assert "run the same pack again to resume at sample 7" in err
    assert main(["pack", str(src), dst, "--quality", "80", "--on-error", "skip",
                 "--no-progress"]) == 0
    captured = capsys.readouterr()
    # another --quality: the partial pack starts over, said in one line (no source line)
    warned = [ln for ln in captured.err.splitlines() if "warning" in ln]
    assert warned == [f"gpufeed pack: warning: starting {dst}.partial over: it packs another "
                      f"--quality (None; now 80)"], captured.err
    assert "packed 14 images in 3 classes" in captured.out
    skipped = os.path.join("class_01", "img_00002.jpg")
    assert f"skipped 1 file that does not decode (--on-error skip): {skipped}" in captured.out
    assert main(["pack", str(src), str(tmp_path / "u.lmdb"), "--no-verify", "--no-progress"]) == 0
    assert "packed 15 images" in capsys.readouterr().out

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
