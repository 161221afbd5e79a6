"""TarShards: shard patterns, the header walk, WebDataset grouping, labels, bad input, caches."""

from __future__ import annotations

import io
import json
import os
import tarfile
import warnings
from pathlib import Path

import cv2
import numpy as np
import pytest

from gpufeed import ResizeCenterCrop, TarShards
from gpufeed.errors import ReadError
from gpufeed.sources._tar_index import expand_braces, expand_urls, split_name
from gpufeed.synth import photo_like


def jpeg(seed: int, size: tuple[int, int] = (40, 56)) -> bytes:
    ok, buf = cv2.imencode(".jpg", photo_like(*size, seed=seed))
    assert ok
    return buf.tobytes()


def write_tar(path: Path, members: list[tuple[str, bytes]], fmt: int = tarfile.PAX_FORMAT) -> None:
    with tarfile.open(path, "w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))


def samples(first: int, n: int, extra: bool = False) -> list[tuple[str, bytes]]:
    out = []
    for i in range(first, first + n):
        out.append((f"d/{i:06d}.jpg", jpeg(i)))
        out.append((f"d/{i:06d}.cls", str(i % 5).encode()))
        if extra:
            out.append((f"d/{i:06d}.json", json.dumps({"y": i * 2}).encode()))
    return out


@pytest.fixture
def shards(tmp_path: Path) -> list[Path]:
    paths = []
    for s in range(3):
        paths.append(tmp_path / f"train-{s:04d}.tar")
        write_tar(paths[-1], samples(10 * s, 4 + s, extra=True))
    return paths


def test_patterns_expand_braces_lists_and_globs(shards: list[Path], tmp_path: Path) -> None:
    assert expand_braces("a-{08..10}.tar") == ["a-08.tar", "a-09.tar", "a-10.tar"]
    assert expand_braces("{x,y}-{1..2}") == ["x-1", "x-2", "y-1", "y-2"]
    as_strings = [str(p) for p in shards]
    assert expand_urls(str(tmp_path / "train-{0000..0002}.tar")) == as_strings
    assert expand_urls(str(tmp_path / "train-*.tar")) == as_strings
    assert expand_urls(shards) == as_strings
    with pytest.raises(FileNotFoundError, match="no tar shard matches"):
        expand_urls(str(tmp_path / "nothing-*.tar"))
    assert split_name("a/b.c/000001.seg.PNG") == ("a/b.c/000001", "seg.png")
    assert split_name("__meta__/x.json") is None and split_name("README") is None


def test_index_groups_by_key_and_reads_by_offset(shards: list[Path]) -> None:
    ds = TarShards([str(p) for p in shards])
    assert len(ds) == 4 + 5 + 6 and ds.report.num_skipped == 0
    assert ds.key(4) == "d/000010" and ds.member(4) == "d/000010.jpg" and ds.shard_of(4) == 1
    for i, first in [(0, 0), (3, 3), (4, 10), (14, 25)]:
        assert bytes(ds.read(i)) == jpeg(first)
        assert ds.label(i) == first % 5
    with tarfile.open(shards[2]) as tf:  # the offsets are tarfile's own
        info = tf.getmember("d/000021.jpg")
    assert ds.describe(10) == f"{shards[2]}:d/000021.jpg (byte offset {info.offset_data})"
    image, label = TarShards(shards[0], transform=ResizeCenterCrop(24))[1]
    assert tuple(image.shape) == (3, 24, 24) and label == 1


def test_long_names_gnu_and_ustar_formats(tmp_path: Path) -> None:
    deep = "x" * 90 + "/" + "y" * 80
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT, tarfile.USTAR_FORMAT):
        path = tmp_path / f"f{fmt}.tar"
        write_tar(path, [(f"{deep}/k1.jpg", jpeg(1)), (f"{deep}/k1.cls", b"7"),
                         ("k2.jpeg", jpeg(2)), ("k2.cls", b"3")], fmt=fmt)
        ds = TarShards(path)
        assert [ds.key(i) for i in range(2)] == [f"{deep}/k1", "k2"]
        assert ds.targets == [7, 3] and bytes(ds.read(0)) == jpeg(1)
    path = tmp_path / "utf8.tar"  # pax records carry non-ASCII names
    write_tar(path, [("фото/ключ.jpg", jpeg(3)), ("фото/ключ.cls", b"2")])
    ds = TarShards(path)
    assert ds.member(0) == "фото/ключ.jpg" and bytes(ds.read(0)) == jpeg(3)


