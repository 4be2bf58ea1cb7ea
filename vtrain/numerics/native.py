"""The optional C kernels of the numerics (``csrc/numerics/*.c``, built by ``make native`` into
``vtrain/numerics/_kernels.so``).

Each kernel computes exactly what its numpy reference in :mod:`vtrain.numerics` computes (the same
IEEE operations in the same order, compiled with ``-ffp-contract=off``), in one pass and without
numpy's fixed cost per call; the references stay the fallback and are tested against the kernels.

``VTRAIN_NATIVE_NUMERICS=0`` disables the library; ``VTRAIN_NATIVE_NUMERICS_LIB`` names another
file. When it is absent or unloadable, one warning is logged and the numpy path is used.
"""

from __future__ import annotations

import ctypes
import logging
import os
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

#: Where ``make native`` puts the library (next to this module).
LIB_PATH = Path(__file__).with_name("_kernels.so")
#: The library's ABI (csrc/numerics/abi.c): bumped with every kernel added or changed, so a stale
#: build is refused whole (numpy, same bits) rather than missing a symbol at import.
_ABI_VERSION = 8


def _load() -> ctypes.CDLL | None:
    if os.environ.get("VTRAIN_NATIVE_NUMERICS", "1") == "0":
        log.info("native numerics kernels disabled by VTRAIN_NATIVE_NUMERICS=0; using numpy")
        return None
    path = Path(os.environ.get("VTRAIN_NATIVE_NUMERICS_LIB", LIB_PATH))
    try:
        lib = ctypes.CDLL(str(path))
        version = lib.vt_numerics_abi_version()
    except (OSError, AttributeError) as e:
        log.warning("native numerics kernels unavailable (%s); using numpy (same bits, slower). "
                    "Build them with `make native` (needs a C compiler).", e)
        return None
    if version != _ABI_VERSION:
        log.warning("native numerics kernels: expected ABI version %d, got %d from %s; using numpy. "
                    "Rebuild with `make native`.", _ABI_VERSION, version, path)
        return None
    return lib


_LIB = _load()


def available() -> bool:
    """True when the C kernels are loaded (the fast path is used)."""
    return _LIB is not None


def lib() -> ctypes.CDLL | None:
    """The loaded library, or None (callers then use their numpy reference)."""
    return _LIB


def set_threads(n: int) -> int:
    """The threads the large kernels may use from now on (``csrc/numerics/parallel.c``: a kernel cuts
    a large array into at most ``n`` parts, each computed by the same operations, so the bits do not
    depend on ``n``); returns the count in use (1 without the library). The executor sets torch's
    thread count before each step: kernels and torch never run at once, so ``--threads N`` means at
    most N busy threads."""
    if _LIB is None:
        return 1
    return int(_LIB.vt_set_threads(int(n)))


def ptr(a: np.ndarray) -> int:
    """The address of a C-contiguous numpy array's data, for a ``ctypes.c_void_p`` argument."""
    if not a.flags.c_contiguous:
        raise ValueError("native numerics: expected a C-contiguous array")
    return a.ctypes.data
