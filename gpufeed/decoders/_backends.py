"""Decoder backends, loaded lazily once per process.

Nothing is loaded at import. The first decode in a process loads libturbojpeg through PyTurboJPEG
(a ctypes ``dlopen``); the handle is cached for the life of the process. A forked worker inherits
the parent's loaded library, which is safe (PyTurboJPEG makes a fresh libjpeg-turbo handle per
call); a spawned worker loads its own. When libturbojpeg cannot be loaded, OpenCV decodes JPEGs
and a :class:`~gpufeed.errors.BackendFallbackWarning` is issued once per process.
"""

from __future__ import annotations

import logging
import threading
import warnings
from dataclasses import dataclass
from typing import Any

from gpufeed.errors import BackendFallbackWarning, BackendUnavailableError, shorten

logger = logging.getLogger(__name__)

BACKENDS = ("turbojpeg", "opencv")


# DCT scaling factors used, as (num, denom), ascending. libjpeg-turbo offers n/8 for n = 1..16,
# but measured here (libjpeg-turbo 2.1.5, x86-64) the factors other than 1/8, 1/4, 1/2 and 1
# have no SIMD path and decode *slower* than full size (7/8, 3/4, 5/8: 1.3-2x the full decode
# time; 3/8: no faster than 1/2). OpenCV's IMREAD_REDUCED_* offers the same four, so both
# backends return the same sizes.
FACTORS = ((1, 8), (1, 4), (1, 2), (1, 1))


@dataclass(frozen=True)
class TurboState:
    """Outcome of loading libturbojpeg in this process."""

    decoder: Any  # turbojpeg.TurboJPEG, or None when unavailable
    version: str | None  # PyTurboJPEG's version
    library: str | None  # path of the loaded libturbojpeg
    reason: str | None  # why it is unavailable, None when available
    scaling_factors: tuple[tuple[int, int], ...] = ()  # (num, denom), ascending, <= 1 only

    @property
    def available(self) -> bool:
        return self.decoder is not None


_lock = threading.Lock()
_turbo: TurboState | None = None
_warned = False


def load_turbojpeg(lib_path: str | None = None) -> TurboState:
    """Try to load libturbojpeg (from ``lib_path`` or PyTurboJPEG's search); never raises."""
    try:
        import turbojpeg
    except ImportError as exc:
        return TurboState(None, None, None, f"PyTurboJPEG is not installed ({exc}); "
                          f"fix: pip install 'PyTurboJPEG>=1.7,<2'")
    version = getattr(turbojpeg, "__version__", None)
    try:
        decoder = turbojpeg.TurboJPEG(lib_path)
    except (OSError, RuntimeError) as exc:
        return TurboState(None, version, lib_path,
                          f"libturbojpeg could not be loaded: {exc}; "
                          f"fix: install it (Debian/Ubuntu: apt-get install libturbojpeg0)")
    factors = tuple(sorted((f for f in decoder.scaling_factors if f[0] <= f[1]),
                           key=lambda f: f[0] / f[1]))
    return TurboState(decoder, version, lib_path or _loaded_library_path("libturbojpeg"),
                      None, factors)


def turbo_state() -> TurboState:
    """This process's libturbojpeg state, loaded on first call."""
    global _turbo
    state = _turbo
    if state is None:
        with _lock:
            if _turbo is None:
                _turbo = load_turbojpeg()
                if not _turbo.available:
                    logger.info("turbojpeg unavailable: %s", _turbo.reason)
            state = _turbo
    return state


def set_turbo_state(state: TurboState | None) -> None:
    """Replace this process's libturbojpeg state (None: load again on next use). For tests/tools."""
    global _turbo, _warned
    with _lock:
        _turbo = state
        _warned = False


def jpeg_backend(requested: str | None) -> str:
    """The backend that decodes JPEGs for a request of ``requested`` (None, or one of BACKENDS)."""
    if requested is not None and requested not in BACKENDS:
        raise ValueError(f"`backend` must be None or one of {BACKENDS}. Found: {shorten(requested)}.")
    if requested == "opencv":
        return "opencv"
    state = turbo_state()
    if state.available:
        return "turbojpeg"
    if requested == "turbojpeg":
        raise BackendUnavailableError(f"backend='turbojpeg' was requested but {state.reason}. "
                                      f"Or pass backend=None to use OpenCV.")
    _warn_fallback(state)
    return "opencv"


def _warn_fallback(state: TurboState) -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"gpufeed decodes JPEGs with OpenCV, which is slower, because {state.reason}",
                      BackendFallbackWarning, stacklevel=4)


def backends() -> dict:
    """Describe the active decoders (loads libturbojpeg if not yet loaded; JSON-serialisable)."""
    import cv2

    state = turbo_state()
    return {
        "jpeg": "turbojpeg" if state.available else "opencv",
        "other": "opencv",
        "turbojpeg": {
            "available": state.available,
            "pyturbojpeg_version": state.version,
            "library": state.library,
            "scaling_factors": [f"{n}/{d}" for n, d in state.scaling_factors],
            "scaling_factors_used": [f"{n}/{d}" for n, d in _fast_factors(state)],
            "reason": state.reason,
        },
        "opencv": {"version": cv2.__version__, "threads": cv2.getNumThreads()},
    }


def _fast_factors(state: TurboState) -> list[tuple[int, int]]:
    return [f for f in FACTORS if f in state.scaling_factors]


def _loaded_library_path(name: str) -> str | None:
    """Path of a shared library mapped into this process whose file name starts with ``name``."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if path.rsplit("/", 1)[-1].startswith(name):
                    return path
    except OSError:
        pass
    return None
