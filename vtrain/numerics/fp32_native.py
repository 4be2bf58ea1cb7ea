"""FP32-exact elementwise ops in one native pass (``csrc/numerics/fp32.c``).

``binary(code, a, b, shape)`` computes ``a OP b`` (one IEEE binary32 add, sub, mul or div per
element, broadcast to ``shape``), adds ``+0.0`` (canonical zeros) and reports whether every result
is finite, in one pass: the bits of ``torch.<op>(a, b) + 0.0`` on the CPU (both are one correctly
rounded FP32 operation per element), without torch's two extra passes (the zero and the min/max
probe) and its fixed cost per call. ``sqrt(a)``: ``RN32(sqrt(a)) + 0.0`` and finiteness, the bits
of the FP64 path (``torch.sqrt`` of the FP64 input rounded to FP32: both square roots are correctly
rounded and the double rounding is innocuous). :class:`Chain`: a fixed chain of those ops over
one shape in one pass (block by block, the inner values never written out): each op's bits.

The torch / FP64 paths stay the fallback (:func:`available` False: library absent or
``VTRAIN_NATIVE_NUMERICS=0``); tests compare the two bit for bit (``tests/test_native_fp32.py``).
"""

from __future__ import annotations

import ctypes
import functools
import math
from collections.abc import Callable
from typing import NamedTuple

import torch

from vtrain.numerics import native

Empty = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]
"""``empty(shape, dtype)``: how a kernel's output buffer is made (a buffer pool's; None: ``torch.empty``)."""

ADD, SUB, MUL, DIV = 0, 1, 2, 3
"""Op codes of ``vt_fp32_binary``."""

_MAX_DIMS = 16
_MAX_LAYOUTS = 4096

_LIB = native.lib()
_FN = getattr(_LIB, "vt_fp32_binary", None) if _LIB is not None else None
if _FN is not None:
    _FN.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 6 + [ctypes.c_int]
    _FN.restype = ctypes.c_int
_SQRT = getattr(_LIB, "vt_fp32_sqrt", None) if _LIB is not None else None
if _SQRT is not None:
    _SQRT.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    _SQRT.restype = ctypes.c_int
_TRANSPOSE = getattr(_LIB, "vt_transpose32", None) if _LIB is not None else None
if _TRANSPOSE is not None:
    _TRANSPOSE.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    _TRANSPOSE.restype = None

_CHAIN = getattr(_LIB, "vt_fp32_chain", None) if _LIB is not None else None
if _CHAIN is not None:
    _CHAIN.argtypes = [ctypes.c_int64, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_int32, ctypes.c_void_p]
    _CHAIN.restype = ctypes.c_int

SQRT = 4
"""Op code of a :class:`Chain` step (besides ADD, SUB, MUL, DIV)."""

SCALAR, FULL, ROWS, TILE = 0, 1, 2, 3
"""How a :class:`Chain` input is read: one value for all elements; element ``i`` at ``i``; at
``i // param`` (one value per row of ``param`` elements); at ``i % param`` (a tile repeated)."""


def broadcast_kind(src: tuple[int, ...], shape: tuple[int, ...]) -> tuple[int, int] | None:
    """``(kind, param)`` of a :class:`Chain` input of shape ``src`` broadcast to ``shape`` (same rank),
    or None when it is none of the four forms."""
    n = math.prod(shape)
    if tuple(src) == tuple(shape):
        return FULL, n
    if math.prod(src) == 1:
        return SCALAR, 1
    if len(src) != len(shape):
        return None
    for k in range(len(shape) + 1):
        if tuple(src[:k]) == tuple(shape[:k]) and all(d == 1 for d in src[k:]):
            return ROWS, math.prod(shape[k:])
        if all(d == 1 for d in src[:k]) and tuple(src[k:]) == tuple(shape[k:]):
            return TILE, math.prod(src)
    return None

# (shape, a's shape and strides, b's shape and strides) -> the kernel's int64 arrays (kept alive here)
_LAYOUTS: dict[tuple, tuple[int, int, int, int, tuple]] = {}


def available() -> bool:
    """True when the native kernels are loaded."""
    return _FN is not None and _SQRT is not None


