"""TarShards through FastLoader: the image fast path gives ImageFolder's batches, resumes exactly
across worker counts and world sizes, splits evenly across ranks, skips samples of a changed
shard and corrupt images, caches a second epoch, reads shards over HTTP by ranged requests
(sidecar index or one streaming pass), and goes through ``gpufeed doctor`` and ``gpufeed tune``."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DistributedSampler as TorchDistributedSampler

from gpufeed import (
    DistributedSampler,
    FastLoader,
    ImageFolder,
    RandomResizedCrop,
    ResizeCenterCrop,
    TarShards,
)
from gpufeed.errors import DecodeError, ReadError
from gpufeed.sources import pack_tar
from gpufeed.synth import make_image_folder
from tests._http_server import FileServer

from ._batches import interrupted, same

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("tar-loader")
    make_image_folder(root / "src", num_classes=3, per_class=9, size=(90, 120), seed=6)
    result = pack_tar(root / "src", root / "shards", shard_bytes=30000, progress=False)
    return root, list(result.shards)


@pytest.mark.parametrize("transform", [ResizeCenterCrop(40), RandomResizedCrop(40, seed=3)])
def test_batches_equal_imagefolder_on_the_fast_path(packed: tuple[Path, list[str]],
                                                    transform: Any) -> None:
    root, shards = packed
    kw: dict[str, Any] = dict(batch_size=8, shuffle=True, num_workers=2, seed=4)
    ours = FastLoader(TarShards(shards, transform=transform), **kw,
                      generator=torch.Generator().manual_seed(1))
    theirs = FastLoader(ImageFolder(root / "src", transform=transform), **kw,
                        generator=torch.Generator().manual_seed(1))
    assert same(list(ours), list(theirs))
    assert ours.stats()["images"] == len(ours.dataset)  # the image fast path decoded them


@pytest.mark.parametrize(("before", "after"), [(2, 0), (0, 2)])
def test_resume_is_byte_identical_with_another_worker_count(packed: tuple[Path, list[str]],
                                                            before: int, after: int) -> None:
    _, shards = packed

    def loader(workers: int) -> FastLoader:
        return FastLoader(TarShards(shards, transform=RandomResizedCrop(32)), batch_size=4,
                          shuffle=True, num_workers=workers, seed=7,
                          generator=torch.Generator().manual_seed(5))

    full = list(loader(before))
    head, state = interrupted(loader(before), 2)
    assert same(head, full[:2])
    resumed = loader(after)
    resumed.load_state_dict(state)
    assert same(list(resumed), full[2:])


def test_distributed_sampler_gives_every_rank_the_same_count(packed: tuple[Path, list[str]]) -> None:
    _, shards = packed
    ds = TarShards(shards, transform=ResizeCenterCrop(24))
    counts, seen = [], set()
    for rank in range(4):
        sampler = TorchDistributedSampler(ds, num_replicas=4, rank=rank, shuffle=True, seed=2)
        labels = [y for _, y in FastLoader(ds, batch_size=5, sampler=sampler, num_workers=0)]
        counts.append(sum(len(y) for y in labels))
        seen.update(iter(sampler))
    assert counts == [7] * 4 and seen == set(range(len(ds)))  # 27 samples, padded to 28


def test_samples_of_a_changed_shard_are_skipped_and_counted(tmp_path: Path,
                                                           packed: tuple[Path, list[str]]) -> None:
    _, shards = packed
    copies = []
    for path in shards:
        copies.append(str(tmp_path / Path(path).name))
        Path(copies[-1]).write_bytes(Path(path).read_bytes())
    ds = TarShards(copies, transform=ResizeCenterCrop(24))
    victim = ds.shard_of(len(ds) - 1)
    with open(copies[victim], "ab") as f:
        f.write(bytes(512))  # grown: size differs from the index
    lost = sum(1 for i in range(len(ds)) if ds.shard_of(i) == victim)
    loader = FastLoader(ds, batch_size=6, num_workers=2, on_error="skip")
    assert sum(len(y) for _, y in loader) == len(ds) - lost
    assert loader.stats()["skipped"] == lost
    with pytest.raises(ReadError, match="changed after it was indexed"):
        list(FastLoader(ds, batch_size=6, num_workers=0))


@pytest.mark.parametrize("sidecar", [True, False])
def test_shards_over_http_by_ranged_reads(packed: tuple[Path, list[str]], tmp_path: Path,
                                          sidecar: bool) -> None:
    pytest.importorskip("fsspec", reason="remote shards need fsspec (gpufeed[remote])")
    pytest.importorskip("aiohttp", reason="http(s) URLs need aiohttp (gpufeed[remote])")
    root, shards = packed
    served = tmp_path / "served"
    served.mkdir()
    for path in shards:
        for suffix in ("", ".idx") if sidecar else ("",):
            (served / (Path(path).name + suffix)).write_bytes(Path(path).read_bytes() if not suffix
                                                              else Path(path + suffix).read_bytes())
    local = TarShards(shards, transform=ResizeCenterCrop(32))
    with FileServer(served) as server:
        names = [Path(p).name for p in shards]
        remote = TarShards([f"{server.url}/{n}" for n in names], transform=ResizeCenterCrop(32))
        assert remote.targets == local.targets and remote.key(3) == local.key(3)
        server.reset_counts()
        kw: dict[str, Any] = dict(batch_size=8, num_workers=2)
        assert same(list(FastLoader(remote, **kw)), list(FastLoader(local, **kw)))
        assert server.requests == len(local)  # one ranged request per sample
        urls = [f"{server.url}/{n}" for n in names]
        TarShards(urls, index_cache=tmp_path / "index.npz")
        server.reset_counts()
        cached = TarShards(urls, index_cache=tmp_path / "index.npz")
        assert server.requests == 0 and cached.targets == local.targets  # sizes by HEAD only
    assert not [t for t in threading.enumerate() if t.name == "test-http-server"]
    assert os.path.exists(shards[0] + ".idx")


def samples_of(batches: list[Any]) -> list[tuple[torch.Tensor, int]]:
    return [(x[i], int(y[i])) for x, y in batches for i in range(len(y))]


def same_samples(a: list[tuple[torch.Tensor, int]], b: list[tuple[torch.Tensor, int]]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, p) and y == q for (x, y), (p, q) in zip(a, b))


def test_resume_across_world_sizes_is_byte_identical(packed: tuple[Path, list[str]]) -> None:
    """Two ranks stop after 2 batches each; one rank resumes from rank 0's state with another
    worker count: its rest of the epoch is the uninterrupted one-rank run's, byte for byte."""
    _, shards = packed
    ds = TarShards(shards, transform=RandomResizedCrop(32, seed=3))

    def loader(world: int, rank: int, workers: int) -> FastLoader:
        sampler = DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True, seed=9,
                                     mode="eval")
        out = FastLoader(ds, batch_size=2, sampler=sampler, num_workers=workers)
        out.set_epoch(1)
        return out

    full = samples_of(list(loader(1, 0, 0)))
    heads, states = [], []
    for rank, workers in ((0, 0), (1, 2)):
        head, state = interrupted(loader(2, rank, workers), 2)
        heads.append(samples_of(head))
        states.append(state)
    assert states[0]["sampler"] == states[1]["sampler"]  # a position valid on any world size
    assert same_samples(heads[0], full[0:8:2]) and same_samples(heads[1], full[1:8:2])
    resumed = FastLoader(ds, batch_size=2, num_workers=2,
                         sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True,
                                                    seed=9, mode="eval"))
    resumed.load_state_dict(states[0])
    resumed.set_epoch(1)  # the state's epoch: keeps its position
    assert same_samples(samples_of(list(resumed)), full[8:])


