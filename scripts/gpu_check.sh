#!/usr/bin/env bash
# `make gpu-check`: every GPU check of gpufeed in one command, in this order:
#   pytest tests/gpu                   the CUDA feed's correctness (bytes, normalize, held batches, teardown)
#   benchmarks/cuda_feed.py            a ResNet-50 training step fed three ways, the feed alone; the goals
#   benchmarks/serve.py --device cuda  ResNet-18 served batch-1 vs DynamicBatcher vs ImageBatcher (goal:
#                                      batched >= 5x batch-1's sustainable QPS)
#   benchmarks/core_scaling.py         the image path at 1, 2, 4, 8, (cores - 1), 16 workers (goal:
#                                      >= 85% efficiency at cores - 1; hyperthreads or not)
# (a later check goes in CHECKS below). The whole check fits 5 minutes: limits 70 + 75 + 75 + 60 s,
# each cut to what is left of TOTAL_LIMIT_S (300); each benchmark bounds itself inside its limit
# with --budget-s and writes the JSON of what it measured even when cut short. Every benchmark runs
# with --require-goals: a goal not met, or not judged, fails its check. It ends with one summary
# table (check, result, figure, goal). GPU_CHECK_ONLY="serve scaling" runs only the checks whose
# names contain one of those words (a rerun of the ones that failed); the verdict then covers only
# those. GPU_CHECK_CPU_DRY_RUN=1 runs, on a machine without CUDA, every check's CPU form at tiny
# sizes (the same scripts and plumbing; no figure is a GPU figure, no goal is judged): a look at the
# plumbing before a GPU run, which says it is a dry run and never exits 0.
#
# It runs on the machine's own Python and torch ($GPU_PYTHON; make passes the first of
# /opt/torch/.venv/bin/python3 and python3), offline: no venv, no pip, no index. gpufeed runs from
# this tree (PYTHONPATH); dependencies that Python lacks are unzipped from the wheels in .whl/
# (`make gpu-wheels`) into a private folder, and libturbojpeg from its .deb (else OpenCV decodes).
# The figures go to $OUT/cuda_feed.json, $OUT/serve_gpu.json, $OUT/core_scaling.json and the tests'
# report to $OUT/tests_gpu.xml ($OUT: a folder to collect results in, where the log also goes, as
# $OUT/gpu-check.log; without $OUT, to $GPU_CHECK_DIR/results).
# Exit status: 0 only when it ran on a CUDA device, every test passed (none skipped) and every
# benchmark goal held; 1 when a check or goal failed; 2 when nothing was checked on a GPU (no CUDA
# device: "no CUDA device: nothing checked"; a CPU dry run; or the checks could not start).
set -uo pipefail
SCRIPT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/$(basename "${BASH_SOURCE[0]}")"
cd "$(dirname "$SCRIPT")/.." || exit 2
ROOT=$PWD

if [ -n "${OUT:-}" ] && [ -z "${GPU_CHECK_TEED:-}" ] && mkdir -p "$OUT" 2>/dev/null; then
  GPU_CHECK_TEED=1 bash "$SCRIPT" "$@" 2>&1 | tee "$OUT/gpu-check.log"
  exit "${PIPESTATUS[0]}"
fi

PY=${GPU_PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x /opt/torch/.venv/bin/python3 ]; then PY=/opt/torch/.venv/bin/python3; else PY=python3; fi
fi
WHEELS=${GPU_CHECK_WHEELS:-$ROOT/.whl}
WORK=${GPU_CHECK_DIR:-${TMPDIR:-/tmp}/gpufeed-gpu-check}
TOTAL_LIMIT_S=${GPU_CHECK_TOTAL_TIMEOUT_S:-300}
TEST_LIMIT_S=${GPU_CHECK_TEST_TIMEOUT_S:-70}
BENCH_LIMIT_S=${GPU_CHECK_BENCH_TIMEOUT_S:-75}
SERVE_LIMIT_S=${GPU_CHECK_SERVE_TIMEOUT_S:-75}
SCALING_LIMIT_S=${GPU_CHECK_SCALING_TIMEOUT_S:-60}
t_start=$(date +%s)
ONLY=${GPU_CHECK_ONLY:-}
export PYTHONUNBUFFERED=1