def test_labels_from_a_function_of_small_members_or_none(shards: list[Path]) -> None:
    ds = TarShards(shards, label=lambda s: json.loads(s["json"])["y"])
    assert ds.targets[:4] == [0, 2, 4, 6]
    assert TarShards(shards, label=None).targets == [-1] * len(ds)
    assert TarShards(shards, label="cls", image_extensions=("png", "jpg")).member(0).endswith(".jpg")


@pytest.mark.parametrize(("members", "reason", "match"), [
    ([("a.jpg", b"x"), ("a.cls", b"1"), ("b.txt", b"t"), ("b.cls", b"2")], "no-image",
     r"no image in sample 'b' \(member 'b.txt', header at byte offset 2048\)"),
    ([("a.jpg", b"x"), ("b.jpg", b"y"), ("b.cls", b"2")], "no-label", r"no label in sample 'a'"),
    ([("a.jpg", b"x"), ("a.cls", b"one"), ("b.jpg", b"y"), ("b.cls", b"2")], "bad-label",
     r"holds b'one', not an integer"),
    ([("a.jpg", b"x"), ("a.cls", b"1"), ("b.jpg", b"y"), ("b.cls", b"1"), ("a.jpg", b"z"),
      ("a.cls", b"3")], "duplicate-key", r"duplicate key: sample 'a'.*byte offset 4096"),
])
def test_bad_samples_raise_naming_shard_member_offset_or_are_counted(
        tmp_path: Path, members: list[tuple[str, bytes]], reason: str, match: str) -> None:
    path = tmp_path / "bad.tar"
    write_tar(path, members, fmt=tarfile.USTAR_FORMAT)
    with pytest.raises(ValueError, match=match) as info:
        TarShards(path)
    assert str(path) in str(info.value) and "on_error='skip'" in str(info.value)
    ds = TarShards(path, on_error="skip")
    assert ds.report.skipped == {reason: 1}
    assert len(ds) == (2 if reason == "duplicate-key" else 1)  # the first "a" stays


def test_truncated_shard_and_not_a_tar(tmp_path: Path, shards: list[Path]) -> None:
    data = shards[1].read_bytes()
    with tarfile.open(shards[1]) as tf:
        cut_member = tf.getmember("d/000013.jpg")
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:cut_member.offset_data + 100])
    with pytest.raises(ValueError, match=rf"{cut}.*is truncated: member 'd/000013.jpg' \(header "
                                         rf"at byte offset {cut_member.offset}\)"):
        TarShards(cut)
    kept = TarShards(cut, on_error="skip")
    assert len(kept) == 3 and kept.report.skipped == {"truncated": 1}
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"PK\x03\x04" + bytes(2000))
    with pytest.raises(ValueError, match=rf"{junk}.* is not a tar file"):
        TarShards([junk])
    both = TarShards([junk, shards[0]], on_error="skip")
    assert len(both) == 4 and both.report.skipped == {"not-a-tar": 1}


def test_a_shard_changed_after_indexing_fails_its_reads(tmp_path: Path) -> None:
    path = tmp_path / "s.tar"
    write_tar(path, samples(0, 3))
    ds = TarShards(path)
    assert bytes(ds.read(2)) == jpeg(2)
    stat = path.stat()
    # same size and mtime, another sample at the offsets (renamed, checksums valid)
    data = bytearray(path.read_bytes())
    with tarfile.open(path) as tf:
        headers = [tf.getmember(f"d/000001.{ext}").offset for ext in ("jpg", "cls")]
    for at in headers:
        data[at:at + 8] = b"d/000009"
        data[at + 148:at + 156] = b" " * 8
        data[at + 148:at + 156] = b"%06o\0 " % sum(data[at:at + 512])
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert TarShards(path).key(1) == "d/000009"  # indexed now: the new content
    with pytest.raises(ReadError, match=r"s.tar:d/000001.jpg \(byte offset \d+\) \(sample index "
                                        r"1\): its header names 'd/000009.jpg': the shard changed"):
        ds.read(1)
    for at in headers:
        data[at] = ord("x")  # a damaged header (bad checksum)
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    with pytest.raises(ReadError, match=r"no valid tar header precedes it"):
        ds.read(1)
    write_tar(path, samples(5, 3))  # rewritten: another size or mtime
    stale = TarShards(path.with_name("s.tar"))
    write_tar(path, samples(0, 2))
    with pytest.raises(ReadError, match=r"changed after it was indexed"):
        stale.read(0)


