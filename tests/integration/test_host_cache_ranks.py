"""The host cache shared by the ranks of a job, under torchrun with 2 CPU ranks
(docs/design/host-cache.md): every rank hits from epoch 2, and every rank reports one budget."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpufeed.synth import make_image_folder

from ._torchrun import result, torchrun

pytestmark = [pytest.mark.timeout(180)]


def test_every_rank_hits_the_rows_any_rank_decoded_from_epoch_two(tmp_path):
    root = tmp_path / "images"
    make_image_folder(root, num_classes=2, per_class=24, size=((40, 60), (40, 60)), seed=0)
    ranks = result(torchrun(Path(__file__).with_name("_host_cache_script.py"), str(root)))
    assert len(ranks) == 2
    for rank in ranks:
        assert rank["shared"] == 1 and rank["same"]  # served rows equal an uncached loader's
        assert rank["hit_rates"][1] >= 0.99 and rank["hit_rates"][2] >= 0.99
    assert ranks[0]["budget"] == ranks[1]["budget"] > 0  # "60%" resolved once for the host
    assert ranks[0]["bytes"] == ranks[1]["bytes"] >= 48 * 32 * 32 * 3  # one copy of the rows
