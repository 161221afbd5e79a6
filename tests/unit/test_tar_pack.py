"""Writing tar shards (pack_tar, ``gpufeed pack --format tar``): sizes, sidecars, resuming,
and webdataset reading what gpufeed writes and the other way round."""

from __future__ import annotations

import os
from pathlib import Path

import cv2
import numpy as np
import pytest

from gpufeed import ImageFolder, TarShards
from gpufeed.cli import main
from gpufeed.errors import DecodeError
from gpufeed.sources import pack_tar
from gpufeed.sources._tar_writer import JOB_FILE
from gpufeed.synth import make_image_folder
from tests._folders import ImageFolders


@pytest.fixture(scope="module")
def folder(image_folder: ImageFolders) -> Path:
    return image_folder(num_classes=3, per_class=6, size=(60, 80), seed=2)


def test_shards_hold_the_folder_in_order_near_the_target_size(folder: Path, tmp_path: Path) -> None:
    source = ImageFolder(folder)
    target = 3 * max(len(source.read(i)) for i in range(len(source)))
    result = pack_tar(folder, tmp_path / "out", shard_bytes=target, progress=False)
    assert result.count == len(source) and len(result.shards) > 2
    assert not (tmp_path / "out" / JOB_FILE).exists()
    for path in result.shards[:-1]:
        assert target <= os.path.getsize(path) <= target + 2 * 10240 + target // 2
        assert os.path.exists(path + ".idx")
    ds = TarShards(result.shards)
    assert ds.targets == source.targets
    assert all(bytes(ds.read(i)) == source.read(i) for i in range(len(source)))
    # remote shards are indexed from the sidecars; locally too they describe the same members
    assert ds.key(5) == "000000005" and ds.member(5) == "000000005.jpg"
    again = pack_tar(ds, tmp_path / "again", shard_bytes=10 * target, progress=False)
    resharded = TarShards(again.shards)  # from a dataset: the extension comes from the bytes
    assert len(again.shards) < len(result.shards) and resharded.targets == source.targets
    assert bytes(resharded.read(17)) == source.read(17) and resharded.member(17).endswith(".jpg")


def test_pack_resumes_after_an_interruption_with_the_same_shards(folder: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_image_folder(src, num_classes=3, per_class=6, size=(60, 80), seed=2)
    bad = ImageFolder(src).path(13)
    good = Path(bad).read_bytes()
    Path(bad).write_bytes(b"not an image")
    size = 5000
    with pytest.raises(DecodeError, match=r"cannot pack .* \(sample index 13\)") as info:
        pack_tar(src, tmp_path / "out", shard_bytes=size, max_samples=4, progress=False)
    assert any("shards are complete" in note for note in getattr(info.value, "__notes__", []))
    assert (tmp_path / "out" / JOB_FILE).exists()
    done = sorted(p.name for p in (tmp_path / "out").glob("*.idx"))
    assert len(done) >= 2 and not list((tmp_path / "out").glob("*.partial"))
    Path(bad).write_bytes(good)
    resumed = pack_tar(src, tmp_path / "out", shard_bytes=size, max_samples=4, progress=False)
    assert resumed.resumed_from_shard == len(done) < len(resumed.shards)
    whole = pack_tar(src, tmp_path / "whole", shard_bytes=size, max_samples=4, progress=False)
    assert [Path(p).name for p in resumed.shards] == [Path(p).name for p in whole.shards]
    for a, b in zip(resumed.shards, whole.shards):
        assert Path(a).read_bytes() == Path(b).read_bytes()
    with pytest.raises(FileExistsError, match="already holds shard-"):
        pack_tar(src, tmp_path / "whole", progress=False)


def test_webdataset_reads_what_gpufeed_writes_and_back(folder: Path, tmp_path: Path) -> None:
    wds = pytest.importorskip("webdataset", reason="webdataset is a dev dependency")
    source = ImageFolder(folder)
    ours = pack_tar(source, tmp_path / "ours", shard_bytes=20000, progress=False)
    theirs = list(wds.WebDataset(list(ours.shards), shardshuffle=False))
    assert [int(s["cls"]) for s in theirs] == source.targets
    assert [s["jpg"] for s in theirs] == [source.read(i) for i in range(len(source))]
    (tmp_path / "wds").mkdir()
    with wds.ShardWriter(str(tmp_path / "wds" / "w-%04d.tar"), maxcount=5, verbose=0) as sink:
        for i in range(len(source)):
            sink.write({"__key__": f"sample{i:05d}", "jpg": source.read(i), "cls": source.label(i),
                        "json": {"i": i}})
    back = TarShards(str(tmp_path / "wds" / "w-{0000..0003}.tar"))
    assert back.targets == source.targets and back.key(7) == "sample00007"
    assert bytes(back.read(7)) == source.read(7)
    by_json = TarShards(str(tmp_path / "wds" / "w-*.tar"), label=lambda s: int(s["json"][6:-1]))
    assert by_json.targets == list(range(len(source)))


def test_cli_pack_format_tar(folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "cli"
    assert main(["pack", str(folder), str(out), "--format", "tar", "--shard-mb", "1",
                 "--no-progress", "--max-side", "40"]) == 0
    assert "into 1 tar shards" in capsys.readouterr().out
    ds = TarShards(out / "shard-000000.tar")
    image = cv2.imdecode(np.frombuffer(bytes(ds.read(0)), np.uint8), cv2.IMREAD_COLOR)
    assert max(image.shape[:2]) == 40 and len(ds) == 18


def test_a_truncated_image_fails_the_check_or_is_skipped(tmp_path: Path) -> None:
    src = tmp_path / "src"
    make_image_folder(src, num_classes=2, per_class=4, size=(60, 80), seed=3)
    cut = ImageFolder(src).path(5)
    data = Path(cut).read_bytes()
    Path(cut).write_bytes(data[:len(data) // 2])  # the header is intact, the scan data is not
    with pytest.raises(DecodeError, match=r"cannot pack .* \(sample index 5\)"):
        pack_tar(src, tmp_path / "raise", progress=False)
    result = pack_tar(src, tmp_path / "skip", progress=False, on_error="skip")
    assert len(result.skipped) == 1 and "(sample index 5)" in result.skipped[0]
    ds = TarShards(result.shards)
    assert len(ds) == 7 and "000000005" not in [ds.key(i) for i in range(7)]
    unchecked = pack_tar(src, tmp_path / "unchecked", progress=False, verify=False)
    assert not unchecked.verified and len(TarShards(unchecked.shards)) == 8
