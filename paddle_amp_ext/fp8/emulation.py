"""``fp8_emulation()``: Paddle's FP8 entry points replaced by their CPU emulations for a while.

Installs, for the length of the ``with`` block, :mod:`.kernels`' emulations as
``paddle.incubate.nn.functional.fp8_quant_blockwise`` / ``fp8_gemm_blockwise`` /
``fused_act_dequant``, ``paddle.linalg.fp8_fp8_half_gemm_fused``, on a CPU the bfloat16
``swiglu``/``swiglu_grad`` of :mod:`.helpers`, CUDA's saturating cast for
FP8 targets of ``paddle.cast`` / ``Tensor.astype`` / ``Tensor.cast``, and, in PaddleFormers'
``paddleformers.transformers.fp8_utils`` (1.2.0 calls ``deep_gemm.fp8_gemm_nt`` in every FP8
forward with no fallback), a ``deep_gemm`` namespace; in ``paddleformers.quantization.qat_utils``
the ``fp8_fp8_half_gemm_fused`` it imported by name. Everything is restored on exit, also on an
exception; blocks nest. The patches are process-wide: other threads see the emulations while a
block runs.

Example:
    >>> import paddle_amp_ext as amp
    >>> with amp.fp8_emulation():  # doctest: +SKIP
    ...     y = FP8Linear(256, 512)(x)   # PaddleFormers' layer, on a CPU
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Iterator, List, Tuple

import paddle

from .._compat.fp8 import swiglu_grad_slot
from ..errors import AmpUnsupportedError
from . import helpers, kernels

_MISSING = object()


def _deep_gemm() -> types.SimpleNamespace:
    return types.SimpleNamespace(
        fp8_gemm_nt=kernels.fp8_gemm_nt,
        gemm_fp8_fp8_bf16_nt=kernels.fp8_gemm_nt,
        m_grouped_fp8_gemm_nt_contiguous=kernels.m_grouped_fp8_gemm_nt_contiguous,
        m_grouped_gemm_fp8_fp8_bf16_nt_contiguous=kernels.m_grouped_fp8_gemm_nt_contiguous,
        set_num_sms=lambda num: None,
        get_num_sms=lambda: 112,
        emulated=True,
    )


def _saturating(original):
    def cast(x, dtype, *args, **kwargs):
        if str(dtype).replace("paddle.", "") in kernels._FP8_DTYPES and isinstance(x, paddle.Tensor):
            return kernels.cast(x, dtype)
        return original(x, dtype, *args, **kwargs)

    cast.__wrapped__ = original
    return cast


def _patches(casts: bool) -> List[Tuple[object, str, object]]:
    import paddle.incubate.nn.functional as incubate_f

    patches: List[Tuple[object, str, object]] = [
        (incubate_f, "fp8_quant_blockwise", kernels.fp8_quant_blockwise),
        (incubate_f, "fp8_gemm_blockwise", kernels.fp8_gemm_blockwise),
        (incubate_f, "fused_act_dequant", kernels.fused_act_dequant),
        (paddle.linalg, "fp8_fp8_half_gemm_fused", kernels.fp8_fp8_half_gemm_fused),
    ]
    if casts:
        patches += [(paddle, "cast", _saturating(paddle.cast)),
                    (paddle.Tensor, "astype", _saturating(paddle.Tensor.astype)),
                    (paddle.Tensor, "cast", _saturating(paddle.Tensor.cast))]
    if paddle.device.get_device() == "cpu":  # the CPU's swiglu has no bfloat16 kernel
        patches.append((*swiglu_grad_slot(), helpers.swiglu_grad))
    fp8_utils = sys.modules.get("paddleformers.transformers.fp8_utils")
    if fp8_utils is not None:
        patches.append((fp8_utils, "deep_gemm", _deep_gemm()))
        if paddle.device.get_device() == "cpu":
            patches.append((fp8_utils, "swiglu", helpers.swiglu))
    qat = sys.modules.get("paddleformers.quantization.qat_utils")
    if qat is not None and hasattr(qat, "fp8_fp8_half_gemm_fused"):
        patches.append((qat, "fp8_fp8_half_gemm_fused", kernels.fp8_fp8_half_gemm_fused))
    return patches


@contextlib.contextmanager
def fp8_emulation(*, casts: bool = True) -> Iterator[None]:
    """Run Paddle's (and PaddleFormers') FP8 kernels as CPU emulations inside the block.

    Args:
        casts: also make casts to ``float8_e4m3fn``/``float8_e5m2`` saturate as on CUDA (Paddle's
            CPU cast turns 479 into NaN); False leaves ``paddle.cast``/``astype`` alone.

    Raises:
        AmpUnsupportedError: this Paddle has no FP8 dtypes (Paddle 2.6: they arrived in 3.0).

    Import PaddleFormers' ``fp8_utils`` (or ``qat_utils``) before entering, so its names are
    patched too. The emulated kernels sync to host (they compute in numpy).
    """
    if not hasattr(paddle, "float8_e4m3fn"):
        raise AmpUnsupportedError(
            f"fp8_emulation needs FP8 dtypes, which Paddle {paddle.__version__} does not have "
            "(paddle.float8_e4m3fn arrived in Paddle 3.0); install Paddle 3.x")
    applied: List[Tuple[object, str, object]] = []
    try:
        for owner, attr, new in _patches(casts):
            applied.append((owner, attr, owner.__dict__.get(attr, _MISSING) if isinstance(owner, type)
                            else getattr(owner, attr, _MISSING)))
            setattr(owner, attr, new)
        yield
    finally:
        for owner, attr, old in reversed(applied):
            if old is _MISSING:
                delattr(owner, attr)
            else:
                setattr(owner, attr, old)