def _broadcast_strides(t: torch.Tensor, shape: tuple[int, ...]) -> list[int]:
    if t.dim() == 0:
        return [0] * len(shape)
    if t.dim() != len(shape):
        raise ValueError(f"fp32 kernel: expected rank {len(shape)} or a scalar, got shape {tuple(t.shape)}")
    out = []
    for n, m, s in zip(t.shape, shape, t.stride(), strict=True):
        if n == m:
            out.append(s)
        elif n == 1:
            out.append(0)
        else:
            raise ValueError(f"fp32 kernel: shape {tuple(t.shape)} does not broadcast to {shape}")
    return out


def _layout(shape: tuple[int, ...], a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int, int, tuple]:
    key = (shape, a.shape, a.stride(), b.shape, b.stride())
    got = _LAYOUTS.get(key)
    if got is None:
        if len(shape) > _MAX_DIMS:
            raise ValueError(f"fp32 kernel: expected at most {_MAX_DIMS} dims, got {len(shape)}")
        arr = ctypes.c_int64 * max(1, len(shape))
        sa, sb, sh = arr(*_broadcast_strides(a, shape)), arr(*_broadcast_strides(b, shape)), arr(*shape)
        got = (ctypes.addressof(sa), ctypes.addressof(sb), ctypes.addressof(sh), len(shape), (sa, sb, sh))
        if len(_LAYOUTS) >= _MAX_LAYOUTS:  # a graph has a few dozen; never grow without bound
            _LAYOUTS.clear()
        _LAYOUTS[key] = got
    return got


def binary(
    code: int, a: torch.Tensor, b: torch.Tensor, shape: tuple[int, ...], out: torch.Tensor | None = None
) -> tuple[torch.Tensor, bool] | None:
    """``(a OP b + 0.0, all finite)`` as a contiguous FP32 CPU tensor of ``shape``; None when the
    kernel does not apply (not loaded, or an input not an FP32 CPU tensor): use torch then.

    ``a`` and ``b``: FP32 tensors of ``shape``'s rank broadcasting to it, or 0-dim (a scalar),
    with any strides (views are read in place). ``out``: a contiguous FP32 CPU buffer of as many
    elements to write into (it must not overlap ``a`` or ``b``); a fresh tensor when None."""
    if _FN is None or a.dtype is not torch.float32 or b.dtype is not torch.float32 or not (a.is_cpu and b.is_cpu):
        return None
    pa, pb, psh, nd, _ = _layout(shape, a, b)
    if out is None:
        out = torch.empty(shape, dtype=torch.float32)
    else:
        if out.dtype is not torch.float32 or not out.is_cpu or not out.is_contiguous():
            raise ValueError(f"fp32 kernel: out must be a contiguous float32 CPU tensor, got {out.dtype} {out.device}")
        out = out.view(shape)
    ok = _FN(code, a.data_ptr(), pa, b.data_ptr(), pb, out.data_ptr(), psh, nd)
    if ok < 0:
        raise ValueError(f"fp32 kernel: bad arguments (op {code}, {nd} dims)")
    return out, ok == 1


def sqrt(a: torch.Tensor, out: torch.Tensor | None = None) -> tuple[torch.Tensor, bool] | None:
    """``(RN32(sqrt(a)) + 0.0, all finite)`` for a contiguous FP32 CPU tensor ``a`` (None when the
    kernel does not apply: use the FP64 path then); ``out`` as in :func:`binary`."""
    if _SQRT is None or a.dtype is not torch.float32 or not a.is_cpu or not a.is_contiguous():
        return None
    if out is None:
        out = torch.empty(a.shape, dtype=torch.float32)
    else:
        if out.dtype is not torch.float32 or not out.is_cpu or not out.is_contiguous():
            raise ValueError(f"fp32 kernel: out must be a contiguous float32 CPU tensor, got {out.dtype} {out.device}")
        out = out.view(a.shape)
    ok = _SQRT(a.data_ptr(), out.data_ptr(), a.numel())
    return out, ok == 1


def swaps_last_two(perm: tuple[int, ...]) -> bool:
    """Whether ``perm`` keeps the leading axes and swaps the last two (what :func:`transpose` moves)."""
    n = len(perm)
    return n >= 2 and tuple(perm) == (*range(n - 2), n - 1, n - 2)


@functools.lru_cache(maxsize=1024)
def block_swap(perm: tuple[int, ...]) -> tuple[int, int] | None:
    """``(lead, split)`` where ``perm`` keeps the axes before ``lead`` and swaps the blocks of axes
    ``[lead, split)`` and ``[split, n)`` (a transpose of ``[rows, cols]`` matrices once those blocks
    are merged: :func:`permute`); None for any other permutation."""
    n = len(perm)
    perm = tuple(perm)
    for lead in range(n - 1):
        if perm[:lead] != tuple(range(lead)):
            break
        for split in range(lead + 1, n):
            if perm[lead:] == (*range(split, n), *range(lead, split)):
                return lead, split
    return None


