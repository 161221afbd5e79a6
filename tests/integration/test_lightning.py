"""FastLoader under the real PyTorch Lightning: 2-process DDP on CPU (gloo), and exact
mid-epoch resume from Lightning's checkpoints after a SIGKILL.

The runs are tests/integration/_lightning_script.py in a subprocess: ``strategy="ddp"`` re-executes
``sys.argv`` for its extra rank. Labels are sample indices, so the runs record what they trained on.
Several runs share a process tree (one import of Lightning each) where that changes nothing they
check: see the fixtures; every resumed run is the first run of a fresh one.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the `lightning` extra is not installed (pip install gpufeed[lightning])")

from tests._concurrent import guarded, unwrap  # noqa: E402
from tests._concurrent import result as run_result  # noqa: E402
from tests._folders import ImageFolders  # noqa: E402

SCRIPT = Path(__file__).with_name("_lightning_script.py")
REPO = Path(__file__).resolve().parents[2]
N = 24  # images: 6 batches of 4 per epoch on one process, 3 per rank on two
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def _image_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ImageFolders(tmp_path_factory)(num_classes=2, per_class=N // 2, size=(48, 56), seed=2)


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _script(*args: str, timeout: float = 150) -> None:
    """One process tree of ``_lightning_script.py``: one run, or several joined by ``+``."""
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=timeout,
                         env=_env(), start_new_session=True)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-4000:]


def _trained(out: Path, rank: int = 0) -> list[tuple[int, list[int]]]:
    """(global_step, sample indices) of each training_step of a run, in order."""
    rows = []
    for line in (out / f"trained-{rank}.txt").read_text().splitlines():
        step, _rank, *indices = map(int, line.split())
        rows.append((step, indices))
    return rows


def _uninterrupted(out: Path) -> dict[int, list[tuple[int, list[int]]]]:
    """Per rank, what an uninterrupted run trained on: 2 whole epochs over all ranks."""
    runs = {int(p.stem.split("-")[1]): _trained(out, int(p.stem.split("-")[1])) for p in out.glob("trained-*.txt")}
    assert sum(len(indices) for rows in runs.values() for _, indices in rows) == 2 * N  # 2 epochs
    return runs


def _ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    """One 2-rank process tree, three runs: ``fit/``, the loader passed to ``trainer.fit`` (also the
    uninterrupted run the DDP resume test compares with, so checkpoints are on); ``hook/``, the
    loader built in ``train_dataloader()``; ``killed/``, the DDP resume test's run, SIGKILLed at
    step 5. Then the killed run resumed by a fresh process tree. Returns (the runs' directory,
    per rank the steps the killed run trained on up to its checkpoint, or what the resume raised)."""
    image_root = _image_root(tmp_path_factory)
    base = tmp_path_factory.mktemp("lightning-ddp")
    for case in ("fit", "hook", "killed"):
        (base / case).mkdir()
    _kill_at(image_root, base / "killed", 5, "--devices", "2",
             first=("resume", str(image_root), str(base / "fit"), "--devices", "2", "+",
                    "hook", str(image_root), str(base / "hook")))
    return base, guarded(functools.partial(_ddp_resume, image_root, base / "killed"))


def _ddp_resume(image_root: Path, out: Path) -> dict[int, list[tuple[int, list[int]]]]:
    before = _trained_up_to_checkpoint(out)
    _script("resume", str(image_root), str(out), "--ckpt", str(out / "ckpt" / "last.ckpt"), "--devices", "2")
    return before


@pytest.fixture(scope="module")
def ddp_runs(side_by_side) -> Path:
    return run_result(side_by_side, "lightning-ddp")[0]


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
@pytest.mark.parametrize("case", ["fit", "hook"])
def test_ddp_two_ranks_get_fastloaders_with_their_options_and_disjoint_complete_epochs(ddp_runs, case):
    """(fit) the loader passed to ``trainer.fit``: Lightning rebuilds it from its attributes;
    (hook) the loader built in ``train_dataloader()``: rebuilt from its recorded arguments."""
    reports = [json.loads((ddp_runs / case / f"rank-{r}.json").read_text()) for r in (0, 1)]
    for rank, report in enumerate(reports):
        assert report["world_size"] == 2 and report["rank"] == rank
        first = report["first"]
        loader = first["loader"]
        assert (loader["type"], loader["module"]) == ("FastLoader", "gpufeed.loader")
        assert loader["sampler"] == "torch.utils.data.distributed.DistributedSampler"  # injected by Lightning
        assert (loader["sampler_rank"], loader["sampler_replicas"], loader["sampler_shuffle"]) == (rank, 2, True)
        assert loader["options"] == {"normalize": [MEAN, STD], "dtype": "torch.float32", "cache_bytes": "64MB",
                                     "seed": 11, "max_batch_bytes": 1 << 22, "shutdown_timeout_s": 4.0,
                                     "on_error": "raise"}
        assert loader["num_workers"] == 1
        # the image path with normalize: float32 around 0, not uint8 0-255
        assert first["dtype"] == "torch.float32" and first["shape"] == [4, 3, 32, 32]
        assert first["min"] < -0.5 and first["max"] < 3.0
        assert report["engine_batches"] == 6  # 2 epochs of 3 batches, all from gpufeed's engine
    for epoch in ("0", "1"):
        a, b = (r["epochs"][epoch] for r in reports)
        assert len(a) == len(b) == N // 2
        assert sorted(a + b) == list(range(N))  # disjoint and complete
    assert reports[0]["epochs"]["0"] != reports[0]["epochs"]["1"]  # set_epoch reached the sampler


def _kill_at(image_root: Path, out: Path, pause_at: int, *extra: str, first: tuple[str, ...] = ()) -> None:
    """Run until step ``pause_at`` (resuming from ``out``'s last.ckpt if there is one), then
    SIGKILL the run: its process group, every rank and worker, no clean-up. ``first``: runs
    (joined by ``+``) that the same process tree completes before this one starts."""
    last = out / "ckpt" / "last.ckpt"
    resume = ("--ckpt", str(last)) if last.exists() else ()
    (out / "paused").unlink(missing_ok=True)
    log = out / f"run-{pause_at}.log"  # a file, not a pipe: a full pipe would stall the run
    with open(log, "wb") as sink:
        run = subprocess.Popen([sys.executable, str(SCRIPT), *first, "+", "resume", str(image_root), str(out),
                                "--pause-at", str(pause_at), *resume, *extra],
                               stdout=sink, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 150 + 60 * sum(arg in ("resume", "hook") for arg in first)  # runs first
        while not (out / "paused").exists():
            assert run.poll() is None, log.read_text()[-4000:]
            assert time.monotonic() < deadline, "the run did not reach its pause step: " + log.read_text()[-2000:]
            time.sleep(0.1)
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait(30)


def _trained_up_to_checkpoint(out: Path) -> dict[int, list[tuple[int, list[int]]]]:
    """Per rank, the steps the killed run trained on before its last checkpoint (the later ones
    are lost with it); the record files are emptied for the next run."""
    import torch

    saved_at = torch.load(out / "ckpt" / "last.ckpt", map_location="cpu", weights_only=False)["global_step"]
    kept = {}
    for path in out.glob("trained-*.txt"):
        rank = int(path.stem.split("-")[1])
        rows = _trained(out, rank)
        assert rows[-1][0] >= saved_at  # it trained past its last checkpoint: those steps are redone
        kept[rank] = [row for row in rows if row[0] < saved_at]
        path.unlink()
    return kept


# The single-process kill-and-resume cases: (pause step, num_workers, sampler)
KILLS = {
    "mid-epoch-with-a-worker": (9, "1", "shuffle"),
    "after-epoch-end-without-workers": (7, "0", "shuffle"),
    "mid-epoch-with-a-sampler-of-the-users": (9, "1", "global"),
}


def _single_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[list, list]]:
    """Per case of ``KILLS``: (the steps the killed run trained on up to its last checkpoint, then
    the resumed run's; the uninterrupted run's). One process per killed run: the first one runs
    every uninterrupted run before its killed run, each later one the previous case's resumed run
    (so every resumed run is the first of a fresh process); the last resumed run has its own."""
    image_root = _image_root(tmp_path_factory)
    base = tmp_path_factory.mktemp("lightning-single")
    root = str(image_root)

    def options(case: str) -> tuple[str, ...]:
        _, workers, sampler = KILLS[case]
        return ("--workers", workers, "--sampler", sampler)

    first: tuple[str, ...] = ()
    for case in KILLS:
        for run in ("full", "killed"):
            (base / case / run).mkdir(parents=True)
        first += ("+", "resume", root, str(base / case / "full"), *options(case))
    kept = {}
    for case, (pause_at, _, _) in KILLS.items():
        out = base / case / "killed"
        _kill_at(image_root, out, pause_at, *options(case), first=first)
        kept[case] = _trained_up_to_checkpoint(out)[0]
        first = ("resume", root, str(out), "--ckpt", str(out / "ckpt" / "last.ckpt"), *options(case))
    _script(*first)
    return {case: (kept[case] + _trained(base / case / "killed"), _uninterrupted(base / case / "full")[0])
            for case in KILLS}


SIDE_BY_SIDE = {"lightning-single": (16.5, _single_runs), "lightning-ddp": (15.4, _ddp_runs)}  # see tests/conftest.py


@pytest.fixture(scope="module")
def single_runs(side_by_side) -> dict[str, tuple[list, list]]:
    return run_result(side_by_side, "lightning-single")


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
@pytest.mark.parametrize("case", list(KILLS))
def test_sigkilled_run_resumes_from_its_last_checkpoint_exactly(single_runs, case):
    """One process, 6 steps/epoch, a checkpoint every 2 steps. Killed at step 9: its last
    checkpoint (step 8) is mid-epoch 1, with the worker holding batches prefetched beyond it.
    Killed at step 7: its last checkpoint (step 6) is right after epoch 0's last batch. The steps
    trained on, the killed run's up to its last checkpoint then the resumed run's, are the
    uninterrupted run's, sample for sample: none lost, none trained twice.

    (One kill per run: Lightning 2.6.6 itself miscounts epoch 1 in a run resumed from an epoch-end
    checkpoint, so a second kill of that run resumes it as a fresh epoch, whatever the loader.)
    A sampler of the user's shuffling with torch's global RNG resumes exactly too.
    """
    resumed, full = single_runs[case]
    assert resumed == full


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_sigkilled_ddp_run_resumes_exactly_with_lightnings_distributed_sampler(side_by_side):
    """2 ranks (3 steps/epoch each), checkpoint at step 4 (mid-epoch 1) by rank 0, holding rank 0's
    loader state, which every rank loads: torch's DistributedSampler's state is rank-free."""
    ddp_runs, resumed = run_result(side_by_side, "lightning-ddp")
    full = _uninterrupted(ddp_runs / "fit")
    out = ddp_runs / "killed"
    before = unwrap(resumed)
    for rank in (0, 1):
        assert before[rank] + _trained(out, rank) == full[rank]
