"""gpufeed's exceptions and warnings.

::

    GpufeedError (RuntimeError)
    ├── WorkerError            a worker process died or could not be replaced
    ├── LoaderTimeoutError     no batch within ``timeout`` seconds (also a RuntimeError, as in torch)
    ├── DecodeError (+ValueError)  an image (or mask) could not be decoded: names the file and sample index
    ├── ReadError (+OSError)   a sample's bytes could not be read (remote sources, after retries)
    └── BackendUnavailableError    a requested decoder or device is not installed

    GpufeedWarning (UserWarning)
    └── BackendFallbackWarning  libturbojpeg missing, OpenCV used instead (said once)

Errors raised *inside* user code (dataset, collate_fn, worker_init_fn) keep their original type;
gpufeed only adds a note naming the worker, pid and sample indices.
"""

from __future__ import annotations

import reprlib
from typing import TypeGuard


class GpufeedError(RuntimeError):
    """Base class of gpufeed's own errors."""


class WorkerError(GpufeedError):
    """A worker process died (signal or exit code) and was not, or could not be, replaced."""


class LoaderTimeoutError(GpufeedError):
    """No batch arrived within the loader's ``timeout`` (seconds)."""


class DecodeError(GpufeedError, ValueError):
    """An encoded image could not be decoded (or a segmentation mask, or decoded to another size
    than its image's); the message names the file and sample index. The loader's
    ``on_error="skip"`` leaves such samples out of their batch."""


class ReadError(GpufeedError, OSError):
    """A sample's bytes could not be read, for good (a remote source's retries are spent, or
    the error is permanent: 404, 403); the message names the URL and sample index. The loader's
    ``on_error="skip"`` leaves such samples out of their batch, as undecodable ones."""


class BackendUnavailableError(GpufeedError):
    """A requested backend (decoder, device) is not available on this machine."""


class GpufeedWarning(UserWarning):
    """Base class of gpufeed's warnings."""


class BackendFallbackWarning(GpufeedWarning):
    """A faster backend is missing and a slower one is used instead."""


def add_note(exc: BaseException, note: str) -> BaseException:
    """Attach ``note`` to ``exc`` (``add_note`` on 3.11+, ``__notes__`` on 3.10) and return it."""
    if hasattr(exc, "add_note"):
        exc.add_note(note)
    else:  # Python 3.10: keep the information where tracebacks of 3.11+ would show it
        notes = list(getattr(exc, "__notes__", []))
        notes.append(note)
        try:
            exc.__notes__ = notes  # type: ignore[attr-defined]
        except AttributeError:
            pass
    return exc


#: How messages tell a user to leave bad samples out: the loader's keyword, as Python code.
#: The command line shows its own flag instead (``gpufeed.cli`` replaces this text).
SKIP_HINT = "on_error='skip'"

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 80  # bytes (a JPEG in a sample) are cut as "other" values
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6
_REPR.maxlevel = 3


def describe_callable(fn: object) -> str:
    """A short name for a user callable in messages: its qualified name, else its type's."""
    name = getattr(fn, "__qualname__", None)
    text = name if isinstance(name, str) else type(fn).__qualname__
    return text if len(text) <= 60 else text[:57] + "..."


def shorten(value: object) -> str:
    """``repr(value)`` cut to a readable length (``reprlib``), for messages that show a user's
    value: a sample holding a whole JPEG must not print the JPEG."""
    return _REPR.repr(value)


def is_int(value: object) -> TypeGuard[int]:
    """An int and not a bool (``True`` is an int to Python, never a count to gpufeed)."""
    return isinstance(value, int) and not isinstance(value, bool)


def check_int(name: str, value: object, minimum: int | None = None, maximum: int | None = None, *,
              rule: str | None = None, kind: str = "an int", subject: str = "", typed: bool = False) -> int:
    """``value``, checked to be an int (not a bool) in ``[minimum, maximum]``, for an argument ``name``.

    Otherwise a ``ValueError``: "`name` must be an int >= minimum. Found: value." (``rule``
    replaces ">= minimum", e.g. "in 0-65535 (0: any free port)"; ``kind`` replaces "an int",
    e.g. "None or an int"; ``subject`` comes first, e.g. "the dataset's "). With ``typed``, a
    value that is no int is a ``TypeError`` ("`name` must be an int. Found: value (type).") and
    one out of range a ``ValueError`` ("`name` must be >= minimum. Found: value.").
    """
    low = minimum is not None and is_int(value) and value < minimum
    high = maximum is not None and is_int(value) and value > maximum
    if typed:
        if not is_int(value):
            raise TypeError(f"{subject}`{name}` must be {kind}. Found: {shorten(value)} ({type(value).__name__}).")
        if low or high:
            bound = f">= {minimum}" if low else f"<= {maximum}"
            raise ValueError(f"{subject}`{name}` must be {rule or bound}. Found: {value}.")
        return value
    if not is_int(value) or low or high:
        if rule is None:
            rule = f">= {minimum}" if maximum is None else f"in {minimum}-{maximum}"
        raise ValueError(f"{subject}`{name}` must be {kind} {rule}. Found: {shorten(value)}.")
    return value