def permute(a: torch.Tensor, perm: tuple[int, ...]) -> torch.Tensor | None:
    """``a.permute(*perm).contiguous()`` (the bits copied) by :func:`transpose` where ``perm`` is a
    :func:`block_swap`; None where it is not, or the kernel does not apply (use torch then)."""
    got = block_swap(tuple(perm))  # (cached: a graph has few distinct permutations)
    if got is None or _TRANSPOSE is None or a.dtype is not torch.float32 or not a.is_cpu or not a.is_contiguous():
        return None
    lead, split = got
    shape = tuple(a.shape)
    rows, cols = math.prod(shape[lead:split]), math.prod(shape[split:])
    out = torch.empty(tuple(shape[i] for i in perm), dtype=torch.float32)
    if out.numel():
        _TRANSPOSE(a.data_ptr(), a.numel() // (rows * cols), rows, cols, out.data_ptr())
    return out


class PermutePlan(NamedTuple):
    """:func:`permute` of a C-contiguous input of one shape, worked out once (:func:`permute_plan`)."""

    shape: tuple[int, ...]
    out_shape: tuple[int, ...]
    batches: int
    rows: int
    cols: int


def permute_plan(shape: tuple[int, ...], perm: tuple[int, ...]) -> PermutePlan | None:
    """What :func:`permute` computes for an input of ``shape`` (:func:`permute_planned` takes it); None
    where it would not apply whatever the input (not a :func:`block_swap`, the kernel not loaded)."""
    got = block_swap(tuple(perm))
    if got is None or _TRANSPOSE is None:
        return None
    lead, split = got
    shape = tuple(shape)
    rows, cols = math.prod(shape[lead:split]), math.prod(shape[split:])
    n = math.prod(shape)
    return PermutePlan(shape, tuple(shape[i] for i in perm), n // (rows * cols) if n else 0, rows, cols)


def permute_planned(a: torch.Tensor, plan: PermutePlan, empty: Empty | None = None) -> torch.Tensor | None:
    """:func:`permute` of ``a`` by ``plan`` (the same bits, the same None), ``a`` of ``plan.shape``;
    ``empty(shape, dtype)`` makes the output (a pool's, :class:`vtrain.graph.buffers.BufferPool`; None:
    ``torch.empty``)."""
    if a.dtype is not torch.float32 or not a.is_cpu or not a.is_contiguous() or a.shape != plan.shape:
        return None
    out = torch.empty(plan.out_shape, dtype=torch.float32) if empty is None else empty(plan.out_shape, torch.float32)
    if plan.batches:
        _TRANSPOSE(a.data_ptr(), plan.batches, plan.rows, plan.cols, out.data_ptr())
    return out


def transpose(a: torch.Tensor) -> torch.Tensor | None:
    """``a`` with its last two axes swapped, as a fresh contiguous tensor: the bits of
    ``a.transpose(-1, -2).contiguous()`` (a copy), in cache-sized tiles. ``a``: a C-contiguous FP32
    CPU tensor of at least 2 dims; None when the kernel does not apply (use torch then)."""
    if _TRANSPOSE is None or a.dtype is not torch.float32 or not a.is_cpu or a.dim() < 2 or not a.is_contiguous():
        return None
    rows, cols = a.shape[-2], a.shape[-1]
    out = torch.empty((*a.shape[:-2], cols, rows), dtype=torch.float32)
    if out.numel():
        _TRANSPOSE(a.data_ptr(), a.numel() // (rows * cols), rows, cols, out.data_ptr())
    return out


class Chain:
    """A fixed chain of FP32-exact ops over tensors of one shape, in one native pass
    (``vt_fp32_chain``): per element exactly :func:`binary`'s and :func:`sqrt`'s operations, in
    order, so every output has their bits; the inner values are never written to memory.

    ``inputs``: one ``(source shape, kind, param)`` per input register (:func:`broadcast_kind`), read
    from a contiguous tensor of the source shape or from its broadcast view (``expand``) to ``shape``;
    then one register per step. ``steps``: ``(code, a, b)`` with ``code`` ADD/SUB/MUL/DIV/SQRT and
    ``a``, ``b`` register numbers (``b`` ignored by SQRT); ``outputs``: the step registers written to
    fresh tensors of ``shape``. ``consts``: tensors bound once to the last ``len(consts)`` input
    registers (the ops' scalars: checked and addressed here, held by the chain), which calls then
    leave out."""

    def __init__(
        self, shape: tuple[int, ...], inputs: list[tuple[tuple[int, ...], int, int]],
        steps: list[tuple[int, int, int]], outputs: list[int], consts: tuple[torch.Tensor, ...] = (),
    ) -> None:
        import numpy as np

        n_inputs = len(inputs)
        n_regs = n_inputs + len(steps)
        self.shape, self.numel = tuple(shape), math.prod(shape)
        self.n_regs, self.n_steps, self.outputs = n_regs, len(steps), list(outputs)
        kinds = np.full(n_regs, -1, dtype=np.int32)  # scratch unless an input or an output
        params = np.zeros(n_regs, dtype=np.int64)
        checks = []
        for r, (src, kind, param) in enumerate(inputs):
            kinds[r], params[r] = kind, param
            strides, acc = [], 1
            for d in reversed(src):
                strides.append(acc)
                acc *= d
            view = tuple(0 if d == 1 and m != 1 else st for d, m, st in zip(src, shape, reversed(strides)))
            checks.append((math.prod(src), view if len(src) == len(shape) else None))
        for r in self.outputs:
            kinds[r] = FULL
        self._kinds, self._params = kinds, params
        self._ops = np.array([(c, n_inputs + k, a, b) for k, (c, a, b) in enumerate(steps)], dtype=np.int32)
        self._ptrs = np.zeros(n_regs, dtype=np.uint64)
        self._args = (self._ptrs.ctypes.data, kinds.ctypes.data, params.ctypes.data, self._ops.ctypes.data)
        if len(consts) > n_inputs:
            raise ValueError(f"fp32 chain: {len(consts)} constants for {n_inputs} inputs")
        n_free = n_inputs - len(consts)
        self._checks = checks[:n_free]
        self._out_regs = [(r, self.shape) for r in self.outputs]
        self.consts = tuple(consts)
        self._bound = all(  # (else every call returns None: the caller runs the steps one by one)
            _chain_operand(t, size, view, self.shape) for t, (size, view) in zip(self.consts, checks[n_free:])
        )
        for r, t in enumerate(self.consts, start=n_free):
            self._ptrs[r] = t.data_ptr()

    def __call__(
        self, inputs: list[torch.Tensor], empty: Empty | None = None
    ) -> tuple[list[torch.Tensor], bool] | None:
        """``(outputs, all finite)``: the output tensors (in ``outputs`` order) and whether every
        step's values are finite; None when the kernel is not loaded or an input is neither a
        contiguous FP32 CPU tensor of its source's size nor its broadcast view (the caller runs the
        steps one by one then). ``inputs``: one tensor per input register but the bound ``consts``.
        ``empty(shape, dtype)`` makes the output buffers (None: ``torch.empty``)."""
        if _CHAIN is None or not self._bound:
            return None
        ptrs, shape = self._ptrs, self.shape
        if len(inputs) != len(self._checks):
            raise ValueError(f"fp32 chain: expected {len(self._checks)} inputs, got {len(inputs)}")
        for r, (t, (size, view)) in enumerate(zip(inputs, self._checks)):
            if not _chain_operand(t, size, view, shape):
                return None
            ptrs[r] = t.data_ptr()
        outs = []
        for r, sh in self._out_regs:
            t = torch.empty(sh, dtype=_F32) if empty is None else empty(sh, _F32)
            ptrs[r] = t.data_ptr()
            outs.append(t)
        a = self._args
        ok = _CHAIN(self.numel, self.n_regs, a[0], a[1], a[2], self.n_steps, a[3])
        if ok < 0:
            raise ValueError(f"fp32 chain kernel: bad arguments or no memory ({self.n_steps} steps)")
        return outs, ok == 1


_F32 = torch.float32


def _chain_operand(t: torch.Tensor, size: int, view: tuple[int, ...] | None, shape: tuple[int, ...]) -> bool:
    """Whether :class:`Chain` reads ``t`` for an input of ``size`` elements (broadcast strides ``view``)."""
    if t.dtype is not _F32 or not t.is_cpu:
        return False
    return (t.numel() == size and t.is_contiguous()) or (view is not None and t.stride() == view and t.shape == shape)
