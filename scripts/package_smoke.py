"""Smoke test of an installed gpufeed wheel (run by `make package-check` in a fresh venv).

Run it from outside the source tree, so that ``import gpufeed`` finds the installed package and
not the checkout: it checks that gpufeed came from the venv's site-packages, that the wheel's dist-info holds LICENSE,
that ``gpufeed --version`` prints the package's version, and one FastLoader epoch (2 workers)
over a small generated image folder yields every image once, as uint8 batches.

    cd /tmp && /path/to/venv/bin/python /path/to/scripts/package_smoke.py

Exit status 0 when every check passed; otherwise the first failed check is printed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path


def fail(what: str) -> None:
    sys.stderr.write(f"package smoke test FAILED: {what}\n")
    raise SystemExit(1)


def check_install() -> str:
    import gpufeed

    where = Path(gpufeed.__file__).resolve()
    site = Path(sysconfig.get_path("purelib")).resolve()
    if not where.is_relative_to(site):
        fail(f"gpufeed was imported from {where}, not from this venv's site-packages ({site}): "
             "run this script from outside the source tree, without PYTHONPATH")
    dist = importlib.metadata.distribution("gpufeed")
    if dist.version != gpufeed.__version__:
        fail(f"the dist-info says version {dist.version}, gpufeed.__version__ is {gpufeed.__version__}")
    files = [str(f) for f in dist.files or ()]
    if not any(f.endswith(".dist-info/licenses/LICENSE") or f.endswith(".dist-info/LICENSE") for f in files):
        fail(f"LICENSE is not in the wheel's dist-info (files: {[f for f in files if 'dist-info' in f]})")
    license_text = next(p for p in files if p.endswith("LICENSE"))
    if "Apache License" not in (Path(dist.locate_file(license_text))).read_text():
        fail(f"{license_text} is not the Apache License text")
    return gpufeed.__version__


def check_cli(version: str) -> None:
    exe = shutil.which("gpufeed", path=str(Path(sys.executable).parent))
    if exe is None:
        fail(f"no `gpufeed` command next to {sys.executable}")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=120)
    if out.returncode != 0 or out.stdout.strip() != f"gpufeed {version}":
        fail(f"`gpufeed --version` exited {out.returncode} printing {out.stdout!r} {out.stderr[-500:]!r}")


def check_epoch() -> int:
    import torch

    from gpufeed import FastLoader, ImageFolder, ResizeCenterCrop
    from gpufeed.synth import make_image_folder

    with tempfile.TemporaryDirectory(prefix="gpufeed-smoke-") as tmp:
        made = make_image_folder(tmp, num_classes=2, per_class=12, size=((60, 120), (60, 120)))
        dataset = ImageFolder(tmp, transform=ResizeCenterCrop(32, 40))
        loader = FastLoader(dataset, batch_size=8, shuffle=True, num_workers=2, timeout=120)
        labels: list[int] = []
        for images, target in loader:
            if images.dtype != torch.uint8 or tuple(images.shape[1:]) != (3, 32, 32):
                fail(f"a batch of {images.dtype} {tuple(images.shape)}; expected uint8 [N, 3, 32, 32]")
            labels += target.tolist()
        if len(labels) != made.num_images or sorted(labels) != sorted(dataset.targets):
            fail(f"one epoch yielded {len(labels)} labels for {made.num_images} images")
        return len(labels)


def main() -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    version = check_install()
    check_cli(version)
    n = check_epoch()
    sys.stdout.write(f"package smoke test passed: gpufeed {version} from the wheel, LICENSE in its "
                     f"dist-info, `gpufeed --version`, one FastLoader epoch of {n} images (2 workers)\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