def test_doctor_cli_on_a_glob_of_shards_gives_a_verdict(packed: tuple[Path, list[str]],
                                                        tmp_path: Path, capsys: Any) -> None:
    from gpufeed.cli import main

    _, shards = packed
    out = tmp_path / "doctor.json"
    pattern = str(Path(shards[0]).parent / "*.tar")
    assert main(["doctor", pattern, "--workers", "1", "--batch-size", "4", "--batches", "4",
                 "--step-ms", "150", "--json", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"27 images in {pattern}" in printed and "bottleneck = compute" in printed
    assert json.loads(out.read_text())["bottleneck"] == "compute"


def test_tune_cli_on_a_brace_pattern_of_shards_recommends(packed: tuple[Path, list[str]],
                                                          tmp_path: Path, capsys: Any) -> None:
    from gpufeed.cli import main

    _, shards = packed
    first, last = Path(shards[0]), Path(shards[-1])
    stem, lo = first.stem.rsplit("-", 1)
    hi = last.stem.rsplit("-", 1)[1]
    pattern = f"{first.parent}/{stem}-{{{lo}..{hi}}}.tar"  # shard-{000000..000005}.tar
    out = tmp_path / "tune.json"
    assert main(["tune", pattern, "--max-workers", "1", "--batch-size", "8", "--batches", "2",
                 "--warmup", "1", "--json", str(out), "--no-progress"]) == 0
    assert json.loads(out.read_text())["recommended_num_workers"] == 1
    assert "recommended: FastLoader(dataset, num_workers=1" in capsys.readouterr().out


def test_a_cached_second_epoch_is_all_hits(packed: tuple[Path, list[str]]) -> None:
    _, shards = packed
    ds = TarShards(shards, transform=ResizeCenterCrop(24))
    with FastLoader(ds, batch_size=6, num_workers=2, cache_bytes="16MB") as loader:
        cold = [(x.clone(), y.clone()) for x, y in loader]
        warm = [(x.clone(), y.clone()) for x, y in loader]
        stats = loader.stats()
    assert same(warm, cold)
    assert stats["cache_hits"] == len(ds) and stats["cache_misses"] == len(ds)


def test_a_corrupt_image_member_is_skipped_and_counted(packed: tuple[Path, list[str]],
                                                       tmp_path: Path) -> None:
    _, shards = packed
    ds = TarShards(shards, transform=ResizeCenterCrop(24))
    victim = ds.shard_of(5)
    copies = []
    for path in shards:
        copies.append(str(tmp_path / Path(path).name))
        Path(copies[-1]).write_bytes(Path(path).read_bytes())
    with open(shards[victim], "rb") as f:  # sample 5's image data starts with the JPEG SOI
        data = f.read()
    offset = data.index(ds.read(5)[:64])
    with open(copies[victim], "r+b") as f:
        f.seek(offset)
        f.write(bytes(16))  # not an image any more; same size, same tar header
    broken = TarShards(copies, transform=ResizeCenterCrop(24))
    loader = FastLoader(broken, batch_size=6, num_workers=2, on_error="skip")
    assert sum(len(y) for _, y in loader) == len(ds) - 1
    assert loader.stats()["skipped"] == 1
    with pytest.raises(DecodeError, match=Path(copies[victim]).name):
        list(FastLoader(broken, batch_size=6, num_workers=0))
