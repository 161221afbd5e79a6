# Two entry points (see README): `make demo` and `make test`. Both build .venv from nothing.
# `make docs` builds the docs site into site/ (also run by `make test`).
PYTHON ?= python3
VENV   ?= .venv
# The CPU wheel; pick another build with e.g. `make test TORCH="torch==2.11.0"`. PyPI's torch of
# the same version is a CUDA build (GBs): the CPU build comes from TORCH_INDEX, PyTorch's CPU wheel
# index. A matching wheel already on this machine (pip's find-links, e.g. PIP_FIND_LINKS) is taken
# first, with no index asked (--no-index; torch alone, its small dependencies come with .[dev]);
# only when there is none does pip go to TORCH_INDEX. Another index: `make TORCH_INDEX=URL`.
TORCH  ?= torch==2.13.0
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.gpufeed-installed
# A second venv for tests/torchvision: PyPI's torchvision does not import beside the pinned CPU
# torch, so these tests run on torch 2.14.1 + torchvision 0.29.1 (a CUDA build, ~5.7 GB, that
# runs on the CPU; about 75 s to install here from local files). See docs/getting-started.md, "The two commands of a clone".
TV_VENV  ?= .venv-tv
TV_TORCH ?= torch==2.14.1 torchvision==0.29.1
# The detection benchmarks' peers (benchmarks/detection.py, tests/torchvision/test_bench_detection.py):
# pycocotools (torchvision's COCO masks) and Albumentations 2.0.8 (MIT; a peer only, never a gpufeed
# dependency). Neither changes the torch, torchvision or numpy pinned above.
TV_PEERS ?= pycocotools albumentations==2.0.8
TV_STAMP := $(TV_VENV)/.gpufeed-installed

.PHONY: demo test lint docs bench sysdeps clean gpu-check gpu-wheels package-check

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --no-index --no-deps "$(TORCH)" 2>/dev/null \
	  || $(BIN)/python -m pip install -q --index-url "$(TORCH_INDEX)" "$(TORCH)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

$(TV_STAMP): pyproject.toml
	$(PYTHON) -m venv $(TV_VENV)
	$(TV_VENV)/bin/python -m pip install -q $(TV_TORCH)
	$(TV_VENV)/bin/python -m pip install -q -e ".[tvtest]" $(TV_PEERS)
	touch $@

# libturbojpeg is a system library; without it gpufeed decodes with OpenCV (and says so once).
sysdeps:
	@if ldconfig -p 2>/dev/null | grep -q libturbojpeg; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && apt-get install -y -qq libturbojpeg0 >/dev/null) \
	    || echo "note: could not install libturbojpeg0; gpufeed will use OpenCV"; \
	else echo "note: libturbojpeg not found (Debian: apt-get install libturbojpeg0); gpufeed will use OpenCV"; fi

demo: sysdeps $(STAMP)
	$(BIN)/python -m gpufeed demo

# The API reference (docstrings) and docs/ pages; --strict makes every warning an error.
# No -q: with --quiet, mkdocs 1.6 drops warnings before strict mode counts them.
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict

# Lint and import order (ruff), types (mypy: check_untyped_defs, strict on gpufeed._engine),
# the layers of docs/design/layers.md (lint-imports, [tool.importlinter] in pyproject.toml), and no
# import cycle between modules or sibling packages (scripts/check_cycles.py, with grimp).
lint: $(STAMP)
	$(BIN)/python -m ruff check gpufeed
	$(BIN)/python -m mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_cycles.py

# The package as a user gets it: build the sdist and, from it, the wheel into dist/ (isolated
# builds, as pip does); install the wheel with $(TORCH) into a fresh venv ($(PKG_VENV), made anew
# every time) and run scripts/package_smoke.py there, outside the tree: import, LICENSE in the
# dist-info, `gpufeed --version`, one FastLoader epoch. The venv has no pip of its own (.venv's pip
# installs into it with --python: ensurepip would cost more than the rest of the venv); $(TORCH) as
# for .venv (a local wheel first, else TORCH_INDEX), then the wheel with the rest of the
# dependencies; wheels from pip's cache, and --no-compile (byte-compiling torch is most of an
# install's time).
PKG_VENV ?= .venv-pkg
PKG_PIP = $(BIN)/python -m pip --python $(PKG_VENV)/bin/python install -q --no-compile
package-check: $(STAMP)
	rm -rf dist $(PKG_VENV)
	$(BIN)/python -m build -q --outdir dist .
	$(PYTHON) -m venv --without-pip $(PKG_VENV)
	$(PKG_PIP) --no-index --no-deps "$(TORCH)" 2>/dev/null \
	  || $(PKG_PIP) --index-url "$(TORCH_INDEX)" "$(TORCH)"
	$(PKG_PIP) dist/gpufeed-*.whl
	cd $(PKG_VENV) && env -u PYTHONPATH bin/python "$(CURDIR)/scripts/package_smoke.py"

# The whole suite in .venv (tests/torchvision skips there, saying why), with the tests of the
# project's benchmark goals (benchmarks/test_goals.py: plain tests, which `make bench`'s
# --benchmark-only skips), then tests/torchvision with real torchvision in .venv-tv.
test: sysdeps $(STAMP) $(TV_STAMP) lint docs package-check
	$(BIN)/python -m pytest tests benchmarks/test_goals.py
	$(TV_VENV)/bin/python -m pytest tests/torchvision

# The pytest-benchmark suites, then the tests marked perf (speed ratios, memory figures), which
# the default test run leaves out; -raP prints the figures they measured. Ends with a short
# summary of the benchmarks (scripts/bench_summary.py).
bench: sysdeps $(STAMP)
	mkdir -p .benchmarks
	$(BIN)/python -m pytest benchmarks --benchmark-only --benchmark-json=.benchmarks/last.json
	$(BIN)/python -m pytest -m perf -raP tests
	$(BIN)/python scripts/bench_summary.py .benchmarks/last.json

# Every GPU check (pytest tests/gpu, benchmarks/cuda_feed.py, serve.py --device cuda,
# core_scaling.py), on this machine's own Python and torch, offline: no venv, no pip. Without
# CUDA: one line, exit 0. See docs/gpu-feed.md, "The GPU check".
GPU_PYTHON ?= $(firstword $(wildcard /opt/torch/.venv/bin/python3) python3)
gpu-check:
	@GPU_PYTHON="$(GPU_PYTHON)" bash scripts/gpu_check.sh

# What gpu-check carries to an offline GPU machine, into .whl/ (needs PyPI and apt-get here).
gpu-wheels:
	PYTHON="$(PYTHON)" bash scripts/gpu_wheels.sh

clean:
	rm -rf $(VENV) $(TV_VENV) $(PKG_VENV) build dist site *.egg-info .pytest_cache .benchmarks