# 1. CUDA, or one line and exit 2.
DRY=${GPU_CHECK_CPU_DRY_RUN:-}
if [ -n "$DRY" ] && command -v "$PY" >/dev/null; then
  echo "gpu-check: CPU DRY RUN (GPU_CHECK_CPU_DRY_RUN=1): each check's CPU form at tiny sizes, no GPU figure, no goal judged, nothing checked on a GPU; python $PY; repo $ROOT"
elif ! command -v "$PY" >/dev/null; then
  echo "gpu-check: no CUDA device: nothing checked (no Python at $PY; set GPU_PYTHON to one with CUDA torch)"
  exit 2
else
probe=$("$PY" - 2>&1 <<'EOF'
import sys
try:
    import torch
except Exception as exc:  # no torch at all: no GPU check to run here
    print(f"no torch ({type(exc).__name__}: {exc})")
    sys.exit(3)
if not torch.cuda.is_available():
    print(f"torch {torch.__version__} (built with CUDA {torch.version.cuda}) reports torch.cuda.is_available() False")
    sys.exit(3)
p = torch.cuda.get_device_properties(0)
print(f"{p.name} ({p.total_memory / 2**30:.0f} GiB), torch {torch.__version__} (CUDA {torch.version.cuda})")
EOF
)
rc=$?
probe=$(printf '%s\n' "$probe" | tail -n 1)
if [ "$rc" = 3 ] || [ "$rc" = 127 ]; then
  echo "gpu-check: no CUDA device: nothing checked ($PY: ${probe:-not found}); run it on a machine with an NVIDIA GPU"
  exit 2
elif [ "$rc" != 0 ]; then
  echo "gpu-check: could not probe CUDA with $PY (exit $rc): $probe"
  exit 2
fi
echo "gpu-check: $probe; python $PY; repo $ROOT"
fi

# 2. Dependencies the device's Python lacks, from the carried wheels (no pip: a wheel is a zip).
missing=$("$PY" -c "import importlib.util as u; print(' '.join(m for m in ('lmdb', 'cachetools', 'turbojpeg', 'zlib_ng') if u.find_spec(m) is None))")
site="$WORK/site"
rm -rf "$site" && mkdir -p "$site" || exit 2
lacking=()
for module in $missing; do
  case $module in
    turbojpeg) pattern='[Pp]y[Tt]urbo[Jj][Pp][Ee][Gg]-*.whl' ;;
    *) pattern="$module-*.whl" ;;
  esac
  wheel=$(ls "$WHEELS"/$pattern 2>/dev/null | head -n 1)
  # zlib-ng only speeds up mask PNGs (the standard library's zlib inflates them without it)
  if [ -z "$wheel" ]; then [ "$module" = zlib_ng ] || lacking+=("$module"); continue; fi
  "$PY" -m zipfile -e "$wheel" "$site" || { echo "gpu-check: could not unzip $wheel"; exit 2; }
  echo "gpu-check: $module from $(basename "$wheel")"
