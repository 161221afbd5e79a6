"""Tests for the augmentation parameter draws (no scipy): two-sample Kolmogorov-Smirnov for
continuous parameters, chi-square for categories (two samples, one sample against a probability,
or two paired draws against independence), all at a fixed significance of 0.001 (the draws come
from fixed seeds, so a pass or a failure is the same on every run). Needs numpy only:
tests/unit uses it too."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np

ALPHA = 0.001
_Z = 3.090232  # the standard normal's 1 - ALPHA quantile


def ks_statistic(a: Sequence[float], b: Sequence[float]) -> float:
    """The two-sample Kolmogorov-Smirnov distance sup |F_a - F_b|."""
    x, y = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([x, y])
    fa = np.searchsorted(x, grid, side="right") / len(x)
    fb = np.searchsorted(y, grid, side="right") / len(y)
    return float(np.abs(fa - fb).max())


def ks_critical(n: int, m: int) -> float:
    """The asymptotic critical distance at ALPHA: c(alpha) sqrt((n + m) / (n m))."""
    return math.sqrt(-math.log(ALPHA / 2) / 2) * math.sqrt((n + m) / (n * m))


def assert_same_continuous(a: Sequence[float], b: Sequence[float], what: str) -> None:
    d, limit = ks_statistic(a, b), ks_critical(len(a), len(b))
    assert d <= limit, f"{what}: KS distance {d:.4f} > {limit:.4f} (n={len(a)}, m={len(b)})"


def chi2_statistic(a: Sequence[Hashable], b: Sequence[Hashable], min_count: int = 10,
                   ) -> tuple[float, int]:
    """The two-sample chi-square statistic of two samples of categories and its degrees of
    freedom; categories with fewer than ``min_count`` draws in both samples together are pooled."""
    ca, cb = Counter(a), Counter(b)
    na, nb = len(a), len(b)
    cells: list[tuple[int, int]] = []
    rare = [0, 0]
    for key in set(ca) | set(cb):
        x, y = ca.get(key, 0), cb.get(key, 0)
        if x + y < min_count:
            rare[0] += x
            rare[1] += y
        else:
            cells.append((x, y))
    if sum(rare) > 0:
        cells.append((rare[0], rare[1]))
    k1, k2 = math.sqrt(nb / na), math.sqrt(na / nb)
    stat = sum((k1 * x - k2 * y) ** 2 / (x + y) for x, y in cells if x + y > 0)
    return stat, max(1, len(cells) - 1)


def chi2_critical(df: int) -> float:
    """The chi-square quantile 1 - ALPHA (Wilson-Hilferty; within 1% for df >= 1 at this level)."""
    h = 2.0 / (9.0 * df)
    return df * (1.0 - h + _Z * math.sqrt(h)) ** 3


def assert_same_categories(a: Sequence[Hashable], b: Sequence[Hashable], what: str) -> None:
    stat, df = chi2_statistic(a, b)
    limit = chi2_critical(df)
    assert stat <= limit, f"{what}: chi-square {stat:.1f} > {limit:.1f} (df={df})"


def assert_probability(flags: Sequence[bool], p: float, what: str) -> None:
    """The share of True in ``flags`` is ``p`` (one-sample chi-square, 1 degree of freedom)."""
    n, hits = len(flags), sum(bool(f) for f in flags)
    expected = (n * p, n * (1 - p))
    stat = sum((o - e) ** 2 / e for o, e in zip((hits, n - hits), expected))
    limit = chi2_critical(1)
    assert stat <= limit, f"{what}: {hits} of {n} against p={p}: chi-square {stat:.1f} > {limit:.1f}"


def quantile_bins(values: Sequence[float], bins: int) -> list[int]:
    """Each value's bin among ``bins`` bins of about equal counts (cut at the values' own
    quantiles), to make a continuous parameter a category for :func:`assert_independent`."""
    x = np.asarray(values, float)
    cuts = np.quantile(x, np.linspace(0, 1, bins + 1)[1:-1])
    return np.searchsorted(cuts, x, side="right").tolist()


def assert_independent(a: Sequence[Hashable], b: Sequence[Hashable], what: str) -> None:
    """Paired categories ``a[i]``, ``b[i]`` are independent: the chi-square test of the
    contingency table against the product of its margins, (rows - 1)(columns - 1) degrees of
    freedom. Every expected count must be >= 5 (bin coarser otherwise)."""
    assert len(a) == len(b) and len(a) > 0
    rows, cols = sorted(set(a), key=repr), sorted(set(b), key=repr)
    if len(rows) < 2 or len(cols) < 2:
        raise AssertionError(f"{what}: one side has a single category ({rows} x {cols})")
    table = np.zeros((len(rows), len(cols)))
    r, c = {k: i for i, k in enumerate(rows)}, {k: i for i, k in enumerate(cols)}
    for x, y in zip(a, b):
        table[r[x], c[y]] += 1
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / len(a)
    assert expected.min() >= 5, f"{what}: an expected count of {expected.min():.1f} < 5; bin coarser"
    stat = float(((table - expected) ** 2 / expected).sum())
    df = (len(rows) - 1) * (len(cols) - 1)
    limit = chi2_critical(df)
    assert stat <= limit, f"{what}: chi-square {stat:.1f} > {limit:.1f} (df={df}), not independent"
