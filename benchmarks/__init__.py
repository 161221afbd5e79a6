"""gpufeed's benchmarks: pytest-benchmark suites (``test_bench_*.py``) and scripts that each
compare gpufeed with its peer in one run.

The scripts form one package: run them from the repository root as modules, e.g.
``python -m benchmarks.e2e_images``; they share helpers through :mod:`benchmarks._common`
and import each other as ``benchmarks.NAME``.
"""
