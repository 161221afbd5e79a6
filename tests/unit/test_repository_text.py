"""The repository's own text: the README stays a short front door whose links resolve, the
license ships, and no file points at anything outside the repository (numbered issues or
decisions kept elsewhere, or how the project is developed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEXT_DIRS = ("gpufeed", "tests", "docs", "benchmarks", "scripts", "examples", ".ci")
TEXT_FILES = ("README.md", "CHANGELOG.md", "Makefile", "pyproject.toml", "setup.cfg", "mkdocs.yml")
SUFFIXES = {".py", ".md", ".sh", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".json", ""}
# Built from pieces so that this file does not match itself.
OUTSIDE = re.compile("|".join([r"\bissue [0-9]+", r"\bdecision [0-9]+", r"\bthe issue", r"\bsessions?\b",
                               r"\bdevice " + "tool", r"\bdevice " + "time"]), re.IGNORECASE)
# pytest's own API says "session".
PYTEST_API = re.compile(r'scope="session"|session: pytest\.Session|request\.session')


def text_files() -> list[Path]:
    files = [ROOT / name for name in TEXT_FILES if (ROOT / name).is_file()]
    for top in TEXT_DIRS:
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in SUFFIXES and "__pycache__" not in path.parts:
                files.append(path)
    return files


def test_readme_is_a_short_front_door_whose_links_resolve():
    text = (ROOT / "README.md").read_text()
    lines = text.count("\n")
    assert lines <= 150, f"README.md has {lines} lines; the limit is 150: move detail into docs/"
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    local = [t for t in targets if "://" not in t]
    assert local, "README.md links no docs page"
    missing = [t for t in local if not (ROOT / t).exists()]
    assert not missing, f"README.md links files that do not exist: {missing}"


def test_license_is_apache_and_ships_in_the_wheel():
    pyproject = (ROOT / "pyproject.toml").read_text()  # tomllib is 3.11+; these two lines suffice
    assert re.search(r'^license = "Apache-2.0"$', pyproject, re.M)
    assert re.search(r'^license-files = \["LICENSE"\]$', pyproject, re.M)
    assert "Apache License" in (ROOT / "LICENSE").read_text()
    assert (ROOT / "CHANGELOG.md").read_text().startswith("# Changelog")


def test_no_text_points_outside_the_repository():
    this = Path(__file__).resolve()
    found = []
    for path in text_files():
        if path.resolve() == this:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if OUTSIDE.search(PYTEST_API.sub("", line)):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not found, ("text that refers to numbered issues or decisions kept elsewhere, or to how the "
                       "project is developed; cite the docs/ section instead:\n" + "\n".join(found))


DATA_SUFFIXES = {".jpg", ".jpeg", ".png", ".webp", ".tar", ".lmdb", ".mdb", ".npy", ".idx"}
TRACKED_LIMIT_BYTES = 8 * 1024 * 1024


def test_no_generated_data_is_tracked():
    """The demo and benchmarks generate their images (demo-*/ folders, packed shards); none of it
    belongs in the repository, whose tracked files stay a few MiB of text."""
    if not (ROOT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not a git checkout: nothing is tracked")
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60, check=True)
    tracked = [name for name in listed.stdout.decode().split("\0") if name]
    data = [name for name in tracked
            if Path(name).suffix.lower() in DATA_SUFFIXES or name.split("/", 1)[0].startswith("demo-")]
    assert not data, f"generated data is tracked (git rm --cached it; .gitignore has /demo-*/): {data[:10]}"
    size = sum((ROOT / name).stat().st_size for name in tracked if (ROOT / name).is_file())
    assert size <= TRACKED_LIMIT_BYTES, (
        f"tracked files total {size / 2**20:.1f} MiB, over {TRACKED_LIMIT_BYTES / 2**20:.0f} MiB: "
        "look for generated data or build output in `git ls-files`")
