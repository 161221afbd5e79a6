"""What the user reads: the command line's flags, errors and notes, in this process."""

from __future__ import annotations

import warnings

import pytest
import torch

from gpufeed import FastLoader

# --- the command line's flags and wording -------------------------------------------------------


@pytest.mark.parametrize("command", ["pack", "bench", "doctor", "tune"])
def test_every_command_that_loads_images_offers_on_error(command, capsys):
    from gpufeed.cli import main

    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert "--on-error {raise,skip}" in capsys.readouterr().out


@pytest.fixture
def folder_with_a_truncated_jpeg(tmp_path):
    from gpufeed.synth import make_image_folder

    make_image_folder(tmp_path / "src", num_classes=2, per_class=3, size=(40, 48), seed=3)
    bad = tmp_path / "src" / "class_01" / "img_00001.jpg"
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    return tmp_path / "src", bad


@pytest.mark.timeout(120)
def test_a_loader_error_under_the_cli_names_the_file_and_the_flag(folder_with_a_truncated_jpeg,
                                                                  capsys):
    from gpufeed.cli import main

    root, bad = folder_with_a_truncated_jpeg
    argv = ["doctor", str(root), "--workers", "0", "--batch-size", "2", "--batches", "2",
            "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpufeed doctor: error: cannot decode ") and str(bad) in err
    assert "pass --on-error skip to leave bad samples out" in err and "on_error=" not in err
    assert main([*argv, "--on-error", "skip"]) == 0
    assert "gpufeed doctor: 6 images" in capsys.readouterr().out


def test_tune_says_why_in_plain_words_and_sizes_in_units():
    from dataclasses import replace

    from gpufeed.cache import parse_cache_bytes
    from gpufeed.cli.tune import format_recommendation
    from gpufeed.tune import TuneRow, tune

    def measure(num_workers, pin_workers):
        return TuneRow(num_workers=num_workers, pin_workers=pin_workers,
                       samples_per_s={1: 100.0, 2: 102.0}[num_workers], cpu_percent=100.0,
                       peak_memory_bytes=400 << 20, memory_per_worker_bytes=50 << 20,
                       data_wait_fraction=0.9)

    result = tune(measure_fn=measure, max_workers=2, progress=False, available_memory_bytes=8 << 30)
    text = format_recommendation(replace(result, recommended_cache_bytes=45158400))
    assert "num_workers=1" in text and 'cache_bytes="43.1 MiB"' in text
    assert abs(parse_cache_bytes("43.1 MiB") - 45158400) < 1 << 20  # the value given still parses
    assert ("2 workers: 102 images/s, +2.0% over 1 worker, less than the 5% a step must gain: "
            "throughput stopped rising after 1 worker; recommending 1") in text
    assert "knee" not in text and "backing off" not in text


@pytest.mark.timeout(60)
def test_a_callable_transform_is_announced_once(tmp_path):
    from gpufeed import GpufeedWarning, ImageFolder
    from gpufeed.synth import make_image_folder

    make_image_folder(tmp_path / "src", num_classes=1, per_class=2, size=(16, 16), seed=0)

    def to_tensor(img):
        return torch.zeros(3)

    ds = ImageFolder(tmp_path / "src", transform=to_tensor)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # not Python's once per place: once per loader is ours
        with FastLoader(ds, batch_size=2, num_workers=0) as loader:
            assert len(list(loader)) == 1
            assert len(list(loader)) == 1
    said = [str(w.message) for w in caught if issubclass(w.category, GpufeedWarning)]
    assert len(said) == 1 and "generic path" in said[0], said


def test_option_errors_and_explain_read_as_sentences():
    from gpufeed import ResizeCenterCrop, explain

    ds = torch.utils.data.TensorDataset(torch.arange(4))
    with pytest.raises(ValueError, match="`on_error` only applies to the image fast path"):
        FastLoader(ds, batch_size=2, on_error="skip")
    with pytest.raises(ValueError, match="`on_error`, `seed` only apply to the image fast path"):
        FastLoader(ds, batch_size=2, on_error="skip", seed=1)
    text = explain(ResizeCenterCrop(224, 256))
    assert "FastLoader's batches are uint8 0-255 by default" in text and "dtype=torch.float32" in text
