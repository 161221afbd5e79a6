"""The int-label image path, held byte for byte: blake2b digests of two epochs of every batch.

The safety net of the sample model's stages (docs/design/sample-model.md, section 8): a change
that moves code under the image path (the slot layout, the targets' route) must keep the bytes
of every batch of an ``ImageFolder`` with int labels, its images and labels, their dtype, shape
and strides. The digests below were recorded against the code before any of those stages.

A digest holds only where the recorded pixels can be made again: the same JPEG files (the
generated files' digest), the same decoder, OpenCV and torch CPU kernels. Elsewhere the test is
skipped, saying which of these differ; ``python -m tests.integration.test_golden_digests ROOT``
prints the table for the environment it runs in (record it only from code known to be right).
"""

from __future__ import annotations

import hashlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from gpufeed import FastLoader, ImageFolder, RandomResizedCrop, ResizeCenterCrop
from gpufeed.image.augment import ColorJitter, RandomErasing

pytestmark = pytest.mark.timeout(300)

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
BATCH = 8  # 30 images: three full batches and a partial one of 6
TRANSFORMS = {  # (float output) -> transform; float ops run on float outputs only
    "eval": lambda floats: ResizeCenterCrop(96, 112),
    "train": lambda floats: RandomResizedCrop(80, ops=(ColorJitter(0.4, 0.4, 0.4),),
                                              float_ops=(RandomErasing(0.5),) if floats else ()),
}
OUTPUTS: dict[str, dict[str, Any]] = {
    "uint8": {},
    "float32": {"normalize": (MEAN, STD)},
    "float32-channels_last": {"normalize": (MEAN, STD), "channels_last": True},
}

# What the digests need to be made again: see the module docstring.
ENVIRONMENT = {
    "files": "d471bf48ed26af50a442dafbc238cbf1",
    "decoder": "turbojpeg libturbojpeg.so.0.2.0",
    "opencv": "5.1.0",
    "torch": "2.13.0+cpu AVX512",
}
DIGESTS = {
    ("eval", "uint8"): "a4469758d108d86147c4e4146893dfce",
    ("eval", "float32"): "4731ffd34e2059de11fe68b71dfe9d8b",
    ("eval", "float32-channels_last"): "6bfcaca9953df7a94d5fd0634d5ba49d",
    ("train", "uint8"): "bc976c8030e78380f277d15dd57d3b2b",
    ("train", "float32"): "8eaee84fec38a9c61016a9804028d85b",
    ("train", "float32-channels_last"): "0a43952e9bae2bcc22b4956d13fbaee6",
}


def make_root(root: Path) -> Path:
    from gpufeed.synth import make_image_folder

    make_image_folder(root, num_classes=3, per_class=10, size=((230, 300), (250, 380)), seed=29)
    return root


def environment(root: Path) -> dict[str, str]:
    """What the recorded digests depend on besides gpufeed's code, in this process."""
    import cv2

    from gpufeed.decoders._backends import jpeg_backend, turbo_state

    files = hashlib.blake2b(digest_size=16)
    for path in sorted(root.rglob("*.jpg")):
        files.update(path.relative_to(root).as_posix().encode())
        files.update(path.read_bytes())
    decoder = jpeg_backend(None)
    if decoder == "turbojpeg":
        decoder += f" {Path(turbo_state().library or '').name}"
    return {"files": files.hexdigest(), "decoder": decoder, "opencv": cv2.__version__,
            "torch": f"{torch.__version__} {torch.backends.cpu.get_cpu_capability()}"}


def _update(digest: Any, t: torch.Tensor) -> None:
    digest.update(f"{t.dtype}|{tuple(t.shape)}|{t.stride()}|".encode())
    digest.update(t.numpy().tobytes())


def batches_digest(loader: FastLoader, epochs: int = 2) -> str:
    digest = hashlib.blake2b(digest_size=16)
    for epoch in range(epochs):
        digest.update(f"epoch {epoch}|".encode())
        for images, labels in loader:
            _update(digest, images)
            _update(digest, labels)
    return digest.hexdigest()


def run(root: Path, transform: str, output: str, workers: int, cache: bool = False) -> str:
    """Workers are not persistent: as under DataLoader, persistent workers skip the generator
    draw of a new iterator, so a shuffled second epoch's order differs from ``num_workers=0``'s."""
    dataset = ImageFolder(root, transform=TRANSFORMS[transform](output != "uint8"))
    generator = torch.Generator().manual_seed(5)
    with FastLoader(dataset, batch_size=BATCH, shuffle=transform == "train", generator=generator,
                    num_workers=workers, seed=17,
                    cache_bytes="64MB" if cache else None, cache_scope="rank",
                    **OUTPUTS[output]) as loader:
        return batches_digest(loader)


def cases() -> Iterator[tuple[str, str]]:
    for transform in TRANSFORMS:
        for output in OUTPUTS:
            yield transform, output


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = make_root(tmp_path_factory.mktemp("golden") / "images")
    found = environment(root)
    differ = [f"{key}: recorded {ENVIRONMENT[key]}, here {found[key]}" for key in ENVIRONMENT
              if found[key] != ENVIRONMENT[key]]
    if differ:
        pytest.skip("the golden digests were recorded where " + "; ".join(differ))
    return root


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize(("transform", "output"), list(cases()))
def test_batches_keep_their_digest(root: Path, transform: str, output: str, workers: int) -> None:
    assert run(root, transform, output, workers) == DIGESTS[transform, output]


@pytest.mark.parametrize(("output", "workers"), [("uint8", 0), ("uint8", 2), ("float32", 2)])
def test_cached_batches_keep_their_digest(root: Path, output: str, workers: int) -> None:
    """The decoded cache's second epoch: rows written by the parent (and, for uint8, the whole
    batch made in the parent), with the same bytes as the uncached batches."""
    assert run(root, "eval", output, workers, cache=True) == DIGESTS["eval", output]


def main(argv: list[str]) -> None:
    """Print the environment and the digests of this checkout (argv: a folder to write)."""
    root = make_root(Path(argv[0]))
    print(f"ENVIRONMENT = {environment(root)!r}")
    print("DIGESTS = {")
    for transform, output in cases():
        print(f"    ({transform!r}, {output!r}): {run(root, transform, output, 0)!r},")
    print("}")


if __name__ == "__main__":
    main(sys.argv[1:])
