"""``gpufeed bench`` and ``gpufeed demo``: the end-to-end image benchmark on the command line.

::

    gpufeed bench ROOT [--transform eval|train] [--workers N[,N...]] [--batch-size 64]
                  [--batches N] [--rounds 3] [--warmup 1] [--epochs 3] [--json OUT]
                  [--dtype uint8|float32|float16|bfloat16[,...]|all]
                  [--channels-last [on|off|both]] [--no-reference] [--on-error raise|skip]
    gpufeed demo [--dir ./demo-data] [--images 1000] [--batches N] [--rounds 3]

Output goes through :func:`write` (stdout); progress bars go to stderr when it is a terminal.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpufeed._observe.memory import format_bytes
from gpufeed._progress import ProgressBar
from gpufeed.cli._util import add_on_error, write
from gpufeed.cli._util import non_negative_int as _non_negative
from gpufeed.cli._util import positive_int as _positive
from gpufeed.compare._images import (
    CV_NAME,
    DTYPES,
    FAST_NAME,
    LAYOUT_REFERENCE,
    PIL_NAME,
    TRANSFORMS,
    ImageBenchResult,
    Output,
    pil_available,
    run_image_bench,
)
from gpufeed.image._torchvision import UINT8_HINT
from gpufeed.synth import LARGE_SIZE, make_image_folder

__all__ = ["Annotate", "add_bench_parser", "add_demo_parser", "format_report", "format_summary",
           "outputs_of", "prepare_demo_data", "run_bench", "run_demo", "write"]

DEMO_MARKER = ".gpufeed-demo.json"
DEMO_SIZE = ((320, 380), (370, 430))  # (min_h, max_h), (min_w, max_w): ~400x350 photos
DEMO_CLASSES = 10

#: What a script built on ``gpufeed bench`` adds to each comparison (:func:`run_bench`): the lines
#: printed after its report, and the fields added to its entry in the ``--json`` file.
Annotate = Callable[[ImageBenchResult], tuple[list[str], dict[str, Any]]]


# ---------------------------------------------------------------------------------- parsers


def _worker_counts(value: str) -> list[int]:
    counts = [_non_negative(v) for v in value.split(",") if v.strip()]
    if not counts:
        raise argparse.ArgumentTypeError("expected N or N,N,... (e.g. 2 or 1,2,4)")
    return counts


def _dtypes(value: str) -> list[str]:
    names = list(DTYPES) if value.strip() == "all" else [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in DTYPES]
    if bad or not names:
        raise argparse.ArgumentTypeError(f"expected 'all' or a comma list of {', '.join(DTYPES)}")
    return names


def outputs_of(dtypes: list[str], channels_last: str) -> list[Output]:
    """FastLoader's output formats for ``--dtype`` and ``--channels-last`` ("off", "on",
    "both"): every combination, with NCHW float32 (the reference of the ``x f32`` ratios) first
    when any format other than uint8 NCHW is asked for."""
    layouts = {"off": [False], "on": [True], "both": [False, True]}[channels_last]
    outputs = [Output(d, cl) for d in dtypes for cl in layouts]
    if outputs != [Output()]:
        outputs = [LAYOUT_REFERENCE, *(o for o in outputs if o != LAYOUT_REFERENCE)]
    return outputs


def _add_run_options(p: argparse.ArgumentParser, *, rounds: int) -> None:
    p.add_argument("--batch-size", type=_positive, default=64, help="batch size (default 64)")
    p.add_argument("--batches", type=_positive, default=None, metavar="N",
                   help="batches per round (default: the full batches of one epoch, at most 50)")
    p.add_argument("--rounds", type=_positive, default=rounds,
                   help=f"counted rounds per loader, alternating (default {rounds})")
    p.add_argument("--warmup", type=_non_negative, default=1,
                   help="uncounted rounds per loader first (default 1)")
    p.add_argument("--epochs", type=_non_negative, default=3,
                   help="epochs of FastLoader with persistent workers for the memory-flatness "
                        "check (default 3; 0 skips it)")
    p.add_argument("--seed", type=int, default=0, help="sampling and augmentation seed (default 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_bench_parser(sub: Any) -> None:
    """Adds ``bench`` to the ``gpufeed`` subcommands (``sub``: argparse's subparsers)."""
    p = sub.add_parser("bench", help="end-to-end images/s: DataLoader+PIL, DataLoader+OpenCV, "
                                     "FastLoader on one image folder, alternating")
    p.add_argument("root", metavar="ROOT", help="image folder (ROOT/CLASS/IMAGE)")
    p.add_argument("--transform", choices=TRANSFORMS, default="eval",
                   help="eval: Resize(256)+CenterCrop(224); train: RandomResizedCrop(224)+flip "
                        "(default eval)")
    p.add_argument("--workers", type=_worker_counts, default=[2], metavar="N[,N...]",
                   help="num_workers for every loader; a list (1,2,4) runs one comparison per "
                        "value (default 2)")
    p.add_argument("--size", type=_positive, default=224, help="output side in pixels (224)")
    p.add_argument("--resize", type=_positive, default=256,
                   help="eval: shorter side before the centre crop, pixels (256)")
    p.add_argument("--dtype", type=_dtypes, default=["uint8"], metavar="D[,D...]",
                   help="FastLoader output dtype(s): uint8, float32, float16, bfloat16 (float: "
                        "ImageNet-normalized), a comma list or 'all'; one FastLoader per format, "
                        "with NCHW float32 added as the reference of the 'x f32' ratios (default uint8)")
    p.add_argument("--channels-last", nargs="?", const="on", default="off",
                   choices=("off", "on", "both"),
                   help="FastLoader output in channels_last memory format; 'both' runs NCHW and "
                        "channels_last (default off)")
    p.add_argument("--no-reference", action="store_true",
                   help="leave out the DataLoader pipelines (compare FastLoader's formats only)")
    add_on_error(p, "FastLoader (the DataLoader pipelines always raise: with bad files, pass "
                    "--no-reference)")
    _add_run_options(p, rounds=3)
    p.add_argument("--json", metavar="OUT", help="also write every round and the environment here")
    p.set_defaults(run=run_bench)


def add_demo_parser(sub: Any) -> None:
    """Adds ``demo`` to the ``gpufeed`` subcommands."""
    p = sub.add_parser("demo", help="make a demo image folder (once) and run the eval and train "
                                    "benchmarks at num_workers=2 (~1-2 minutes on 2 cores)")
    p.add_argument("--dir", default="demo-data", help="where the demo images live (./demo-data)")
    p.add_argument("--images", type=_positive, default=1000,
                   help=f"number of images, in {DEMO_CLASSES} classes (default 1000)")
    p.add_argument("--workers", type=_non_negative, default=2, help="num_workers (default 2)")
    p.add_argument("--large", action="store_true",
                   help="phone-sized photos (3000x2250 to 4000x3000, quality 95, 2.5-4.5 MB each; "
                        "~2 s per image to make): pass a --dir of its own and fewer --images")
    _add_run_options(p, rounds=4)
    p.set_defaults(run=run_demo, size=224, resize=256, dtype=["uint8"], channels_last="off",
                   no_reference=False, on_error="raise")


# ---------------------------------------------------------------------------------- running

def _progress(total: int, enabled: bool) -> tuple[Callable[[str], None] | None, Callable[[], None]]:
    """(per-round callback, close) for a bar of ``total`` rounds on a terminal; no-ops else."""
    bar = ProgressBar(total, enabled and total > 0, "gpufeed bench", unit="round")
    if not bar.drawn:
        return None, bar.close

    def tick(name: str) -> None:
        bar.start(name)
        bar.done()

    return tick, bar.close


def _run_one(args: argparse.Namespace, root: str, transform: str, workers: int,
             warmup: int | None = None) -> ImageBenchResult:
    warmup = args.warmup if warmup is None else warmup
    outputs = outputs_of(args.dtype, args.channels_last)
    num_loaders = len(outputs) + (0 if args.no_reference else 2 if pil_available() else 1)
    tick, close = _progress(num_loaders * (args.rounds + warmup) + args.epochs, not args.no_progress)
    try:
        return run_image_bench(
            root, transform, num_workers=workers, batch_size=args.batch_size,
            num_batches=args.batches, num_rounds=args.rounds, num_warmup_rounds=warmup,
            num_epochs=args.epochs, seed=args.seed, size=args.size, resize=args.resize,
            on_round=tick, outputs=outputs, include_reference=not args.no_reference,
            on_error=args.on_error)
    finally:
        close()


def run_bench(args: argparse.Namespace, *, annotate: Annotate | None = None) -> int:
    """``gpufeed bench``: one comparison per ``--workers`` value (its table, ratios and memory),
    then the environment. ``annotate``: see :data:`Annotate`."""
    runs = []
    entries = []
    for workers in args.workers:
        run = _run_one(args, args.root, args.transform, workers)
        lines, fields = ([], {}) if annotate is None else annotate(run)
        write("\n".join([format_report(run), *lines, ""]))
        runs.append(run)
        entries.append({**run.to_dict(), **fields})
    write(format_environment(runs[-1].result.environment))
    if args.json:
        payload = {"benchmark": "images", "args": {k: v for k, v in vars(args).items() if k != "run"},
                   "runs": entries}
        Path(args.json).write_text(json.dumps(_finite(payload), indent=2, allow_nan=False),
                                   encoding="utf-8")
        write(f"\nwrote {args.json}")
    return 0


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities (ratios against a zero) replaced by None: strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def prepare_demo_data(directory: str | Path, num_images: int,
                      large: bool = False) -> tuple[Path, int, bool]:
    """The demo image folder: made once with ``gpufeed.synth.make_image_folder`` and reused.
    ``large``: phone-sized photos (``gpufeed.synth.LARGE_SIZE``, JPEG quality 95, 2.5-4.5 MB)
    instead of ~400x350 ones at quality 90.

    Returns (root, number of images, reused). A folder this function made before for another
    ``num_images`` is remade; any other non-empty folder is refused (ValueError).
    """
    root = Path(directory)
    classes = min(DEMO_CLASSES, num_images)
    per_class = num_images // classes
    images = classes * per_class
    size, quality = (LARGE_SIZE, 95) if large else (DEMO_SIZE, 90)
    want: dict[str, Any] = {"images": images, "classes": classes, "size": size, "seed": 0}
    if large:
        want.update(large=True, quality=quality)
    marker = root / DEMO_MARKER
    if marker.exists():
        have = json.loads(marker.read_text(encoding="utf-8"))
        if have.get("params") == json.loads(json.dumps(want)):
            return root, images, True
        for name in have.get("class_dirs", []):  # only what an earlier demo wrote
            shutil.rmtree(root / name, ignore_errors=True)
        marker.unlink()
    elif root.exists() and any(root.iterdir()):
        raise ValueError(f"{root} exists and is not a gpufeed demo folder (no {DEMO_MARKER}); "
                         f"pass --dir with a new or empty folder")
    made = make_image_folder(root, num_classes=classes, per_class=per_class, size=size, seed=0,
                             quality=quality, large=large)
    marker.write_text(json.dumps({"params": want, "class_dirs": list(made.classes)}), encoding="utf-8")
    return root, made.num_images, False


def run_demo(args: argparse.Namespace) -> int:
    """``gpufeed demo``: demo images (once), then the eval and train benchmarks."""
    t0 = time.perf_counter()
    what = "3000x2250-4000x3000, quality 95" if args.large else "~400x350, quality 90"
    write(f"gpufeed demo: photo-like JPEGs ({what}) in {args.dir}")
    root, count, reused = prepare_demo_data(args.dir, args.images, large=args.large)
    write(f"  {'reused' if reused else 'generated'} {count} images in "
          f"{min(DEMO_CLASSES, args.images)} classes ({time.perf_counter() - t0:.1f} s)\n")
    runs: list[ImageBenchResult] = []
    for transform in TRANSFORMS:
        # The eval run's warm-up rounds already warmed the page cache, imports and allocator.
        run = _run_one(args, str(root), transform, args.workers, warmup=0 if runs else None)
        write(format_report(run))
        write("")
        runs.append(run)
    write("summary: " + "; ".join(format_summary(r) for r in runs))
    write(f"output: uint8 [N, 3, 224, 224] batches in every pipeline here. {UINT8_HINT}")
    write(format_environment(runs[-1].result.environment))
    write(f"\n(demo took {time.perf_counter() - t0:.0f} s; rerun with `gpufeed bench {root} "
          f"--transform train` for one benchmark, --rounds for steadier medians)")
    return 0


# ---------------------------------------------------------------------------------- output

def _images_per_s(summary: Any) -> list[float]:
    return [r.samples_per_s for r in summary.rounds]


def format_report(run: ImageBenchResult) -> str:
    """The table (images/s, ratios vs each DataLoader pipeline, start-up, memory), per-round
    ratios, FastLoader's memory across epochs, and notes."""
    res = run.result
    refs = [n for n in (PIL_NAME, CV_NAME) if n in [s.name for s in res.loaders]]
    short = {PIL_NAME: "PIL", CV_NAME: "OpenCV"}
    lines = [f"{run.transform}: {run.num_images} images in {run.root}, {run.geometry}, "
             f"batch {run.batch_size}, num_workers={run.num_workers}, {res.num_batches} batches/round, "
             f"{res.num_rounds} round(s) (+{res.num_warmup_rounds} warm-up) alternating"]
    names = [s.name for s in res.loaders]
    speed_refs = list(refs)
    if LAYOUT_REFERENCE.name in names and sum(n.startswith(FAST_NAME) for n in names) > 1:
        speed_refs.append(LAYOUT_REFERENCE.name)  # the other formats' reference
        short[LAYOUT_REFERENCE.name] = "f32"
    w = max(len("loader"), *(len(s.name) for s in res.loaders))
    ratio_cols = "".join(f" {'x ' + short[r]:>8}" for r in speed_refs)
    mem_cols = "".join(f" {'PSS x ' + short[r]:>12}" for r in refs)
    header = (f"{'loader':<{w}} {'images/s':>9} {'min..max':>11} {'startup':>8} {'w/ start':>9}"
              f"{ratio_cols} {'peak PSS':>10} {'footprint':>10}{mem_cols}")
    lines += [header, "-" * len(header)]
    for s in res.loaders:
        ips = _images_per_s(s)
        total_ips = statistics.median(r.num_samples / r.total_s for r in s.rounds)
        row = (f"{s.name:<{w}} {s.median_samples_per_s:>9.0f} {f'{min(ips):.0f}..{max(ips):.0f}':>11} "
               f"{s.median_startup_s:>7.2f}s {total_ips:>9.0f}")
        row += "".join(f" {res.ratio(s.name, r):>7.2f}x" for r in speed_refs)
        row += f" {format_bytes(s.peak_pss_bytes):>10} {format_bytes(s.peak_footprint_bytes):>10}"
        row += "".join(f" {res.memory_ratio(s.name, r):>11.2f}x" for r in refs)
        lines.append(row)
    lines.append("(images/s: median steady rate, fitted to the batches' arrival times; startup: loader + workers + "
                 "first batch, paid every round; w/ start: images/s including it; memory: peak over "
                 "rounds, summed over the process tree; footprint counts shared memory whole"
                 + ("; x f32: over FastLoader NCHW float32; float output is ImageNet-normalized"
                    if LAYOUT_REFERENCE.name in speed_refs else "") + ")")
    added = ", ".join(f"{s.name} {format_bytes(run.added_pss_bytes(s.name))}" for s in res.loaders
                      if math.isfinite(run.added_pss_bytes(s.name)))
    if added:
        lines.append(f"memory added by the loader (peak PSS - PSS when its round began, median): {added}")
    if FAST_NAME in [s.name for s in res.loaders]:
        for r in refs:
            ratios = res.paired_ratios(FAST_NAME, r)
            paired = ", ".join(f"{x:.2f}" for x in ratios)
            lines.append(f"{FAST_NAME} / {r} per round: {paired} (median {statistics.median(ratios):.2f}); "
                         f"peak footprint {res.footprint_ratio(FAST_NAME, r):.2f}x")
    if run.flatness is not None:
        f = run.flatness
        readings = ", ".join(format_bytes(b) for b in f.pss_bytes)
        how = "persistent workers" if run.num_workers > 0 else "num_workers=0"
        lines.append(f"{f.loader} memory over {len(f.pss_bytes)} epoch(s) of {f.batches_per_epoch} batches "
                     f"({how}): PSS after each {readings}; growth "
                     f"{format_bytes(f.growth_bytes)} ({100 * f.growth_fraction:+.1f}%)")
    lines.extend(f"note: {n}" for n in res.notes)
    if PIL_NAME not in refs and CV_NAME in refs:  # the DataLoader pipelines ran, without PIL
        lines.append(f"note: {PIL_NAME} not measured (Pillow is not installed: "
                     f"pip install 'gpufeed[bench]')")
    return "\n".join(lines)


def format_summary(run: ImageBenchResult) -> str:
    """One transform's figures in a line: images/s of FastLoader and the baseline, their ratio,
    and each one's peak PSS with its ratio."""
    res = run.result
    fast, base = res.summary(FAST_NAME), res.summary(run.baseline)
    return (f"{run.transform} {fast.median_samples_per_s:.0f} vs {base.median_samples_per_s:.0f} "
            f"images/s = {res.ratio(FAST_NAME):.2f}x {run.baseline}, peak PSS "
            f"{format_bytes(fast.peak_pss_bytes)} vs {format_bytes(base.peak_pss_bytes)} = "
            f"{res.memory_ratio(FAST_NAME, run.baseline):.2f}x")


def format_environment(env: dict[str, Any]) -> str:
    """The environment record, one ``key: value`` per line."""
    keys = ("gpufeed", "torch", "numpy", "cv2", "pillow", "python", "cpu_model", "logical_cores",
            "usable_cores", "decoders", "platform")
    lines = ["environment:"]
    lines += [f"  {k}: {env[k]}" for k in keys if k in env]
    return "\n".join(lines)
