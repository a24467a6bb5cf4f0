"""float16 and bfloat16 rounding of float32 tensors: one pass of a compiled kernel where it can be
had (:mod:`paddle_amp_ext._native`: F16C for float16, integer round-to-nearest-even for
bfloat16), else, for float16, a sequence of float32 eager kernels (``paddle._C_ops``; bfloat16's
fallback is in :mod:`paddle_amp_ext.rehearsal.rounding`).

The one-pass kernels read and write the tensors' memory through ``Tensor.data_ptr()`` (CPU,
contiguous float32 only; a strided view is first copied by ``paddle._C_ops.assign``) and
allocate outputs with ``paddle._C_ops.empty_like(x, dtype, place)``. The arithmetic path
relies on ``paddle._C_ops.{hardtanh, hardtanh_, scale, assign_out_, scale_, subtract_, add_}``;
:func:`all_finite` scans with the compiled kernel, or tests ``paddle._C_ops.sum``'s result. All
with the signatures of paddlepaddle 2.6.2 and 3.3.1 (checked on both, CPU). An auto-parallel
DistTensor is rounded and scanned through its local value (its ``data_ptr()`` is the local
value's, its ``shape`` the global one: :mod:`.autoparallel`), and :func:`all_finite` gives every
rank the same answer for it.

Why these kernels and not a cast (the measurements): "Notes for maintainers" in the docs.
"""

from __future__ import annotations

import ctypes
import math
import threading
from collections import OrderedDict
from typing import Optional

import paddle

from .._native import Rounder, bf16_rounder, finite_scanner, fp16_rounder
from . import autoparallel
from .tensors import is_float32

_C = paddle._C_ops

#: float16 rounding constants: the clip that keeps every later value finite (|x| >= 65520
#: rounds to inf); float16's smallest normal 2**-14 (the subnormal range is clipped to it); the
#: magic 0.75 whose float32 ulp is float16's subnormal quantum 2**-24; Veltkamp's split factor
#: 2**13 + 1 (keeps 11 significant bits); the overflow test: times 2**112 is inf exactly for
#: |r| >= 65536.
_CLIP = 65520.0
_NORMAL = 2.0**-14
_MAGIC = 0.75
_SPLIT = 8193.0
_OVERFLOW = 2.0**112


class Scratch:
    """Per-thread scratch float32 buffers by shape for tensors of at least ``min_numel``
    elements, at most ``max_bytes`` in all (least recently used dropped first)."""

    def __init__(self, min_numel: int = 1 << 20, max_bytes: int = 64 << 20) -> None:
        self.min_numel, self.max_bytes = min_numel, max_bytes
        self.active = False  # buffers are kept only between enable() and clear()
        self._local = threading.local()

    def enable(self) -> None:
        """Keep buffers from now on (a rehearsal starts)."""
        self.active = True

    def _buffers(self) -> OrderedDict:
        buffers = getattr(self._local, "buffers", None)
        if buffers is None:
            buffers = self._local.buffers = OrderedDict()
        return buffers

    def pays(self, numel: int) -> bool:
        """Whether buffers are kept for a tensor of ``numel`` elements now."""
        return self.active and self.min_numel <= numel and numel * 4 <= self.max_bytes

    def take(self, like: paddle.Tensor, numel: int, slot: int = 0) -> Optional[paddle.Tensor]:
        """A buffer shaped like ``like`` (contents undefined), or None: none kept for it yet."""
        if numel < self.min_numel:
            return None
        buffers = self._buffers()
        if not buffers:
            return None
        key = (tuple(like.shape), str(like.place), slot)
        entry = buffers.get(key)
        if entry is None:
            return None
        buffers.move_to_end(key)
        return entry[0]

    def keep(self, buffer: paddle.Tensor, numel: int, slot: int = 0) -> None:
        """Keep ``buffer`` (of ``numel`` float32 elements) for the next tensor of its shape."""
        if not self.pays(numel):
            return
        buffers = self._buffers()
        buffers[(tuple(buffer.shape), str(buffer.place), slot)] = (buffer, numel * 4)
        while sum(nbytes for _, nbytes in buffers.values()) > self.max_bytes:
            buffers.popitem(last=False)

    def clear(self) -> None:
        """Drop every thread's buffers and keep no more until :meth:`enable`."""
        self.active = False
        self._local = threading.local()


SCRATCH = Scratch()


def rounds_in_place(numel: int, dtype: str = "float16") -> bool:
    """Whether rounding to ``dtype`` with ``in_place=True`` writes into ``x`` (a float32 CPU
    tensor of ``numel`` elements; contiguous, for the one-pass kernels) now: always with the
    one-pass kernel; without it, for float16, large tensors while scratch buffers are kept, and
    never for bfloat16."""
    if dtype == "float16":
        return fp16_rounder() is not None or SCRATCH.pays(numel)
    return bf16_rounder() is not None


