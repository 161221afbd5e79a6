"""Remote image sources: ``ImageFolder`` and ``ImageDataset`` over URLs, read through fsspec.

Any fsspec protocol works (``s3://``, ``gs://``, ``http(s)://``, ``file://``...); fsspec and
aiohttp (which fsspec's HTTP filesystem needs) are the ``remote`` extra:
``pip install gpufeed[remote]``. A :class:`RemoteReader` belongs to one dataset:

- **one filesystem object per process**, per protocol, made on first use in the process that
  reads (a worker, after the fork) and never inherited: it is keyed by pid (fsspec's async
  filesystems hold an event loop and an HTTP client that do not survive a fork) and dropped
  when pickled. It is shared by the worker's read threads (an async filesystem runs every
  request on fsspec's one IO loop, so N threads keep N requests in flight);
- **per-read timeout** (async filesystems: the request is cancelled; others rely on their own
  ``storage_options``), **bounded retries** with exponential backoff and jitter for transient
  errors (connection errors, timeouts, HTTP 408/425/429/5xx), never for permanent ones (404,
  403...). Once a read has failed for good it raises :class:`gpufeed.errors.ReadError`, naming
  the URL, the sample index and the attempts; the loader's ``on_error`` then applies (``"skip"``
  leaves the sample out of its batch and counts it);
- **listing** for ``ImageFolder``: class folders and files in the order torchvision gives a
  local tree (sorted class folders, each walked recursively with directories and file names
  sorted, extensions matched case-insensitively), from fsspec's ``ls``/``find`` (HTTP: the
  server's HTML directory listings; object stores: key prefixes).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import random
import re
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from gpufeed.errors import SKIP_HINT, ReadError, check_int, is_int, shorten

__all__ = ["REMOTE_HINT", "REMOTE_READ_CONCURRENCY", "TRANSIENT_STATUS", "RemoteOptions", "RemoteReader",
           "is_transient", "is_url"]

logger = logging.getLogger(__name__)

REMOTE_HINT = "pip install gpufeed[remote]"
#: Reads in flight per worker for remote sources: object stores and HTTP servers answer in
#: 10-100 ms whatever the size, so 16 requests per worker hide that behind the decode.
REMOTE_READ_CONCURRENCY = 16
#: HTTP statuses worth a retry: timeout, too early, throttled, server errors.
TRANSIENT_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_TRANSIENT_ERRNO = frozenset({errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED,
                              errno.ETIMEDOUT, errno.EPIPE, errno.EAGAIN, errno.EHOSTUNREACH,
                              errno.ENETUNREACH, errno.ENETDOWN})
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*(::[A-Za-z][A-Za-z0-9+.\-]*)*://")

_lock = threading.Lock()  # guards every reader's filesystem table; replaced in a forked child
# Backoff jitter: its own generator, so retries never draw from (and shift) the global `random`
# state a user's code may rely on; reseeded in a forked child, so workers do not retry in step.
_jitter = random.Random()


def _forget_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # the parent's may have been held by one of its threads at fork
    _jitter.seed()


os.register_at_fork(after_in_child=_forget_after_fork)


def is_url(path: Any) -> TypeGuard[str]:
    """Whether ``path`` is a URL string (``PROTOCOL://...``, fsspec chains ``a::b://`` too)."""
    return isinstance(path, str) and _URL.match(path) is not None


def require_fsspec() -> Any:
    """The ``fsspec`` module, or an ImportError naming the install command."""
    try:
        import fsspec
    except ImportError as exc:
        raise ImportError(f"reading URLs needs fsspec (and aiohttp for http(s)://): "
                          f"{REMOTE_HINT} (or pip install fsspec aiohttp, plus s3fs/gcsfs for "
                          f"s3:// and gs://).") from exc
    return fsspec


@dataclass(frozen=True)
class RemoteOptions:
    """How a remote source reads: a per-read timeout and bounded retries of transient errors.

    Attributes:
        timeout_s: seconds one request may take before it is cancelled and counts as a
            transient failure (async filesystems: HTTP, S3, GCS; others use their own
            ``storage_options``). None: no limit.
        retries: attempts after the first for transient errors (connection errors, timeouts,
            HTTP 408/425/429/5xx); a read makes at most ``retries + 1`` requests.
        backoff_s: wait before the first retry (seconds); doubled for each further retry, capped
            at ``max_backoff_s``, and scaled by a random factor in [0.5, 1] (jitter, so that
            workers do not retry in step).
        max_backoff_s: longest wait between two attempts (seconds).
    """

    timeout_s: float | None = 30.0
    retries: int = 3
    backoff_s: float = 0.1
    max_backoff_s: float = 5.0

    def __post_init__(self) -> None:
        if self.timeout_s is not None and not (_is_number(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"`timeout_s` must be a number of seconds > 0, or None. "
                             f"Found: {shorten(self.timeout_s)}.")
        check_int("retries", self.retries, 0)
        for name in ("backoff_s", "max_backoff_s"):
            value = getattr(self, name)
            if not (_is_number(value) and value >= 0):
                raise ValueError(f"`{name}` must be a number of seconds >= 0. Found: {shorten(value)}.")

    def backoff(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (0 for the first), jitter included."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** retry) * _jitter.uniform(0.5, 1.0)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_transient(exc: BaseException) -> bool:
    """Whether a failed request is worth retrying: timeouts, connection errors, HTTP 408, 425,
    429 and 5xx; not a missing object, a refused permission or any other answer."""
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        return False
    if isinstance(exc, (TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return True
    status = getattr(exc, "status", None)
    if is_int(status):
        return status in TRANSIENT_STATUS
    if isinstance(exc, OSError) and exc.errno in _TRANSIENT_ERRNO:
        return True
    aiohttp = _aiohttp()
    return aiohttp is not None and isinstance(
        exc, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError))


def _is_storage_error(exc: BaseException) -> bool:
    """An I/O failure of the storage (wrapped in ReadError), as opposed to a bug to surface."""
    if isinstance(exc, (OSError, asyncio.TimeoutError)) or isinstance(getattr(exc, "status", None), int):
        return True
    aiohttp = _aiohttp()
    return aiohttp is not None and isinstance(exc, aiohttp.ClientError)


def _aiohttp() -> Any:
    """The ``aiohttp`` module if it is already imported (fsspec's HTTP filesystem imports it)."""
    return sys.modules.get("aiohttp")


class RemoteReader:
    """Reads URLs for one dataset: one fsspec filesystem per protocol and process, retries.

    ``storage_options`` go to fsspec (credentials, endpoint, ``client_kwargs``...) for every
    protocol this reader opens; ``options``: timeout and retries (:class:`RemoteOptions`).
    Picklable: the filesystems are left behind and made again where the copy reads.
    """

    def __init__(self, storage_options: dict[str, Any] | None = None,
                 options: RemoteOptions | None = None) -> None:
        if storage_options is not None and not isinstance(storage_options, dict):
            raise TypeError(f"`storage_options` must be a dict of fsspec filesystem options or "
                            f"None. Found: {type(storage_options).__name__} {shorten(storage_options)}.")
        if options is not None and not isinstance(options, RemoteOptions):
            raise TypeError(f"`remote_options` must be a gpufeed.sources.RemoteOptions or None. "
                            f"Found: {type(options).__name__} {shorten(options)}.")
        self.storage_options = dict(storage_options or {})
        self.options = options or RemoteOptions()
        self._pid = 0
        self._filesystems: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_pid": 0, "_filesystems": {}}

    # -- filesystems ---------------------------------------------------------------------------
    def filesystem(self, url: str) -> tuple[Any, str]:
        """(this process's filesystem for ``url``'s protocol, ``url`` as that filesystem's path)."""
        protocol = url.split("://", 1)[0]
        with _lock:
            if self._pid != os.getpid():  # a fork's copy: the parent's filesystems are unusable
                self._pid, self._filesystems = os.getpid(), {}
            fs = self._filesystems.get(protocol)
            if fs is None:
                fsspec = require_fsspec()
                try:
                    fs, _ = fsspec.core.url_to_fs(url, skip_instance_cache=True, **self.storage_options)
                except ImportError as exc:  # a protocol's own package (aiohttp, s3fs, gcsfs...)
                    raise ImportError(f"cannot open {url!r}: {exc} ({REMOTE_HINT} installs fsspec "
                                      f"and aiohttp; s3:// needs s3fs, gs:// gcsfs).") from exc
                self._filesystems[protocol] = fs
        return fs, fs._strip_protocol(url)

    # -- reads ---------------------------------------------------------------------------------
    def read(self, url: str, index: int | None = None) -> bytes:
        """The bytes at ``url`` (sample ``index``, for messages), retrying transient errors;
        :class:`ReadError` once it failed for good."""
        fs, path = self.filesystem(url)
        where = url if index is None else f"{url} (sample index {index})"
        return bytes(self._retrying(where, lambda: self._cat(fs, path)))

    def read_range(self, url: str, start: int, end: int, index: int | None = None) -> bytes:
        """Bytes ``start..end-1`` of the object at ``url`` (one ranged request), retrying
        transient errors; :class:`ReadError` once it failed for good."""
        fs, path = self.filesystem(url)
        where = url if index is None else f"{url} (sample index {index})"
        kwargs = ({"timeout": self.options.timeout_s}
                  if getattr(fs, "async_impl", False) and self.options.timeout_s is not None else {})
        return bytes(self._retrying(where, lambda: fs.cat_file(path, start=start, end=end,
                                                               **kwargs)))

    def signature(self, url: str) -> tuple[int, Any]:
        """(size in bytes, ETag or modification time or None) of the object at ``url``."""
        fs, path = self.filesystem(url)
        info = self._retrying(url, lambda: fs.info(path), sample=False)
        tag = next((info[k] for k in ("ETag", "etag", "mtime", "LastModified", "last_modified",
                                      "updated") if info.get(k) is not None), None)
        size = info.get("size")
        if not isinstance(size, int):
            raise ReadError(f"cannot index {url}: the store reports no size for it "
                            f"({shorten(info)}); tar shards need ranged reads")
        return size, tag if tag is None or isinstance(tag, (int, float, str)) else str(tag)

    def open(self, url: str, block_bytes: int = 8 << 20) -> Any:
        """A seekable binary file object of ``url`` reading ahead ``block_bytes`` at a time."""
        fs, path = self.filesystem(url)
        return self._retrying(url, lambda: fs.open(path, "rb", block_size=block_bytes,
                                                   cache_type="readahead"), sample=False)

    def _cat(self, fs: Any, path: str) -> Any:
        if getattr(fs, "async_impl", False) and self.options.timeout_s is not None:
            return fs.cat_file(path, timeout=self.options.timeout_s)  # fsspec's sync() cancels it
        return fs.cat_file(path)

    def _retrying(self, where: str, call: Callable[[], Any], sample: bool = True) -> Any:
        attempts = self.options.retries + 1
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except Exception as exc:  # noqa: BLE001 - classified: storage errors, the rest re-raised
                if not _is_storage_error(exc):
                    raise
                transient = is_transient(exc)
                if not transient or attempt == attempts:
                    why = (f"gave up after {attempt} attempts (remote_options.retries="
                           f"{self.options.retries})" if transient else
                           f"not retried: a permanent error (attempt {attempt})")
                    skip = (f", or pass {SKIP_HINT} to leave such samples out"
                            if sample else "")
                    raise ReadError(
                        f"cannot read {where}: {type(exc).__name__}: {_message(exc)}; {why}. Check "
                        f"the URL and storage_options, or raise RemoteOptions(retries=, "
                        f"timeout_s=) for a flaky store{skip}.") from exc
                wait_s = self.options.backoff(attempt - 1)
                logger.debug("gpufeed: %s failed (%s: %s); retry %d of %d in %.2f s", where,
                             type(exc).__name__, _message(exc), attempt, attempts - 1, wait_s)
                time.sleep(wait_s)
        raise AssertionError("unreachable: the last attempt returns or raises")

    # -- listing -------------------------------------------------------------------------------
    def scan_folder(self, root: str, extensions: tuple[str, ...],
                    is_valid_file: Callable[[str], bool] | None = None, allow_empty: bool = False,
                    ) -> tuple[list[str], list[str], list[int]]:
        """(classes, paths relative to ``root``, labels) of the image folder at URL ``root``, in
        the order ``ImageFolder`` gives a local tree. Class names are decoded (``%20`` -> space
        for http(s)); the paths stay as listed (URL-encoded for http(s)), so ``root + "/" +
        path`` is the URL to read. ``is_valid_file`` is given that full URL."""
        fs, base = self.filesystem(root)
        base = base.rstrip("/")
        decode = _decoder(root)
        try:
            entries = self._retrying(root, lambda: fs.ls(base, detail=True), sample=False)
        except ReadError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                raise FileNotFoundError(f"image folder root {root!r} does not exist; expected "
                                        f"ROOT/CLASS_NAME/IMAGE files") from None
            raise
        folders = {}
        for entry in entries:
            rel = _relative(entry["name"], base)
            if entry.get("type") == "directory" and rel and "/" not in rel:
                folders[decode(rel)] = rel
        if not folders:
            raise FileNotFoundError(f"no class folders found in {root!r}; expected "
                                    f"ROOT/CLASS_NAME/IMAGE files (listed {len(entries)} entries)")
        classes = sorted(folders)
        url_root = root.rstrip("/")
        paths: list[str] = []
        labels: list[int] = []
        empty = []
        for target, name in enumerate(classes):
            folder_path = f"{base}/{folders[name]}"
            found = self._retrying(f"{url_root}/{folders[name]}",
                                   _bind(fs.find, folder_path, detail=True), sample=False)
            by_dir: dict[str, list[tuple[str, str]]] = {}
            for key, info in found.items():
                if info.get("type", "file") != "file":
                    continue
                rel = _relative(key, base)
                folder, _, filename = rel.rpartition("/")
                by_dir.setdefault(folder, []).append((decode(filename), rel))
            before = len(paths)
            for folder in sorted(by_dir, key=decode):  # os.walk's directories, sorted
                for filename, rel in sorted(by_dir[folder]):
                    if (filename.lower().endswith(extensions) if is_valid_file is None
                            else is_valid_file(f"{url_root}/{rel}")):
                        paths.append(rel)
                        labels.append(target)
            if len(paths) == before:
                empty.append(name)
        if empty and not allow_empty:
            shown = ", ".join(repr(e) for e in empty[:5]) + (" ..." if len(empty) > 5 else "")
            looked = (f"for extensions {', '.join(extensions)} (case-insensitive)"
                      if is_valid_file is None else "for files accepted by is_valid_file")
            raise FileNotFoundError(f"no image files in class folder(s) {shown} of {root!r}; "
                                    f"looked {looked}. Pass allow_empty=True to keep empty classes.")
        return classes, paths, labels


def _bind(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[], Any]:
    return lambda: fn(*args, **kwargs)


def _relative(name: str, base: str) -> str:
    """``name`` (as a filesystem lists it) relative to ``base``, without slashes at the ends."""
    name = name.rstrip("/")
    return name[len(base) + 1:] if name.startswith(base + "/") else name.rsplit("/", 1)[-1]


def _decoder(root: str) -> Callable[[str], str]:
    """Listed names -> file names: percent-decoding for http(s) listings, else unchanged."""
    if root.split("://", 1)[0].lower() in ("http", "https"):
        return urllib.parse.unquote
    return str


def _message(exc: BaseException) -> str:
    text = str(exc) or repr(exc)
    return text if len(text) <= 200 else text[:197] + "..."


def remote_root(root: str, storage_options: dict[str, Any] | None,
                options: RemoteOptions | None, loader: Any = None) -> RemoteReader | None:
    """The reader of an ``ImageFolder`` root: None for a local path (where ``storage_options``
    and ``remote_options`` are errors), else a checked :class:`RemoteReader`."""
    if not is_url(root):
        if storage_options is not None or options is not None:
            raise ValueError(f"`storage_options` and `remote_options` apply to URL roots "
                             f"(s3://, gs://, http(s)://...); {root!r} is a local path.")
        return None
    require_fsspec()
    if loader is not None:
        raise ValueError(f"`loader` takes a local file path; with the URL root {root!r} gpufeed "
                         f"reads the bytes itself. Drop `loader`.")
    return RemoteReader(storage_options, options)


def read_concurrency_for(remote: bool, given: int | None, default: int | None) -> int | None:
    """``given``, else :data:`REMOTE_READ_CONCURRENCY` for a remote source, else ``default``
    (None: auto, see :class:`~gpufeed.sources.ImageSource`)."""
    if given is not None:
        return given
    return REMOTE_READ_CONCURRENCY if remote else default