done
if [ ${#lacking[@]} -gt 0 ]; then
  echo "gpu-check: $PY has no ${lacking[*]} and $WHEELS holds no wheel of it: run \`make gpu-wheels\` where pip reaches PyPI and carry .whl (device run: carry=[\".whl\"])"
  exit 2
fi
export PYTHONPATH="$ROOT:$site${PYTHONPATH:+:$PYTHONPATH}"

# 3. libturbojpeg: the system's, else the carried .deb unpacked into $WORK, else OpenCV decodes.
turbo_probe='from gpufeed.decoders._backends import load_turbojpeg as f; s = f(); print(s.library if s.available else "", end="")'
library=$("$PY" -c "$turbo_probe" 2>/dev/null)
if [ -z "$library" ]; then
  deb=$(ls "$WHEELS"/libturbojpeg0_*.deb 2>/dev/null | head -n 1)
  if [ -n "$deb" ] && command -v dpkg-deb >/dev/null && rm -rf "$WORK/deb" && dpkg-deb -x "$deb" "$WORK/deb"; then
    libdir=$(dirname "$(find "$WORK/deb" -name 'libturbojpeg.so*' | head -n 1)")
    export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    library=$("$PY" -c "$turbo_probe" 2>/dev/null)
  fi
fi
if [ -n "$library" ]; then
  echo "gpu-check: JPEG decode by turbojpeg ($library)"
else
  echo "gpu-check: JPEG decode by OpenCV: no libturbojpeg (carry .whl/libturbojpeg0_*.deb, made by make gpu-wheels)"
fi

# 4. The checks: name, time limit (s), command. Each runs even when an earlier one failed; each
# limit is cut to what is left of TOTAL_LIMIT_S. Each benchmark's --budget-s is its limit less 20 s
# (start-up, the last point, writing its JSON).
RES=${OUT:-$WORK/results}
mkdir -p "$RES" || exit 2
rm -f "$RES"/cuda_feed.json "$RES"/serve_gpu.json "$RES"/core_scaling.json "$RES"/tests_gpu.xml "$RES"/checks.tsv
GOALS="--require-goals"
[ -n "$DRY" ] && GOALS=""  # nothing to judge on CPU figures: the dry run exits 2 whatever they are
CHECKS=(
  "pytest tests/gpu|$TEST_LIMIT_S|$PY -m pytest tests/gpu -q -p no:cacheprovider -rs --junitxml=$RES/tests_gpu.xml"
  "benchmarks/cuda_feed.py|$BENCH_LIMIT_S|$PY -m benchmarks.cuda_feed --budget-s $((BENCH_LIMIT_S - 20)) $GOALS --json $RES/cuda_feed.json"
  "benchmarks/serve.py|$SERVE_LIMIT_S|$PY -m benchmarks.serve --device cuda --budget-s $((SERVE_LIMIT_S - 20)) $GOALS --json $RES/serve_gpu.json"
  "benchmarks/core_scaling.py|$SCALING_LIMIT_S|$PY -m benchmarks.core_scaling --budget-s $((SCALING_LIMIT_S - 20)) $GOALS --json $RES/core_scaling.json"
)
if [ -n "$DRY" ]; then  # the same checks in their CPU form, tiny
  CHECKS=(
    "pytest tests/gpu|$TEST_LIMIT_S|$PY -m pytest tests/gpu -q -p no:cacheprovider -rs --junitxml=$RES/tests_gpu.xml"
    "benchmarks/cuda_feed.py|$BENCH_LIMIT_S|$PY -m benchmarks.cuda_feed --cpu-dry-run --budget-s $((BENCH_LIMIT_S - 20)) --data-dir $WORK/cuda-feed-dry --json $RES/cuda_feed.json"
    "benchmarks/serve.py|$SERVE_LIMIT_S|$PY -m benchmarks.serve --device cpu --models resnet18 --rates 0.5 1 --duration 0.5 --calibrate-s 0.5 --images 8 --max-batch-size 8 --clients 0 --budget-s $((SERVE_LIMIT_S - 20)) --stop-after-fails 2 --json $RES/serve_gpu.json"
    "benchmarks/core_scaling.py|$SCALING_LIMIT_S|$PY -m benchmarks.core_scaling --workers 1,2 --images 24 --dir $WORK/scaling-dry --batch-size 8 --size 64 --resize 72 --seconds 0.5 --rounds 1 --budget-s $((SCALING_LIMIT_S - 20)) --json $RES/core_scaling.json"
  )
fi
failed=0
for check in "${CHECKS[@]}"; do
  IFS='|' read -r name limit command <<<"$check"
  if [ -n "$ONLY" ]; then
    wanted=0
    for word in $ONLY; do case $name in *"$word"*) wanted=1 ;; esac; done
    [ "$wanted" = 1 ] || continue
  fi
  left=$((TOTAL_LIMIT_S - ($(date +%s) - t_start) - 5))
  [ "$left" -lt "$limit" ] && limit=$left
  echo
  if [ "$limit" -le 0 ]; then
    echo "gpu-check: == $name: not run, the ${TOTAL_LIMIT_S} s of the whole check are spent =="
    printf '%s\t%s\t%s\n' "$name" "not run" 0 >>"$RES/checks.tsv"
    failed=1
    continue
  fi
  echo "gpu-check: == $name (limit ${limit} s) =="
  t0=$(date +%s)
  # shellcheck disable=SC2086 # the command is split into words on purpose
  timeout --kill-after=10 "$limit" $command
  rc=$?
  took=$(($(date +%s) - t0))
  case $rc in
    0) result=ok ;;
    124 | 137) result="TIMED OUT after ${limit} s"; failed=1 ;;
    *) result="FAILED (exit $rc)"; failed=1 ;;
  esac
  printf '%s\t%s\t%s\n' "$name" "$result" "$took" >>"$RES/checks.tsv"
done

# 5. One summary table: a row per test run and per benchmark goal, read from the checks' own files.
echo
"$PY" - "$RES" "${DRY:+dry}" <<'SUMMARY'
import json, os, sys
import xml.etree.ElementTree as ET