def native_rounder(dtype: str) -> Optional[Rounder]:
    """The one-pass kernel rounding float32 to ``dtype`` (``"float16"``/``"bfloat16"``), or None
    where it cannot be had."""
    return fp16_rounder() if dtype == "float16" else bf16_rounder()


def empty_float32(like: paddle.Tensor) -> paddle.Tensor:
    """A new contiguous float32 tensor shaped like ``like``, on its device; contents undefined
    (zeros for a DistTensor, placed like ``like``: :func:`.autoparallel.zeros_like`)."""
    if autoparallel.is_dist(like):
        return autoparallel.zeros_like(like)
    return _C.empty_like(like, paddle.float32, like.place)


def round_with(rounder: Rounder, x: paddle.Tensor, in_place: bool = False,
               out: Optional[paddle.Tensor] = None) -> paddle.Tensor:
    """``x`` rounded by the one-pass ``rounder``: into ``x`` itself with ``in_place``, into
    ``out`` where given, else into a new tensor. Unchecked: ``x`` (and ``out``) must be
    contiguous float32 CPU tensors of the same shape, DistTensors of the same placements (the
    caller knows); a DistTensor's local value is rounded, element by element."""
    if out is None:
        out = x if in_place else empty_float32(x)
    src, dst = autoparallel.local_value(x), autoparallel.local_value(out)
    rounder(src.data_ptr(), dst.data_ptr(), math.prod(src.shape))
    return out


def _one_pass(rounder: Optional[Rounder], x: paddle.Tensor, in_place: bool) -> Optional[paddle.Tensor]:
    """``x`` rounded by a native ``rounder``, or None where it cannot be: no kernel, an empty
    tensor, or not a float32 CPU tensor. With ``in_place`` the result is written into ``x``
    itself where ``x`` is contiguous; a strided view (a transposed attention head) is copied
    into a new contiguous tensor (``_C_ops.assign``; not ``Tensor.contiguous``, which makes
    ``x`` itself contiguous and returns it), rounded there in place."""
    numel = math.prod(x.shape)
    if rounder is None or not numel or not is_float32(x) or not x.place.is_cpu_place():
        return None
    if autoparallel.is_dist(x):
        return _one_pass_dist(rounder, x, in_place)
    if not x.is_contiguous():
        x, in_place = _C.assign(x), True  # a new tensor: its own buffer is the output
        if not x.is_contiguous():
            return None
    return round_with(rounder, x, in_place)


def _one_pass_dist(rounder: Rounder, x: paddle.Tensor, in_place: bool) -> Optional[paddle.Tensor]:
    """:func:`_one_pass` of a DistTensor: its local value rounded. A ``Partial`` one is reduced
    first (Paddle's reshard, a collective every rank enters: it rounds the same tensor at the same
    op) and the new tensor rounded in place: rounding the addends is not rounding the sum. A
    strided local value: None (Paddle's kernels then round it, by its SPMD rules)."""
    if autoparallel.is_partial(x):
        x, in_place = autoparallel.replicated(x), True
    if not autoparallel.local_value(x).is_contiguous():
        return None
    return round_with(rounder, x, in_place)


def round_to_bfloat16(x: paddle.Tensor, in_place: bool = False) -> Optional[paddle.Tensor]:
    """``x`` (float32) rounded to the nearest bfloat16 value, ties to even, by the one-pass kernel,
    as a new float32 tensor (``x`` itself with ``in_place``, where ``x`` is contiguous); None
    where that kernel cannot round ``x`` (see :func:`_one_pass`): the caller then uses Paddle's
    kernels.

    Values from ``(2 - 2**-8) * 2**127`` on become +-inf, subnormals round as bfloat16
    subnormals, the sign of zero is kept, nan stays nan (quiet). Exact for every float32 input,
    checked exhaustively (``scripts/check_fp16_rounding.py --dtype bfloat16``). Not
    differentiable by itself.
    """
    return _one_pass(bf16_rounder(), x, in_place)


def round_to_float16(x: paddle.Tensor, in_place: bool = False) -> paddle.Tensor:
    """A new float32 tensor: ``x`` (float32) rounded to the nearest float16 value, ties to even.

    With ``in_place`` where :func:`rounds_in_place` says so, the result is written into ``x``
    itself and ``x`` is returned (no fresh buffer to fault in); with the one-pass kernel, a
    strided ``x`` is rounded in a contiguous copy instead.

    Values of magnitude >= 65520 become +-inf, nan stays nan, values below float16's
    subnormal range become 0. Exact for every float32 input, checked exhaustively against
    numpy's conversion on both versions (``scripts/check_fp16_rounding.py``): the one-pass kernel
    is F16C's conversion; :func:`round_arithmetic` gives +0 where float16 keeps the sign of a
    negative zero.

    Not differentiable by itself; call it on tensors that need no gradient.
    """
    out = _one_pass(fp16_rounder(), x, in_place)
    return round_arithmetic(x, in_place) if out is None else out


