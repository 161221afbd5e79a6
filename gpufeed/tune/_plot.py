"""``TuneResult.save_plot``: images/s and memory against ``num_workers`` as a PNG (matplotlib,
optional, imported only here)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

logger = logging.getLogger("gpufeed.tune")


def save_tune_plot(rows: Sequence[Any], recommended_num_workers: int, path: str | os.PathLike) -> bool:
    """Write the rows' images/s and peak PSS against num_workers (a line at the recommended count)
    at ``path``; False (logged) without matplotlib."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("not writing %s: matplotlib is not installed (pip install matplotlib)",
                       os.fspath(path))
        return False
    rows = [r for r in rows if not r.pin_workers]
    fig = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    xs = [r.num_workers for r in rows]
    ax.plot(xs, [r.samples_per_s for r in rows], "o-", color="tab:blue", label="images/s")
    ax.axvline(recommended_num_workers, color="tab:green", linestyle="--",
               label=f"recommended: {recommended_num_workers}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("num_workers")
    ax.set_ylabel("images/s")
    mem_ax = ax.twinx()
    mem_ax.plot(xs, [r.peak_memory_bytes / 2**30 for r in rows], "s:", color="tab:red",
                label="peak PSS (GiB)")
    mem_ax.set_ylabel("peak PSS (GiB)")
    handles = ax.get_legend_handles_labels()
    mem_handles = mem_ax.get_legend_handles_labels()
    ax.legend(handles[0] + mem_handles[0], handles[1] + mem_handles[1], loc="best")
    ax.set_title("gpufeed tune")
    fig.tight_layout()
    fig.savefig(os.fspath(path), format="png", dpi=100)
    return True
