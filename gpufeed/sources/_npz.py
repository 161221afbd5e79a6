"""The index caches' file (a folder's ``index_cache``, tar shards' index cache and sidecars): named
numpy arrays in one ``.npz``, with a JSON ``meta`` array that names its format and version, written
atomically (a temporary file beside it, then ``os.replace``)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
import zipfile
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

#: What reading a damaged or foreign file raises: a cache that does not read is ignored and rebuilt.
READ_ERRORS: tuple[type[Exception], ...] = (OSError, ValueError, KeyError, UnicodeDecodeError,
                                            zipfile.BadZipFile)


def meta_array(meta: dict[str, Any]) -> np.ndarray:
    """``meta`` as the UTF-8 JSON bytes the file stores under ``"meta"``."""
    return np.frombuffer(json.dumps(meta).encode("utf-8"), np.uint8)


def read_npz(path: str, fmt: str, version: int) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(arrays, meta) of the file at ``path``; raises one of :data:`READ_ERRORS` (ValueError when
    its meta names another format or version)."""
    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    meta = json.loads(arrays["meta"].tobytes().decode("utf-8"))
    if not isinstance(meta, dict) or meta.get("format") != fmt:
        raise ValueError(f"not a {fmt} file")
    if meta.get("version") != version:
        raise ValueError(f"version {meta.get('version')!r}, this gpufeed reads {version}")
    return arrays, meta


def write_npz(path: str, arrays: dict[str, np.ndarray], what: str, then: str = "") -> None:
    """Write ``arrays`` to ``path`` atomically; a failure is logged (``what``, the path, the
    error, then ``then``), not raised: what the file caches is computed again next time."""
    directory = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp",
                                   dir=directory)
        with os.fdopen(fd, "wb") as f:
            savez: Any = np.savez  # (its keyword allow_pickle confuses a ** argument's type)
            savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as exc:
        logger.warning("could not write %s %s (%s)%s", what, path, exc, then)
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