def round_arithmetic(x: paddle.Tensor, in_place: bool = False) -> paddle.Tensor:
    """:func:`round_to_float16` with Paddle's float32 kernels, on any device.

    With ``in_place`` and a large ``x`` while scratch buffers are kept (:meth:`Scratch.pays`),
    the result is written into ``x`` itself and ``x`` is returned: no fresh buffer to fault in,
    for one more pass. Thirteen in-place passes over two buffers:

    1. ``u = clip(x, -2**-14, 2**-14)`` and ``e = ((u + 0.75) - 0.75) - u``: the error of
       rounding ``u`` to a multiple of 2**-24, float16's subnormal rounding; ``e`` is 0 where
       ``|x| >= 2**-14`` (``u`` is then +-2**-14, already such a multiple) and exact elsewhere;
    2. ``z = clip(x, -65520, 65520) + e``: ``x`` where it is normal, its subnormal rounding
       (at most 11 significant bits) elsewhere;
    3. Veltkamp's split ``c = 8193 z; c + (z - c)`` rounds ``z`` to 11 significant bits, ties
       to even, and leaves the subnormal roundings as they are;
    4. times 2**112 and back: inf exactly where the rounding reached 65536.
    """
    numel = math.prod(x.shape)
    scratch = SCRATCH.take(x, numel)
    if scratch is None:
        scratch = _C.hardtanh(x, -_NORMAL, _NORMAL)
    else:
        _C.assign_out_(x, scratch)
        _C.hardtanh_(scratch, -_NORMAL, _NORMAL)  # scratch = u
    out = SCRATCH.take(x, numel, 1) if in_place else None
    if out is None:
        out = _C.scale(scratch, 1.0, _MAGIC, True)
    else:
        _C.assign_out_(scratch, out)
        _C.scale_(out, 1.0, _MAGIC, True)
    _C.scale_(out, 1.0, -_MAGIC, True)
    _C.subtract_(out, scratch)  # out = e
    _C.assign_out_(x, scratch)
    _C.hardtanh_(scratch, -_CLIP, _CLIP)
    _C.add_(scratch, out)  # scratch = z
    _C.assign_out_(scratch, out)
    _C.scale_(out, _SPLIT, 0.0, True)  # out = c
    _C.subtract_(scratch, out)  # scratch = z - c
    _C.add_(out, scratch)  # out = c + (z - c): 11 significant bits
    _C.scale_(out, _OVERFLOW, 0.0, True)
    _C.scale_(out, 1.0 / _OVERFLOW, 0.0, True)  # 65536 and above: inf
    SCRATCH.keep(scratch, numel)
    if in_place and SCRATCH.pays(numel):
        _C.assign_out_(out, x)
        SCRATCH.keep(out, numel, 1)
        return x
    return out


def all_finite(tensor: paddle.Tensor) -> bool:
    """Whether no value of ``tensor`` (a non-empty float32 tensor) is inf or nan. A contiguous CPU
    tensor is scanned once by the compiled kernel (:func:`~paddle_amp_ext._native.finite_scanner`;
    about 5 us for 64K values); elsewhere its float32 sum is tested (one reduction kernel, one
    number read on the host, through ``data_ptr()`` on a CPU: about 20 us less than ``.numpy()``
    inside a backward hook), so a finite tensor whose sum overflows reads as not finite.

    A DistTensor gets the same answer on every rank, for its global value (a fix-up the answer
    decides may run collectives: :mod:`.autoparallel`): a ``Replicate`` one is scanned in its
    local value; any other is judged by its float32 sum, reduced by Paddle's reshard (a
    collective, which every rank enters: each checks the same tensor at the same op; a
    ``Partial`` one is reduced before the sum, as 2.6.2's sum of it is this rank's addend's)."""
    if autoparallel.is_dist(tensor):
        if autoparallel.same_on_every_rank(tensor):
            return all_finite(autoparallel.local_value(tensor))
        total = autoparallel.replicated(_C.sum(autoparallel.replicated(tensor), [], paddle.float32, False))
        return math.isfinite(float(autoparallel.local_value(total).numpy().reshape(-1)[0]))
    scan = finite_scanner()
    on_cpu = tensor.place.is_cpu_place()
    if scan is not None and on_cpu and is_float32(tensor) and tensor.is_contiguous():
        return bool(scan(tensor.data_ptr(), math.prod(tensor.shape)))
    total = _C.sum(tensor, [], paddle.float32, False)
    if not on_cpu:
        return bool(math.isfinite(float(total.numpy())))
    return math.isfinite(ctypes.c_float.from_address(total.data_ptr()).value)
