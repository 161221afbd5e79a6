#!/usr/bin/env bash
# `make gpu-check`: every GPU check of gpufeed in one command, in this order:
#   pytest tests/gpu                   the CUDA feed's correctness (bytes, normalize, held batches, teardown)
#   benchmarks/cuda_feed.py            a ResNet-50 training step fed three ways, the feed alone; the goals
#   benchmarks/serve.py --device cuda  ResNet-18 served batch-1 vs DynamicBatcher vs ImageBatcher (goal:
#                                      batched >= 5x batch-1's sustainable QPS)
#   benchmarks/core_scaling.py         the image path at 1, 2, 4, 8, (cores - 1), 16 workers (goal:
#                                      >= 85% efficiency at cores - 1; hyperthreads or not)
# (a later check goes in CHECKS below). Limits 140 + 150 + 150 + 130 s: under 10 minutes on one
# H100/H200, about 7 in practice. GPU_CHECK_ONLY="serve scaling" runs only the checks whose names
# contain one of those words (a rerun of the ones that failed). GPU_CHECK_CPU_DRY_RUN=1 runs, on a
# machine without CUDA, every check's CPU form at tiny sizes (the same scripts and plumbing; no
# figure is a GPU figure): a look at the plumbing before a GPU run.
#
# It runs on the machine's own Python and torch ($GPU_PYTHON; make passes the first of
# /opt/torch/.venv/bin/python3 and python3), offline: no venv, no pip, no index. gpufeed runs from
# this tree (PYTHONPATH); dependencies that Python lacks are unzipped from the wheels in .whl/
# (`make gpu-wheels`) into a private folder, and libturbojpeg from its .deb (else OpenCV decodes).
# Without CUDA it says so in one line and exits 0. With $OUT set (a folder to collect results in)
# the log also goes to $OUT/gpu-check.log and the benchmarks' figures to $OUT/cuda_feed.json,
# $OUT/serve_gpu.json and $OUT/core_scaling.json.
# Exit status: 0 when every check passed (benchmark goals are reported, not enforced), 1 when one
# failed, 2 when the checks could not start.
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
TEST_LIMIT_S=${GPU_CHECK_TEST_TIMEOUT_S:-140}
BENCH_LIMIT_S=${GPU_CHECK_BENCH_TIMEOUT_S:-150}
SERVE_LIMIT_S=${GPU_CHECK_SERVE_TIMEOUT_S:-150}
SCALING_LIMIT_S=${GPU_CHECK_SCALING_TIMEOUT_S:-130}
ONLY=${GPU_CHECK_ONLY:-}
export PYTHONUNBUFFERED=1

# 1. CUDA, or one line and exit 0.
DRY=${GPU_CHECK_CPU_DRY_RUN:-}
if [ -n "$DRY" ] && command -v "$PY" >/dev/null; then
  echo "gpu-check: CPU DRY RUN (GPU_CHECK_CPU_DRY_RUN=1): each check's CPU form at tiny sizes, no GPU figure; python $PY; repo $ROOT"
elif ! command -v "$PY" >/dev/null; then
  echo "gpu-check: skipped, no CUDA here: no Python at $PY (set GPU_PYTHON to one with CUDA torch)"
  exit 0
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
  echo "gpu-check: skipped, no CUDA here ($PY: ${probe:-not found}); run it on a machine with an NVIDIA GPU"
  exit 0
elif [ "$rc" != 0 ]; then
  echo "gpu-check: could not probe CUDA with $PY (exit $rc): $probe"
  exit 2
fi
echo "gpu-check: $probe; python $PY; repo $ROOT"
fi

# 2. Dependencies the device's Python lacks, from the carried wheels (no pip: a wheel is a zip).
missing=$("$PY" -c "import importlib.util as u; print(' '.join(m for m in ('lmdb', 'cachetools', 'turbojpeg') if u.find_spec(m) is None))")
site="$WORK/site"
rm -rf "$site" && mkdir -p "$site" || exit 2
lacking=()
for module in $missing; do
  case $module in
    turbojpeg) pattern='[Pp]y[Tt]urbo[Jj][Pp][Ee][Gg]-*.whl' ;;
    *) pattern="$module-*.whl" ;;
  esac
  wheel=$(ls "$WHEELS"/$pattern 2>/dev/null | head -n 1)
  if [ -z "$wheel" ]; then lacking+=("$module"); continue; fi
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

# 4. The checks: name, time limit (s), command. Each runs even when an earlier one failed.
# Each benchmark bounds itself inside its limit (serve.py --budget-s 120, core_scaling.py 100).
json() { [ -n "${OUT:-}" ] && echo "--json $OUT/$1"; }
CHECKS=(
  "pytest tests/gpu|$TEST_LIMIT_S|$PY -m pytest tests/gpu -q -p no:cacheprovider"
  "benchmarks/cuda_feed.py|$BENCH_LIMIT_S|$PY -m benchmarks.cuda_feed $(json cuda_feed.json)"
  "benchmarks/serve.py|$SERVE_LIMIT_S|$PY -m benchmarks.serve --device cuda --budget-s 120 $(json serve_gpu.json)"
  "benchmarks/core_scaling.py|$SCALING_LIMIT_S|$PY -m benchmarks.core_scaling --budget-s 100 $(json core_scaling.json)"
)
if [ -n "$DRY" ]; then  # the same checks in their CPU form, tiny
  CHECKS=(
    "pytest tests/gpu|$TEST_LIMIT_S|$PY -m pytest tests/gpu -q -p no:cacheprovider"
    "benchmarks/cuda_feed.py|$BENCH_LIMIT_S|$PY -m benchmarks.cuda_feed --cpu-dry-run --data-dir $WORK/cuda-feed-dry $(json cuda_feed.json)"
    "benchmarks/serve.py|$SERVE_LIMIT_S|$PY -m benchmarks.serve --device cpu --models resnet18 --rates 0.5 1 --duration 0.5 --calibrate-s 0.5 --images 8 --max-batch-size 8 --clients 0 --budget-s 60 --stop-after-fails 2 $(json serve_gpu.json)"
    "benchmarks/core_scaling.py|$SCALING_LIMIT_S|$PY -m benchmarks.core_scaling --workers 1,2 --images 24 --dir $WORK/scaling-dry --batch-size 8 --size 64 --resize 72 --seconds 0.5 --rounds 1 $(json core_scaling.json)"
  )
fi
started=$(date +%s)
summary=()
failed=0
for check in "${CHECKS[@]}"; do
  IFS='|' read -r name limit command <<<"$check"
  if [ -n "$ONLY" ]; then
    wanted=0
    for word in $ONLY; do case $name in *"$word"*) wanted=1 ;; esac; done
    [ "$wanted" = 1 ] || continue
  fi
  echo
  echo "gpu-check: == $name (limit ${limit} s) =="
  t0=$(date +%s)
  # shellcheck disable=SC2086 # the command is split into words on purpose
  timeout --kill-after=10 "$limit" $command
  rc=$?
  took=$(($(date +%s) - t0))
  case $rc in
    0) summary+=("$name ok (${took} s)") ;;
    124 | 137) summary+=("$name TIMED OUT after ${limit} s"); failed=1 ;;
    *) summary+=("$name FAILED (exit $rc, ${took} s)"); failed=1 ;;
  esac
done
echo
verdict=$([ "$failed" = 0 ] && echo PASSED || echo FAILED)
echo "gpu-check: $verdict in $(($(date +%s) - started)) s: $(IFS=';'; echo "${summary[*]}" | sed 's/;/; /g')"
exit "$failed"