res, dry = sys.argv[1], len(sys.argv) > 2 and sys.argv[2] == "dry"
rows, bad = [], False
VERDICT = {True: "met", False: "NOT met", None: "not judged"}


def load(name):
    try:
        with open(os.path.join(res, name), encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def row(check, result, figure, goal):
    global bad
    bad |= result not in ("ok", "met")
    rows.append((check, result, figure, goal))


ran = {}
if os.path.exists(os.path.join(res, "checks.tsv")):
    with open(os.path.join(res, "checks.tsv"), encoding="utf-8") as f:
        for line in f:
            name, result, took = line.rstrip("\n").split("\t")
            ran[name] = (result, took)
for name, (result, took) in ran.items():
    if name == "pytest tests/gpu":
        try:
            root = ET.parse(os.path.join(res, "tests_gpu.xml")).getroot()
            suite = root if root.tag == "testsuite" else root[0]
            n, fail, err, skip = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
            fig = f"{n - fail - err - skip} passed, {fail + err} failed, {skip} skipped ({took} s)"
            ok = result == "ok" and n > 0 and fail + err == 0 and skip == 0
        except (OSError, ET.ParseError, IndexError):
            fig, ok = f"no test report ({took} s)", False
        row(name, "ok" if ok else result if result != "ok" else
            "ran (dry run: skips expected)" if dry else "FAILED (skipped or none ran)", fig,
            "every test passes, none skipped")
        continue
    key = {"benchmarks/cuda_feed.py": "cuda_feed.json", "benchmarks/serve.py": "serve_gpu.json",
           "benchmarks/core_scaling.py": "core_scaling.json"}[name]
    data = load(key)
    if data is None:
        row(name, result if result != "ok" else "FAILED", f"no figures written ({took} s)", "every goal met")
        continue
    if key == "cuda_feed.json":
        for g in data.get("goals") or []:
            row("cuda_feed", VERDICT[g["met"]], g["evidence"], g["goal"])
        if not data.get("goals"):
            row(name, "no goal judged", data.get("cut_short") or data.get("timing_source", ""), "every goal met")
    elif key == "serve_gpu.json":
        for m in data:
            h = m.get("headline")
            if not h:
                row(name, "cut short", m.get("cut_short", "?"), "every model measured")
                continue
            fig = ("no sustained batch-1 rate" if h["mode"] is None
                   else f"{h['mode']} {h['ratio']:.2f}x batch-1's sustained QPS")
            row(f"serve {m['model']} ({m['device']})", VERDICT[h["met"]], fig,
                "no goal here" if h["goal"] is None else f">= {h['goal']}x")
    else:
        g = data.get("goal")
        if g is None:
            row(name, "cut short", data.get("cut_short", "?"), "efficiency >= 85% at usable cores - 1")
        else:
            row("core_scaling", VERDICT[g["met"]], f"{g['efficiency']:.0%} at {g['workers']} workers",
                f">= {g['target']:.0%} at usable cores - 1")
    if result != "ok":
        row(name, result, f"after {took} s", "exit 0")
if not rows:
    row("(none)", "nothing ran", "", "every check")
heads = ("check", "result", "figure", "goal")
widths = [max(len(str(r[i])) for r in [heads, *rows]) for i in range(4)]
print("gpu-check summary" + (" (CPU DRY RUN: CPU figures, nothing checked on a GPU)" if dry else "") + ":")
for r in [heads, tuple("-" * w for w in widths), *rows]:
    print("  " + " | ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
sys.exit(1 if bad else 0)
SUMMARY
# a dry run judges its plumbing only (every check ran and exited 0): skips and goals not judged
# are what a CPU gives
[ $? = 0 ] || [ -n "$DRY" ] || failed=1
took=$(($(date +%s) - t_start))
if [ -n "$DRY" ]; then
  if [ "$failed" = 0 ]; then
    echo "gpu-check: CPU DRY RUN, every check's CPU form ran in ${took} s: nothing checked on a GPU (exit 2)"
    exit 2
  fi
  echo "gpu-check: CPU DRY RUN FAILED in ${took} s: nothing checked on a GPU (exit 1)"
  exit 1
fi
echo "gpu-check: $([ "$failed" = 0 ] && echo PASSED || echo FAILED) in ${took} s"
exit "$failed"
