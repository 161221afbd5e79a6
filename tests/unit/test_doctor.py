"""gpufeed.doctor's decision on synthetic evidence, the report's shape, and the probe.

Each case sets only the figures that matter; the rest keep Evidence's neutral defaults. Real
loader runs are in tests/integration/test_doctor.py.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import fields, replace

import pytest

import gpufeed.tune
from gpufeed._engine.context import usable_cpus
from gpufeed.doctor._doctor import BOTTLENECKS, Evidence, Report, _evidence, decide, diagnose
from gpufeed.doctor._probe import ProbeResult, TreeProbe, thread_states
from gpufeed.stats import STAGES, Stats

pytestmark = pytest.mark.timeout(60)


def starving(**kw) -> Evidence:
    """A loader that keeps the step waiting 80% of a 10 s run of 100 batches on 4 cores."""
    base = dict(batches=100, wall_s=10.0, wait_s=8.0, step_s=1.5, num_workers=2, usable_cores=4.0,
                image_path=True, samples=6400, queue_capacity=4)
    base.update(kw)
    return Evidence(**base)


def cpu_bound(**kw) -> Evidence:
    """Two workers running flat out (R 95%), no core to spare."""
    base = dict(worker_cpu=(0.97, 0.96), worker_running=0.95, worker_blocked=0.05,
                dstate_fraction=0.0, state_samples=800, idle_cores=0.1, other_cores=2.0)
    base.update(kw)
    return starving(**base)


def test_keeps_up_is_compute_confirmed_by_the_replay():
    ev = starving(wait_s=0.3, step_s=9.6, replay_batches=8, replay_step_s=0.096)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "compute"
    assert "step itself limits" in reasons[-1] and "optimize the model step" in fix


def test_keeps_up_but_the_replay_is_faster_names_contention():
    ev = starving(wait_s=0.3, step_s=9.6, replay_batches=8, replay_step_s=0.05)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "compute"
    assert "2.0x faster" in reasons[-1] and "num_workers=1" in fix


def test_waiting_only_at_epoch_starts_is_compute_with_a_note():
    ev = starving(wait_s=1.0, epoch_starts=4, epoch_start_wait_s=0.8, step_s=8.9,
                  replay_batches=8, replay_step_s=0.09)
    assert ev.steady_wait_fraction == pytest.approx(0.02)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "compute"
    assert "4 epoch starts cost 8% of the run (200 ms each" in reasons[1]
    assert "fewer, longer epochs" in fix
    assert decide(replace(ev, wait_s=2.0))[0] != "compute"  # 12% wait between epochs


def test_cpu_bound_decode_without_spare_cores_is_decode():
    ev = cpu_bound(read_s=1.0, decode_s=15.0, transform_s=3.0, collate_s=0.5, pack_s=0.5)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "decode"
    assert "--max-side 512" in fix and any("decode 75%" in r for r in reasons)


def test_decode_fix_depends_on_the_stored_size_and_the_transform():
    ev = cpu_bound(decode_s=15.0, transform_s=3.0, output_side_px=224, deterministic=True)
    assert "--max-side 512" in decide(replace(ev, stored_short_side_px=1200.0))[2]
    small = decide(replace(ev, stored_short_side_px=360.0))
    assert "already small" in small[2] and "cache_bytes" in small[2]
    assert "stored short side ~360 px" in small[1][-1]
    train = decide(replace(ev, stored_short_side_px=360.0, deterministic=False))[2]
    assert "cache_bytes" not in train and train.startswith("first, free the 2.0 cores other")
    assert not decide(replace(ev, other_cores=0.2))[2].startswith("first")


def test_cpu_bound_transform_dominant_is_transform():
    ev = cpu_bound(read_s=1.0, decode_s=5.0, transform_s=9.0, collate_s=4.0, pack_s=0.5)
    assert decide(ev)[0] == "transform"


def test_a_per_sample_loader_is_never_told_to_shrink_or_cache_decoded_images():
    """Detection/segmentation images keep their annotations: packing them smaller would break
    the boxes, and the per-sample path caches reads, not decoded images."""
    ev = cpu_bound(per_sample=True, read_s=0.3, decode_s=15.0, transform_s=3.0, pack_s=0.2)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "decode" and "--max-side" not in fix and "cache_bytes" not in fix
    assert "baseline" in fix and any("decode 81%, target, joint ops and collate_fn 16%" in r for r in reasons)
    bottleneck, _, fix = decide(replace(ev, decode_s=3.0, transform_s=15.0))
    assert bottleneck == "transform" and "gpufeed.explain(loader)" in fix and "device=" not in fix


def test_a_detection_loader_and_its_subset_are_per_sample(tmp_path):
    from torch.utils.data import Subset

    from gpufeed import CocoDetection, FastLoader
    from gpufeed._synth_coco import make_coco
    from gpufeed.doctor._doctor import _image_info
    from gpufeed.image.detection import DetectionPipeline

    coco = make_coco(tmp_path, 3, seed=1, string_rle_fraction=0.0)
    ds = CocoDetection(coco.root, coco.ann_file, transforms=DetectionPipeline(), target_keys=["boxes"])
    for dataset in (ds, Subset(ds, [0, 2])):
        assert _image_info(FastLoader(dataset, batch_size=2, collate_fn=list)) == {"per_sample": True}


def test_generic_dataset_cpu_bound_is_transform():
    ev = cpu_bound(image_path=False, fetch_s=17.0, collate_s=2.0, pack_s=0.5)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "transform"
    assert any("__getitem__ 87%" in r for r in reasons) and "__getitems__" in fix


def test_cpu_bound_with_idle_cores_is_workers_with_a_count():
    ev = cpu_bound(decode_s=18.0, idle_cores=1.9, other_cores=0.0)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "workers"
    assert "raise num_workers to 4" in fix


def test_num_workers_zero_starving_is_workers():
    ev = starving(num_workers=0, decode_s=7.0, queue_capacity=0)
    bottleneck, _, fix = decide(ev)
    assert bottleneck == "workers" and "num_workers=4" in fix


def test_idle_workers_while_the_step_waits_is_workers():
    ev = starving(decode_s=2.0, worker_cpu=(0.1, 0.1), worker_running=0.1, worker_blocked=0.9,
                  state_samples=800, idle_cores=3.5)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "workers" and "persistent_workers=True" in fix


def test_blocked_workers_reading_is_read_latency():
    ev = starving(read_s=18.0, decode_s=1.0, transform_s=0.5, worker_cpu=(0.05, 0.06),
                  worker_running=0.1, worker_blocked=0.9, dstate_fraction=0.0, state_samples=800,
                  idle_cores=3.8)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "read"
    assert "latency" in reasons[-1] and "raise num_workers to 4" in fix


def test_disk_signs_are_read_with_a_storage_fix():
    ev = starving(read_s=5.0, decode_s=4.0, worker_cpu=(0.3, 0.3), worker_running=0.3,
                  worker_blocked=0.7, dstate_fraction=0.6, state_samples=800, iowait_fraction=0.4)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "read"
    assert "gpufeed pack" in fix and "cache_bytes" in fix and "disk" in reasons[-1]


def test_generic_dataset_blocked_in_getitem_is_read():
    ev = starving(image_path=False, fetch_s=19.0, worker_cpu=(0.05, 0.05), worker_running=0.05,
                  worker_blocked=0.95, state_samples=800)
    assert decide(ev)[0] == "read"


def test_host_to_device_copy_dominating_is_transfer():
    ev = cpu_bound(decode_s=4.0, transform_s=1.0, h2d_s=7.0, worker_running=0.4,
                   worker_cpu=(0.4, 0.4))
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "transfer"
    assert "PCIe" in fix and "70% of the run" in reasons[-1]


def test_without_thread_states_cpu_fractions_decide():
    ev = cpu_bound(decode_s=18.0, worker_running=None, worker_blocked=None, dstate_fraction=None,
                   state_samples=0)
    assert decide(ev)[0] == "decode"


def test_running_share_without_blocked_share_falls_back_to_cpu_fractions():
    # Evidence is public: a hand-built one may carry worker_running alone. decide() and the
    # report used to format and compare the missing worker_blocked (None) and raise TypeError.
    partial = cpu_bound(decode_s=18.0, worker_blocked=None, dstate_fraction=None)
    unsampled = replace(partial, worker_running=None, state_samples=0)
    bottleneck, reasons, fix = decide(partial)
    assert (bottleneck, reasons, fix) == decide(unsampled)
    assert "worker threads" not in str(Report(bottleneck, partial, reasons, fix))


def test_every_verdict_has_short_reasons_and_a_fix():
    cases = [(starving(wait_s=0.1), "compute"), (cpu_bound(decode_s=9.0), "decode"),
             (cpu_bound(transform_s=9.0), "transform"),
             (cpu_bound(decode_s=9.0, idle_cores=2.0), "workers"),
             (starving(num_workers=0), "workers"), (cpu_bound(h2d_s=9.0), "transfer"),
             (starving(read_s=9.0, worker_running=0.1, worker_blocked=0.9, state_samples=10),
              "read"),
             (starving(parent_batches=90, parent_s=0.3), "cache"),
             (starving(num_workers=4, usable_cores=8.0, local_ranks=4, host_workers=16), "host")]
    for ev, expected in cases:
        bottleneck, reasons, fix = decide(ev)
        assert bottleneck == expected and reasons and fix
        assert all(len(r) < 160 for r in reasons)
    assert {expected for _, expected in cases} == set(BOTTLENECKS)


def test_local_ranks_past_the_cores_are_an_oversubscribed_host_whatever_else_holds():
    # 2 ranks x 4 workers + 2 main processes on 2 cores, even with a loader that keeps up
    ev = starving(wait_s=0.1, num_workers=4, usable_cores=2.0, local_ranks=2, host_workers=8)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "host" and "8 gpufeed workers and 2 main processes on 2 usable cores" in reasons[0]
    assert fix.startswith("num_workers=1 per rank for 2 local ranks")
    # 8 ranks x 12 workers on 96 cores: 11 per rank fit
    ev = starving(num_workers=12, usable_cores=96.0, local_ranks=8, host_workers=96)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "host" and "11 per rank fit (8 x (11 + 1) <= 96)" in reasons[1]
    assert "host: 8 local ranks, 96 workers" in str(Report(bottleneck, ev, reasons, fix))
    # at the per-rank count that fits (or the least, 1), or alone on the host: the usual rules
    for fits in (replace(ev, num_workers=11, host_workers=88),
                 starving(num_workers=1, usable_cores=2.0, local_ranks=2, host_workers=2),
                 starving(wait_s=0.1, num_workers=8, usable_cores=2.0)):
        assert decide(fits)[0] != "host"


def test_report_prints_at_most_15_lines_and_dumps_json():
    ev = cpu_bound(decode_s=15.0, transform_s=3.0, replay_batches=8, replay_step_s=0.015,
                   h2d_s=0.4)
    report = Report(*decide(ev)[:1], ev, *decide(ev)[1:])
    text = str(report)
    assert text.splitlines()[0] == "gpufeed doctor: bottleneck = decode"
    assert len(text.splitlines()) <= 15
    data = json.loads(json.dumps(report.to_dict()))
    assert data["bottleneck"] == "decode" and data["evidence"]["data_wait_fraction"] == 0.8
    assert data["evidence"]["shares"]["decode"] == pytest.approx(15 / 18)
    assert replace(ev, decode_s=0.0).stage_total_s == pytest.approx(3.0)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batches=0), "`batches` must be an int >= 1"),
        (dict(step_ms=-1.0), "`step_ms` must be >= 0"),
        (dict(step=lambda b: None, step_ms=5.0), "either `step`"),
        (dict(warmup_batches=-1), "`warmup_batches` must be an int >= 0"),
        (dict(replay_batches=True), "`replay_batches` must be an int >= 0"),
    ],
)
def test_bad_arguments_fail_before_anything_runs(kwargs, message):
    class Untouchable:
        num_workers = 0

        def __iter__(self):
            raise AssertionError("the loader was iterated")

    with pytest.raises(ValueError, match=message):
        diagnose(Untouchable(), **kwargs)


def test_diagnose_runs_any_iterable_loader_and_replays_the_step():
    calls = []

    def step(batch):  # 10 ms per step against a list's next(): the loader keeps up
        calls.append(batch)
        time.sleep(0.01)

    report = diagnose([1, 2, 3], step, batches=5, warmup_batches=1, replay_batches=2)
    # 1 warm-up + 5 measured, epochs rolled over, then the first 2 measured batches replayed
    assert calls == [1, 2, 3, 1, 2, 3, 2, 3]
    assert report.evidence.batches == 5 and report.evidence.replay_batches == 2
    assert report.bottleneck == "compute", str(report)


def test_empty_loader_is_an_error():
    with pytest.raises(ValueError, match="no batches"):
        diagnose([], step_ms=0.0)


def test_probe_accounts_for_the_cores_and_joins_its_thread():
    # /proc gives user and system CPU in whole ticks: a reading is up to two ticks low
    slack_s = 2 / os.sysconf("SC_CLK_TCK")
    outside0 = time.process_time()
    probe = TreeProbe(interval_s=0.01)
    probe.set_workers([])
    probe.start()
    assert any(t.name == "gpufeed-doctor-sampler" for t in threading.enumerate())
    inside0 = time.process_time()
    while time.process_time() < inside0 + 0.3:  # 0.3 CPU seconds, however long the machine takes
        pass
    inside = time.process_time() - inside0
    result = probe.stop()
    outside = time.process_time() - outside0
    assert not any(t.name.startswith("gpufeed-doctor") for t in threading.enumerate())
    cores = (result.system_busy_s + result.system_idle_s + result.system_iowait_s) / result.wall_s
    assert cores == pytest.approx(len(usable_cpus()), rel=0.25)
    # this process's CPU time between start() and stop(), on its own CPU clock (process_time):
    # at least the busy loop, at most what start() and stop() enclose, give or take the ticks
    assert inside - slack_s <= result.main_cpu_s <= outside + slack_s, (inside, result.main_cpu_s, outside)
    assert result.system_busy_s >= 0.8 * result.main_cpu_s


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="no CPU affinity on this platform")
def test_probe_and_tune_count_cores_from_the_same_cgroup_quota(monkeypatch, tmp_path):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # a 4-CPU mask
    monkeypatch.setattr("gpufeed._engine.context._CGROUP", str(tmp_path))  # a fake cgroup v2 root
    (tmp_path / "cpu.max").write_text("150000 100000\n")  # 1.5 cores
    (tmp_path / "cpu.stat").write_text("usage_usec 1000\n")
    probe = TreeProbe(interval_s=0.01)
    probe.set_workers([])
    probe.start()
    result = probe.stop()
    assert result.usable_cores == 1.5 and result.cgroup_spare_s is not None
    assert gpufeed.tune.usable_cores() == 2  # whole cores: ceil(1.5)


def test_evidence_carries_every_stage_of_the_loader_stats():
    before = {key: 1.0 for key in STAGES}
    after = {key: 1.0 + i + 0.5 for i, key in enumerate(STAGES)}
    probe = ProbeResult(wall_s=2.0, usable_cores=2.0, main_cpu_s=0.0, tree_cpu_s=0.0)
    ev = _evidence(None, before, after, probe, batches=1, wall_s=2.0, wait_s=0.0, step_s=0.0,
                   samples=1, replay=(0, None), image_info={}, epochs=(0, 0.0))
    assert [getattr(ev, key) for key in STAGES] == [i + 0.5 for i in range(len(STAGES))]
    assert [f.name for f in fields(Stats) if f.name in STAGES] == list(STAGES)


def test_thread_states_reads_this_process():
    release = threading.Event()
    waiter = threading.Thread(target=release.wait, args=(30,))
    waiter.start()
    try:
        state, in_d = thread_states(os.getpid())
        threads = len(os.listdir(f"/proc/{os.getpid()}/task"))
    finally:
        release.set()
        waiter.join()
    # the main thread runs (R), the waiter sleeps interruptibly (S): neither counts as D
    assert state == "R" and 0 <= in_d <= threads - 2
    with open("/proc/sys/kernel/pid_max") as f:
        no_such_pid = int(f.read()) + 1
    assert thread_states(no_such_pid) == (None, 0)
    assert thread_states(2**22 + 12345) == (None, 0)


def test_one_cpu_figure_per_worker_when_pids_change():
    from gpufeed.doctor._doctor import _per_worker

    # two workers, three iterators (not persistent): six pids, two figures
    cpu = {10: 0.2, 11: 0.4, 20: 0.2, 21: 0.4, 30: 0.2, 31: 0.4}
    ids = {10: 0, 11: 1, 20: 0, 21: 1, 30: 0, 31: 1}
    assert _per_worker(cpu, ids, 2.0) == pytest.approx((0.3, 0.6))


def test_read_latency_names_the_read_concurrency_and_the_setting():
    ev = starving(read_s=18.0, decode_s=1.0, transform_s=0.5, worker_cpu=(0.05, 0.06),
                  worker_running=0.1, worker_blocked=0.9, dstate_fraction=0.0, state_samples=800,
                  idle_cores=3.8, read_concurrency=1)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "read"
    assert any("1 read in flight per worker (the dataset's read_concurrency=1)" in r
               for r in reasons)
    assert "read_concurrency to 16" in fix and "ImageDataset(ds, read_concurrency=N)" in fix

    ev = starving(read_s=18.0, decode_s=1.0, transform_s=0.5, worker_cpu=(0.05, 0.06),
                  worker_running=0.1, worker_blocked=0.9, dstate_fraction=0.0, state_samples=800,
                  idle_cores=3.8, read_concurrency=16, read_budget_bytes=64 << 20)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "read"
    assert any("16 reads in flight per worker (the dataset's read_concurrency=16, at most "
               "64.0 MiB read and not yet decoded (read_budget_bytes=67108864))" in r
               for r in reasons), reasons
    assert "read_concurrency to 64" in fix and "`gpufeed tune` measures" in fix


def reads_of(latency_s: float, rc: int, prefetch_factor: int) -> Evidence:
    """100 batches of 32 from 2 workers blocked on reads of ``latency_s`` each; decoding a
    batch takes a worker 46 ms (the reads left out), as measured in benchmarks/latency.py."""
    return starving(samples=3200, read_s=18.0, decode_s=3.6, transform_s=1.0, worker_cpu=(0.1, 0.1),
                    worker_running=0.1, worker_blocked=0.9, dstate_fraction=0.0, state_samples=800,
                    idle_cores=1.8, read_concurrency=rc, prefetch_factor=prefetch_factor,
                    reads=3200, read_latency_s=3200 * latency_s)


def test_a_read_longer_than_the_decode_of_the_held_tasks_names_prefetch_factor():
    ev = reads_of(0.100, rc=64, prefetch_factor=2)
    assert ev.read_latency_mean_s == pytest.approx(0.1)
    assert ev.decode_per_batch_s == pytest.approx(0.046)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "read"
    # 100 ms / 46 ms per batch x 32 = 70 reads in flight: one task held ahead (32) is too few
    assert any("a read takes 100 ms and a worker decodes a batch in 46 ms: about 70 reads in "
               "flight per worker keep it busy; at prefetch_factor=2 a worker holds 1 task (32 "
               "reads) ahead, whose reads begin only 46 ms before they are needed" in r
               for r in reasons), reasons
    assert "raise prefetch_factor to 4 (now 2" in fix and "read_concurrency to 128" in fix, fix

    bottleneck, reasons, fix = decide(reads_of(0.100, rc=128, prefetch_factor=4))
    assert "prefetch_factor" not in fix and "read_concurrency to" not in fix, fix
    assert "more reads ahead cannot help" in fix


def test_a_read_shorter_than_the_decode_of_the_held_tasks_keeps_prefetch_factor():
    bottleneck, reasons, fix = decide(reads_of(0.030, rc=16, prefetch_factor=2))
    assert bottleneck == "read"
    assert any("about 21 reads in flight per worker" in r for r in reasons), reasons
    assert "read_concurrency to 32" in fix and "prefetch_factor" not in fix, fix


def test_generic_read_latency_names_fetch_threads():
    ev = starving(image_path=False, fetch_s=18.0, collate_s=0.5, worker_cpu=(0.05, 0.06),
                  worker_running=0.1, worker_blocked=0.9, dstate_fraction=0.0, state_samples=800,
                  idle_cores=3.8, fetch_threads=0)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "read"
    assert any("fetch_threads=0" in r for r in reasons) and "fetch_threads=8" in fix


def test_read_verdict_says_when_read_concurrency_is_automatic():
    ev = starving(read_s=18.0, decode_s=1.0, transform_s=0.5, worker_cpu=(0.05, 0.06),
                  worker_running=0.1, worker_blocked=0.9, dstate_fraction=0.0, state_samples=800,
                  idle_cores=3.8, read_concurrency=1, read_auto=True, read_concurrency_max=41)
    bottleneck, reasons, fix = decide(ev)
    assert bottleneck == "read"
    assert any("chosen by each worker, up to 41 so far (the dataset's read_concurrency=None, "
               "auto" in r for r in reasons), reasons
    assert "read_concurrency to 16" in fix  # an explicit value is the setting that lifts it
