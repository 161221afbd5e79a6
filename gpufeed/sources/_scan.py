"""Parallel ImageFolder scan in torchvision's order, and the tree signature of the index cache.

torchvision's ``make_dataset`` walks each class folder with ``os.walk(followlinks=True)``,
sorts the ``(dirpath, dirnames, filenames)`` triples (so directories come in plain string order
of their paths, not depth-first) and each directory's file names. :func:`walk_class` lists one
class folder the same way (``os.scandir``; an unreadable directory is skipped, as ``os.walk``
skips it) and :func:`scan_parallel` runs it on threads, one class folder per task:
``scandir`` waits on the file system without the GIL, which is what a cold or network file
system spends its time on. The result is re-assembled in class order, so it is identical to
the sequential ``gpufeed.sources._folder.scan`` (the reference the tests compare with).

With ``stat=True`` the walk also stats every file (following links) for the index cache's
signature: per directory its path, ``st_mtime_ns`` and entry count, per file its name, size and
``st_mtime_ns`` (``gpufeed.sources._index_cache``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from gpufeed.errors import describe_callable

#: Threads listing class folders at once (I/O-bound: they wait in ``scandir`` without the GIL).
DEFAULT_SCAN_THREADS = 16


@dataclass(frozen=True)
class ClassListing:
    """One class folder walked: every directory, sorted by path, as ``(path, sorted names of its
    non-directory entries, st_mtime_ns, digest of all its entry names)``, and, when files were
    stat'ed, a digest of the subtree (hex)."""

    dirs: tuple[tuple[str, tuple[str, ...], int, bytes], ...]
    digest: str | None


def names_digest(names: list[str]) -> bytes:
    """16-byte digest of a directory's entry names (any order)."""
    joined = "\0".join(sorted(names)).encode("utf-8", "surrogateescape")
    return hashlib.blake2b(joined, digest_size=16).digest()


def walk_class(folder: str, stat: bool = False) -> ClassListing:
    """List ``folder`` recursively as ``os.walk(folder, followlinks=True)`` would, sorted as
    torchvision sorts it, with each directory's ``st_mtime_ns`` (taken before it is listed, so
    a change made meanwhile shows as a newer time later) and a digest of its entry names; with
    ``stat``, also digest every directory's mtime and entry count and every file's name, size
    and mtime (all in ns)."""
    found: list[tuple[str, tuple[str, ...], int, bytes, bytes]] = []
    stack = [folder]
    while stack:
        top = stack.pop()
        dirs: list[str] = []
        files: list[str] = []
        sig: list[str] = []
        try:
            dir_mtime = os.stat(top).st_mtime_ns
            with os.scandir(top) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir()
                    except OSError:
                        is_dir = False
                    if is_dir:
                        dirs.append(entry.name)
                        continue
                    files.append(entry.name)
                    if stat:
                        try:
                            st = entry.stat()
                            sig.append(f"{entry.name}\0{st.st_size}\0{st.st_mtime_ns}")
                        except OSError:  # a broken link: it is listed, and stays broken
                            sig.append(f"{entry.name}\0-1\0-1")
        except OSError:
            continue  # os.walk(onerror=None) skips a directory it cannot list
        record = b""
        if stat:
            sig.sort()
            head = f"{top}\0{dir_mtime}\0{len(dirs) + len(files)}\n"
            record = (head + "\n".join(sig)).encode("utf-8", "surrogateescape")
        found.append((top, tuple(sorted(files)), dir_mtime, names_digest(dirs + files), record))
        stack.extend(os.path.join(top, d) for d in dirs)
    found.sort(key=lambda item: item[0])
    digest = None
    if stat:
        h = hashlib.blake2b(digest_size=16)
        for *_, record in found:
            h.update(record)
            h.update(b"\n\n")
        digest = h.hexdigest()
    return ClassListing(tuple((top, files, mtime, names) for top, files, mtime, names, _ in found),
                        digest)


def walk_classes(root: str, classes: list[str], stat: bool = False,
                 threads: int = DEFAULT_SCAN_THREADS) -> list[ClassListing]:
    """:func:`walk_class` of ``root/NAME`` for every name in ``classes``, in that order, on up
    to ``threads`` threads."""
    folders = [os.path.join(root, name) for name in classes]
    if threads <= 1 or len(folders) <= 1:
        return [walk_class(f, stat) for f in folders]
    with ThreadPoolExecutor(min(threads, len(folders)), thread_name_prefix="gpufeed-scan") as ex:
        return list(ex.map(lambda f: walk_class(f, stat), folders))


def select(root: str, class_to_idx: dict[str, int], listings: list[ClassListing],
           extensions: tuple[str, ...], is_valid_file: Callable[[str], bool] | None,
           allow_empty: bool) -> tuple[list[str], list[int]]:
    """(paths relative to ``root``, labels) of the image files in ``listings`` (one per class,
    in class index order), in torchvision's order. ``is_valid_file`` is called here, on the
    calling thread, in that order (as torchvision calls it). Unless ``allow_empty``, raises
    FileNotFoundError naming the classes without a single image."""
    prefix_len = len(os.path.join(root, ""))
    paths: list[str] = []
    labels: list[int] = []
    empty = []
    names = sorted(class_to_idx, key=class_to_idx.__getitem__)
    for name, listing in zip(names, listings):
        before = len(paths)
        for top, files, _, _ in listing.dirs:
            rel = os.path.join(top, "")[prefix_len:]
            if is_valid_file is None:
                paths.extend(rel + f for f in files if f.lower().endswith(extensions))
            else:
                paths.extend(rel + f for f in files if is_valid_file(os.path.join(top, f)))
        labels.extend([class_to_idx[name]] * (len(paths) - before))
        if len(paths) == before:
            empty.append(name)
    if empty and not allow_empty:
        raise empty_classes_error(root, empty, extensions, is_valid_file)
    return paths, labels


def scan_parallel(root: str, class_to_idx: dict[str, int], extensions: tuple[str, ...],
                  is_valid_file: Callable[[str], bool] | None = None, allow_empty: bool = False,
                  threads: int = DEFAULT_SCAN_THREADS) -> tuple[list[str], list[int]]:
    """``gpufeed.sources._folder.scan`` with class folders listed on ``threads`` threads: the
    same (paths relative to ``root``, labels), in the same order."""
    names = sorted(class_to_idx, key=class_to_idx.__getitem__)
    listings = walk_classes(root, names, threads=threads)
    return select(root, class_to_idx, listings, extensions, is_valid_file, allow_empty)


def empty_classes_error(root: str, empty: list[str], extensions: tuple[str, ...],
                        is_valid_file: Callable[[str], bool] | None) -> FileNotFoundError:
    """The error for class folders without images (torchvision raises one too)."""
    shown = ", ".join(repr(e) for e in empty[:5]) + (" ..." if len(empty) > 5 else "")
    looked = (f"for extensions {', '.join(extensions)} (case-insensitive)"
              if is_valid_file is None else
              f"for files accepted by is_valid_file={describe_callable(is_valid_file)}")
    return FileNotFoundError(f"no image files in class folder(s) {shown} of {root!r}; looked "
                             f"{looked}. Pass allow_empty=True to keep empty classes.")
