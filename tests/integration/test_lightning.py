"""FastLoader under the real PyTorch Lightning (issue 11): 2-process DDP on CPU (gloo), and exact
mid-epoch resume from Lightning's checkpoints after a SIGKILL.

The runs are tests/integration/_lightning_script.py in a subprocess: ``strategy="ddp"`` re-executes
``sys.argv`` for its extra rank. Labels are sample indices, so the runs record what they trained on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("lightning", reason="the `lightning` extra is not installed (pip install gpufeed[lightning])")

from gpufeed.synth import make_image_folder  # noqa: E402

SCRIPT = Path(__file__).with_name("_lightning_script.py")
REPO = Path(__file__).resolve().parents[2]
N = 24  # images: 6 batches of 4 per epoch on one process, 3 per rank on two
MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


@pytest.fixture(scope="module")
def image_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("lightning-images")
    make_image_folder(root, num_classes=2, per_class=N // 2, size=(48, 56), seed=2)
    return root


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}


def _script(*args: str, timeout: float = 150) -> None:
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


@pytest.mark.timeout(240)
@pytest.mark.parametrize("case", ["fit", "hook"])
def test_ddp_two_ranks_get_fastloaders_with_their_options_and_disjoint_complete_epochs(image_root, tmp_path, case):
    """(fit) the loader passed to ``trainer.fit``: Lightning rebuilds it from its attributes;
    (hook) the loader built in ``train_dataloader()``: rebuilt from its recorded arguments."""
    _script("ddp", str(image_root), str(tmp_path), case)
    reports = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
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


def _kill_at(image_root: Path, out: Path, pause_at: int, *extra: str) -> None:
    """Run until step ``pause_at`` (resuming from ``out``'s last.ckpt if there is one), then
    SIGKILL the run: its process group, every rank and worker, no clean-up."""
    last = out / "ckpt" / "last.ckpt"
    resume = ("--ckpt", str(last)) if last.exists() else ()
    (out / "paused").unlink(missing_ok=True)
    log = out / f"run-{pause_at}.log"  # a file, not a pipe: a full pipe would stall the run
    with open(log, "wb") as sink:
        run = subprocess.Popen([sys.executable, str(SCRIPT), "resume", str(image_root), str(out),
                                "--pause-at", str(pause_at), *resume, *extra],
                               stdout=sink, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    try:
        deadline = time.monotonic() + 150
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


def _full_run(image_root: Path, out: Path, *extra: str) -> dict[int, list[tuple[int, list[int]]]]:
    out.mkdir()
    _script("resume", str(image_root), str(out), *extra)
    runs = {int(p.stem.split("-")[1]): _trained(out, int(p.stem.split("-")[1])) for p in out.glob("trained-*.txt")}
    assert sum(len(indices) for rows in runs.values() for _, indices in rows) == 2 * N  # 2 epochs
    return runs


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("pause_at", "workers", "sampler"),
    [(9, "1", "shuffle"), (7, "0", "shuffle"), (9, "1", "global")],
    ids=["mid-epoch-with-a-worker", "after-epoch-end-without-workers", "mid-epoch-with-a-sampler-of-the-users"],
)
def test_sigkilled_run_resumes_from_its_last_checkpoint_exactly(image_root, tmp_path, pause_at, workers, sampler):
    """One process, 6 steps/epoch, a checkpoint every 2 steps. Killed at step 9: its last
    checkpoint (step 8) is mid-epoch 1, with the worker holding batches prefetched beyond it.
    Killed at step 7: its last checkpoint (step 6) is right after epoch 0's last batch. The steps
    trained on, the killed run's up to its last checkpoint then the resumed run's, are the
    uninterrupted run's, sample for sample: none lost, none trained twice.

    (One kill per run: Lightning 2.6.6 itself miscounts epoch 1 in a run resumed from an epoch-end
    checkpoint, so a second kill of that run resumes it as a fresh epoch, whatever the loader.)
    A sampler of the user's shuffling with torch's global RNG (issue 11) resumes exactly too.
    """
    extra = ("--workers", workers, "--sampler", sampler)
    full = _full_run(image_root, tmp_path / "full", *extra)
    out = tmp_path / "killed"
    out.mkdir()
    _kill_at(image_root, out, pause_at, *extra)
    before = _trained_up_to_checkpoint(out)[0]
    _script("resume", str(image_root), str(out), "--ckpt", str(out / "ckpt" / "last.ckpt"), *extra)
    assert before + _trained(out) == full[0]


@pytest.mark.timeout(300)
def test_sigkilled_ddp_run_resumes_exactly_with_lightnings_distributed_sampler(image_root, tmp_path):
    """2 ranks (3 steps/epoch each), checkpoint at step 4 (mid-epoch 1) by rank 0, holding rank 0's
    loader state, which every rank loads: torch's DistributedSampler's state is rank-free."""
    full = _full_run(image_root, tmp_path / "full", "--devices", "2")
    out = tmp_path / "killed"
    out.mkdir()
    _kill_at(image_root, out, 5, "--devices", "2")
    before = _trained_up_to_checkpoint(out)
    _script("resume", str(image_root), str(out), "--ckpt", str(out / "ckpt" / "last.ckpt"), "--devices", "2")
    for rank in (0, 1):
        assert before[rank] + _trained(out, rank) == full[rank]
