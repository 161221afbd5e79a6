"""gpufeed never imports torchvision itself: ``import gpufeed`` and using a dataset, a loader and
``explain`` without torchvision objects leave it out of ``sys.modules``. Runs in both venvs; in
``.venv-tv``, where torchvision is installed, it is the real check."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from gpufeed.synth import make_image_folder
from tests._concurrent import result

SCRIPT = textwrap.dedent("""
    import sys
    import gpufeed
    from gpufeed import FastLoader, ImageFolder, RandomResizedCrop, ResizeCenterCrop
    root = sys.argv[1]
    ds = ImageFolder(root, transform=ResizeCenterCrop(48, 56))
    ds[0]
    for _ in FastLoader(ds, batch_size=2, num_workers=0, normalize=((0.5,) * 3, (0.25,) * 3)):
        pass
    ImageFolder(root, transform=lambda image: image.size)[1]
    gpufeed.explain(ds.transform), gpufeed.explain(len), gpufeed.explain(None)
    ds.transform = RandomResizedCrop(32)
    ds[2]
    found = sorted(m for m in sys.modules if m.split(".")[0] == "torchvision")
    print("torchvision modules:", found)
    sys.exit(1 if found else 0)
""")


def _run(tmp_path_factory: pytest.TempPathFactory) -> subprocess.CompletedProcess[str]:
    root = tmp_path_factory.mktemp("no-torchvision")
    make_image_folder(root, num_classes=2, per_class=2, size=(60, 70))
    return subprocess.run([sys.executable, "-c", SCRIPT, str(root)], capture_output=True, text=True, timeout=100)


SIDE_BY_SIDE = {"no-torchvision-import": (2.7, _run)}  # see tests/conftest.py


@pytest.mark.timeout(600)  # the first test to run starts every side-by-side run (tests/conftest.py)
def test_gpufeed_alone_never_imports_torchvision(side_by_side):
    done = result(side_by_side, "no-torchvision-import")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "torchvision modules: []" in done.stdout
