"""The parallel ImageFolder scan lists exactly what torchvision's make_dataset lists, in its order."""

from __future__ import annotations

import os

import pytest

from gpufeed.sources import IMG_EXTENSIONS, ImageFolder
from gpufeed.sources._folder import find_classes, scan
from gpufeed.sources._scan import scan_parallel, walk_class
from tests.unit.test_sources import tv_find_classes, tv_make_dataset


@pytest.fixture
def awkward_tree(tmp_path):
    """Nesting whose path order differs from depth-first order, mixed-case extensions, linked
    directories and files, a broken link, non-images, an empty class, many small classes."""
    root = tmp_path / "tree"
    outside = tmp_path / "outside"
    files = [
        "cls/a/b/1.jpg", "cls/a-c/2.JPG", "cls/a.b/3.jpeg", "cls/a/4.Png", "cls/5.webp",
        "cls/a/b/c/d/6.tif", "cls/A/7.TIFF", "cls/notes.txt", "cls/a/b/x.jpg.bak",
        "Other/z.BMP", "Other/é/ü.jpg", "Other/ .jpg", "Other/.hidden.jpeg",
        "mixed/sub/deeper/y.PPM", "mixed/y.pgm",
    ] + [f"many{k:02d}/{j}.jpg" for k in range(20) for j in range(3)]
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * (len(rel) % 7 + 1))
    (root / "empty_class" / "nested_empty").mkdir(parents=True)
    (outside / "deep").mkdir(parents=True)
    (outside / "deep" / "linked.jpg").write_bytes(b"y")
    (outside / "top.JPEG").write_bytes(b"y")
    os.symlink(outside, root / "cls" / "a" / "link_dir")  # a linked directory inside a class
    os.symlink(outside, root / "linked_class")  # a whole class folder that is a link
    os.symlink(outside / "top.JPEG", root / "mixed" / "file_link.jpg")
    os.symlink(tmp_path / "nowhere.jpg", root / "mixed" / "broken.jpg")
    return str(root)


def test_parallel_scan_equals_the_sequential_scan_and_torchvision(awkward_tree):
    classes, class_to_idx = find_classes(awkward_tree)
    assert (classes, class_to_idx) == tv_find_classes(awkward_tree)
    want = tv_make_dataset(awkward_tree, class_to_idx)
    sequential = scan(awkward_tree, class_to_idx, allow_empty=True)
    assert [(os.path.join(awkward_tree, p), c) for p, c in zip(*sequential)] == want
    for threads in (1, 2, 8, 64):
        got = scan_parallel(awkward_tree, class_to_idx, IMG_EXTENSIONS, allow_empty=True,
                            threads=threads)
        assert got == sequential, f"threads={threads}"
    # the tree really is awkward: path order is not depth-first order, links are followed
    rel = sequential[0]
    order = [rel.index(p) for p in ("cls/a/4.Png", "cls/a-c/2.JPG", "cls/a.b/3.jpeg",
                                    "cls/a/b/1.jpg")]
    assert order == sorted(order)  # "cls/a/b" after "cls/a-c" and "cls/a.b": '/' > '-', '.'
    assert "cls/a/link_dir/deep/linked.jpg" in rel and "linked_class/top.JPEG" in rel
    assert "mixed/broken.jpg" in rel  # listed (torchvision lists it too); reading it fails later
    assert len(rel) == len(want) == 79


def test_image_folder_uses_the_parallel_scan_with_torchvision_samples(awkward_tree):
    ds = ImageFolder(awkward_tree, allow_empty=True)
    assert ds.samples == tv_make_dataset(awkward_tree, tv_find_classes(awkward_tree)[1])
    assert "empty_class" in ds.classes and ds.class_to_idx["empty_class"] not in ds.targets


def test_empty_class_error_is_the_sequential_scans(awkward_tree):
    _, class_to_idx = find_classes(awkward_tree)
    with pytest.raises(FileNotFoundError) as sequential:
        scan(awkward_tree, class_to_idx)
    with pytest.raises(FileNotFoundError) as parallel:
        scan_parallel(awkward_tree, class_to_idx, IMG_EXTENSIONS, threads=4)
    assert str(parallel.value) == str(sequential.value)
    assert "'empty_class'" in str(parallel.value) and "allow_empty=True" in str(parallel.value)


def test_is_valid_file_is_called_in_order_on_the_calling_thread(awkward_tree):
    import threading

    calls = []

    def accept(path: str) -> bool:
        calls.append((path, threading.get_ident()))
        return path.endswith(".txt") or path.endswith(".jpg")

    _, class_to_idx = find_classes(awkward_tree)
    want = scan(awkward_tree, class_to_idx, is_valid_file=accept, allow_empty=True)
    want_calls, calls[:] = list(calls), []
    got = scan_parallel(awkward_tree, class_to_idx, IMG_EXTENSIONS, is_valid_file=accept,
                        allow_empty=True, threads=8)
    assert got == want and "cls/notes.txt" in got[0]
    assert calls == want_calls  # same paths, same order, all on this thread
    assert {ident for _, ident in calls} == {threading.get_ident()}


def test_unreadable_directory_is_skipped_as_os_walk_skips_it(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root reads directories whatever their mode")
    (tmp_path / "c" / "locked").mkdir(parents=True)
    (tmp_path / "c" / "locked" / "hidden.jpg").write_bytes(b"x")
    (tmp_path / "c" / "seen.jpg").write_bytes(b"x")
    os.chmod(tmp_path / "c" / "locked", 0)
    try:
        listing = walk_class(str(tmp_path / "c"))
        walked = sorted((top, tuple(sorted(files))) for top, _, files in os.walk(tmp_path / "c"))
    finally:
        os.chmod(tmp_path / "c" / "locked", 0o755)
    assert [(top, files) for top, files, _, _ in listing.dirs] == walked == [(str(tmp_path / "c"), ("seen.jpg",))]