def test_index_cache_reuses_unchanged_shards_and_reindexes_changed_ones(
        tmp_path: Path, shards: list[Path]) -> None:
    cache = tmp_path / "index.npz"
    first = TarShards(shards, index_cache=cache)
    assert cache.exists()
    # an unchanged-looking shard (same size and mtime) is taken from the cache
    stat = shards[0].stat()
    raw = bytearray(shards[0].read_bytes())
    with tarfile.open(shards[0]) as tf:
        cls_at = tf.getmember("d/000001.cls").offset_data
    raw[cls_at] = ord("4")
    shards[0].write_bytes(bytes(raw))
    os.utime(shards[0], ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert TarShards(shards, index_cache=cache).targets == first.targets
    assert TarShards(shards).label(1) == 4  # without the cache: walked again
    write_tar(shards[2], samples(40, 2, extra=True))  # changed: indexed again
    again = TarShards(shards, index_cache=cache)
    assert len(again) == 4 + 5 + 2 and again.key(9) == "d/000040"
    assert TarShards(shards, index_cache=cache, label=None).targets == [-1] * 11  # other options
    cache.write_bytes(b"not an npz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert len(TarShards(shards, index_cache=cache)) == 11
    assert any("not a valid gpufeed-tar-index" in str(w.message) for w in caught)


def test_index_memory_is_flat_arrays(shards: list[Path]) -> None:
    ds = TarShards(shards)
    per_sample = (ds._keys.offsets.nbytes + ds._offsets.nbytes + ds._sizes.nbytes
                  + ds._exts.nbytes + ds._labels.nbytes) / len(ds)
    assert per_sample <= 30
    assert all(isinstance(a, np.ndarray) for a in (ds._offsets, ds._sizes, ds._labels))


def test_bad_arguments_fail_at_construction(shards: list[Path]) -> None:
    with pytest.raises(ValueError, match="`on_error` must be 'raise' or 'skip'"):
        TarShards(shards, on_error="ignore")
    with pytest.raises(TypeError, match="`image_extensions` must be a sequence"):
        TarShards(shards, image_extensions="jpg")
    with pytest.raises(TypeError, match="`label` must be"):
        TarShards(shards, label=3)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        TarShards(str(shards[0]) + ".missing")
    with pytest.raises(ValueError, match="apply to shard URLs"):
        TarShards(shards, storage_options={})


def test_pickled_copy_reads_alike_and_opens_its_own_files(shards: list[Path]) -> None:
    import pickle

    ds = TarShards(shards, label=lambda s: json.loads(s["json"])["y"])  # the function stays behind
    assert bytes(ds.read(5)) == jpeg(11)
    copy = pickle.loads(pickle.dumps(ds))
    assert copy._files is None and copy.targets == ds.targets
    assert bytes(copy.read(5)) == jpeg(11) and copy.describe(5) == ds.describe(5)


def test_names_with_a_leading_dot_group_as_webdataset_groups_them(tmp_path: Path) -> None:
    """A last path component starting with a dot belongs to the key of its directory when the
    component before it has no dot; otherwise (or at the top level) it is passed over."""
    wds = pytest.importorskip("webdataset", reason="webdataset is a dev dependency")
    members = [("d/000001.jpg", jpeg(1)), ("d/000001.cls", b"1"),
               ("e/.jpg", jpeg(2)), ("e/.cls", b"2"), ("e/.hidden.txt", b"x"),  # key "e/"
               (".top.jpg", jpeg(3)), (".top.cls", b"3"),  # passed over
               ("a.b/.jpg", jpeg(4)), ("a.b/.cls", b"4"),  # passed over
               ("x.y/z//.JPG", jpeg(5)), ("x.y/z//.cls", b"5"),  # key "x.y/z//", ext jpg
               ("d/000002.jpg", jpeg(6)), ("d/000002.cls", b"6")]
    write_tar(tmp_path / "dots.tar", members)
    theirs = [s for s in wds.WebDataset(str(tmp_path / "dots.tar"), shardshuffle=False)
              if "jpg" in s and "cls" in s]
    ours = TarShards(str(tmp_path / "dots.tar"))
    assert [s["__key__"] for s in theirs] == ["d/000001", "e/", "x.y/z//", "d/000002"]
    assert [ours.key(i) for i in range(len(ours))] == [s["__key__"] for s in theirs]
    assert ours.targets == [int(s["cls"]) for s in theirs]
    assert [bytes(ours.read(i)) for i in range(len(ours))] == [s["jpg"] for s in theirs]
    for name, _ in members:
        key, ext = wds.tariterators.base_plus_ext(name)
        assert split_name(name) == (None if key is None else (key, ext.lower()))
    assert split_name("e/.hidden.txt") == ("e/", "hidden.txt")
