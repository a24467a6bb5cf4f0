"""Paddle's FP8 kernels, emulated on a CPU with the GPU's arithmetic.

Each function takes and returns Paddle tensors like the entry point it stands for (FP8 tensors
in ``float8_e4m3fn``), checks what the GPU kernel checks, and computes in float32 the way the
CUDA source does: the quantization through :func:`~paddle_amp_ext.fp8.blocks.quantize_blocks`
(the FP8 linears' quantizer: the compiled kernel where it can be had), the rest in numpy. The
sources followed (Paddle ``develop``, read through the code search;
``fp8_quant_blockwise_kernel.cu`` at commit 020de3c53ae5, where ``ScaleWrapper`` is about lines
133-162; the functions are named so that another version can be checked):

- :func:`fp8_quant_blockwise`: ``paddle/phi/kernels/legacy/gpu/fp8_quant_blockwise_kernel.cu``:
  ``ScaleWrapper`` (the scale is ``448 / max(amax, epsilon)`` in float32; 1 when that max is 0;
  ``2**127`` (power of 2) or ``0x1.FEp127`` when the quotient is inf; 0 when it is 0; with
  power-of-2 scaling the quotient keeps only its exponent, i.e. rounds *down* to a power of 2),
  ``quantize_128x128_kernel`` / ``quantize_1x128_kernel`` / ``quant_per_token_per_block_padding``
  (the amax is a NaN-ignoring ``fmaxf`` reduction of ``|x|``; values are ``x * scale`` in float32
  cast by ``__nv_fp8_e4m3(float)``, i.e. SATFINITE; the stored scale is ``1.0f / scale``);
  shapes and checks from ``Fp8QuantBlockwiseInferMeta`` (``paddle/phi/infermeta/unary.cc``).
- :func:`fp8_gemm_blockwise`: ``paddle/phi/kernels/legacy/gpu/fp8_gemm_blockwise_kernel.cu``
  (``cublas_gemm_blockwise_impl``: cuBLASLt, ``CUBLAS_COMPUTE_32F``, VEC128 (1-D) or BLK128x128
  (2-D) scale modes, "2Dx2D scaling is not supported", fast accumulation off, ``beta = 1`` when
  accumulating into ``out``; output bfloat16 or float32).
- :func:`fp8_fp8_half_gemm_fused`: ``D = act(scale * (x @ y) + bias)`` in float32, then fp16/bf16.
- :func:`fp8_gemm_nt` / :func:`m_grouped_fp8_gemm_nt_contiguous`: DeepGEMM's entry points as
  PaddleFormers' ``fp8_utils.py`` calls them (lhs 1x128 scales ``[M, K/128]``, rhs 128x128
  scales ``[N/128, K/128]``, bfloat16 out written in place).

Accumulation: the emulation multiplies the dequantized operands (FP8 value times its block's
scale, exact in float32 for power-of-2 scales) in float32 and sums in float32. cuBLASLt and
DeepGEMM also end in float32, but Hopper's FP8 Tensor Cores keep only about 14 bits in the
accumulator *within* each promotion interval (DeepSeek-V3 report, section 3.3.2); with fast
accumulation off the partial sums are promoted to float32 every 128 (DeepGEMM: every block of K)
products. So the GPU's result differs from this one by the float32 summation order plus up to
about ``2**-14`` relative per 128-term partial sum; the FP8 page of the documentation says more.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import paddle

from .blocks import quantize_blocks
from .formats import E4M3FN, fp8_format, quantize, to_bits

BLOCK = 128
_FP8_DTYPES = ("float8_e4m3fn", "float8_e5m2")
#: Paddle's own cast, held here so that fp8_emulation's saturating cast can call these functions
_ASTYPE = paddle.Tensor.astype


def _name(dtype: object) -> str:
    return str(dtype).replace("paddle.", "")


def to_numpy(t: paddle.Tensor) -> np.ndarray:
    """A float32 numpy copy of ``t`` (FP8, bfloat16, float16 or float32); exact. Syncs to host."""
    return _ASTYPE(t, "float32").numpy() if _name(t.dtype) != "float32" else t.numpy()


def from_fp8_values(values: np.ndarray, dtype: str = "float8_e4m3fn") -> paddle.Tensor:
    """A Paddle FP8 tensor holding ``values``, which must already be FP8 values (from
    :func:`~paddle_amp_ext.fp8.formats.quantize`), stored by bit pattern: Paddle's CPU cast
    turns NaN into 448 (measured on 3.3.1), so it is not used."""
    bits = to_bits(values, fp8_format(dtype))
    return paddle.to_tensor(np.ascontiguousarray(bits)).view(getattr(paddle, dtype))


# ---- the arithmetic of fp8_quant_blockwise_kernel.cu ---------------------------------------------

def quant_blocks(x: np.ndarray, one_by_128: bool, epsilon: float = 0.0, pow2: bool = True
                 ) -> Tuple[np.ndarray, np.ndarray]:
    """``quantize_1x128_kernel`` (rows of ``x`` [R, C] in 1x128 blocks) or
    ``quantize_128x128_kernel`` (128x128 blocks) to e4m3fn: (FP8 values [R, C], ``1.0f / scale``
    per block [R, C/128] or [R/128, C/128]). The amax (NaN-ignoring ``fmaxf``), the scale
    (``ScaleWrapper``: :func:`~paddle_amp_ext.fp8.blocks.scale_from_amax`) and the SATFINITE
    rounding of ``x * scale`` are :func:`~paddle_amp_ext.fp8.blocks.quantize_blocks`'s, in one
    call of the compiled kernel where it can be had. Blocks past the edge are partial (the
    callers check the GPU kernel's multiples of 128 first)."""
    out = quantize_blocks(x, (1, BLOCK) if one_by_128 else (BLOCK, BLOCK), None, E4M3FN, dequant=False,
                          epsilon=epsilon, pow2=pow2)
    with np.errstate(divide="ignore"):
        return out.values, np.float32(1.0) / out.scales


def _check_quant_input(x: paddle.Tensor, one_by_128: bool, transpose: bool) -> Tuple[int, int]:
    if not isinstance(x, paddle.Tensor):
        raise TypeError(f"fp8_quant_blockwise expects a paddle.Tensor. Received: {type(x).__name__}")
    if len(x.shape) != 2:
        raise ValueError(f"fp8_quant_blockwise: Input must have exactly 2 dimensions. Received shape {list(x.shape)}")
    if _name(x.dtype) not in ("bfloat16", "float16"):
        raise TypeError(f"fp8_quant_blockwise: X datatype error, can only be bfloat16 or float16 (the GPU kernel's "
                        f"check). Received: {_name(x.dtype)}; cast with x.astype('bfloat16')")
    rows, cols = x.shape
    if cols % BLOCK:
        raise ValueError(f"fp8_quant_blockwise: The last dim of Input(X) should be exactly divided by 128, but got "
                         f"{cols}; pad it (PaddleFormers' FP8LinearFunctionBase.padding does)")
    if rows % BLOCK and (transpose or not one_by_128):
        raise ValueError(f"fp8_quant_blockwise: The first dim of Input(X) should be exactly divided by 128 for "
                         f"{'input_transpose' if transpose else 'quant_method=128x128'}, but got {rows}; pad the rows")
    return rows, cols


def _scale_tensor(scale: np.ndarray, transpose: bool) -> paddle.Tensor:
    return paddle.to_tensor(np.ascontiguousarray(scale.T if transpose else scale))


def fp8_quant_blockwise(x: paddle.Tensor, epsilon: float = 0.0, input_transpose: bool = False,
                        output_scale_transpose: bool = True, return_transpose_only: bool = False,
                        using_pow2_scale: bool = True, using_ue8m0_scale: bool = False,
                        quant_method: str = "1x128", output_type: str = "e4m3", name: Optional[str] = None):
    """Emulates ``paddle.incubate.nn.functional.fp8_quant_blockwise``; same arguments and returns.

    Returns (as Paddle's): ``(out, scale)``; with ``input_transpose`` ``(out, scale, out_t,
    scale_t)``, or ``(out_t, scale_t)`` with ``return_transpose_only``. ``out`` is
    ``float8_e4m3fn``, ``scale`` float32 holding ``1/scale`` per block. Syncs to host.

    Raises:
        ValueError: unknown ``quant_method``/``output_type``; a shape the GPU kernel refuses.
        TypeError: ``x`` is not a bfloat16/float16 tensor.
        NotImplementedError: ``using_ue8m0_scale=True`` (packed int32 scales) is not emulated.
    """
    if quant_method not in ("1x128", "128x128"):
        raise ValueError(f"Unsupported quantization method {quant_method!r}: expected '1x128' or '128x128'")
    if output_type != "e4m3":
        raise ValueError(f"Unsupported output type {output_type!r}: fp8_quant_blockwise supports only 'e4m3'")
    if using_ue8m0_scale:
        raise NotImplementedError("fp8_quant_blockwise(using_ue8m0_scale=True) is not emulated: use float32 scales")
    one = quant_method == "1x128"
    _check_quant_input(x, one, input_transpose)
    data = to_numpy(x)
    only_transposed = input_transpose and return_transpose_only
    if not (only_transposed and one):
        q, s = quant_blocks(data, one, epsilon, using_pow2_scale)
    outputs = []
    if not only_transposed:
        outputs += [from_fp8_values(q), _scale_tensor(s, output_scale_transpose)]
    if input_transpose:  # 1x128: blocks down the columns; 128x128: the same blocks, transposed
        q_t, s_t = quant_blocks(data.T, True, epsilon, using_pow2_scale) if one else (q.T, s.T)
        outputs += [from_fp8_values(q_t), _scale_tensor(s_t, output_scale_transpose)]
    return tuple(outputs)


# ---- the GEMMs -----------------------------------------------------------------------------------

def _check_fp8(t: object, what: str) -> np.ndarray:
    if not isinstance(t, paddle.Tensor) or _name(t.dtype) not in _FP8_DTYPES:
        got = _name(t.dtype) if isinstance(t, paddle.Tensor) else type(t).__name__
        raise TypeError(f"{what} must be FP8 (float8_e4m3fn or float8_e5m2). Received: {got}")
    if len(t.shape) != 2:
        raise ValueError(f"{what} must be 2D. Received shape {list(t.shape)}")
    return to_numpy(t)


def _expand(scale: np.ndarray, rows: int, k: int, one_d: bool, what: str) -> np.ndarray:
    """The per-element scale of a [rows, k] operand from its 1-D ([ceil(k/128), rows]) or 2-D
    ([ceil(rows/128), ceil(k/128)]) block scales."""
    kb, rb = -(-k // BLOCK), -(-rows // BLOCK)
    want = (kb, rows) if one_d else (rb, kb)
    if tuple(scale.shape) != want:
        raise ValueError(f"{what} has shape {list(scale.shape)}; expected {list(want)} for "
                         f"{'1-D (1x128)' if one_d else '2-D (128x128)'} scales of a [{rows}, {k}] operand")
    if one_d:
        return np.repeat(scale.T, BLOCK, axis=1)[:, :k]
    return np.repeat(np.repeat(scale, BLOCK, axis=0), BLOCK, axis=1)[:rows, :k]


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in float32 by Paddle's CPU GEMM (float32 accumulation). numpy's multi-threaded
    BLAS is avoided: next to Paddle's threads on a busy machine it ran 40 times slower."""
    if a.shape[0] == 0 or a.shape[1] == 0 or b.shape[1] == 0:  # Paddle 2.6's matmul refuses empty operands
        return np.zeros((a.shape[0], b.shape[1]), np.float32)
    return paddle.matmul(paddle.to_tensor(np.ascontiguousarray(a, np.float32)),
                         paddle.to_tensor(np.ascontiguousarray(b, np.float32))).numpy()


def blockwise_matmul(a: np.ndarray, sa: np.ndarray, b: np.ndarray, sb: np.ndarray,
                     a_1d: bool = True, b_1d: bool = True) -> np.ndarray:
    """``a @ b.T`` of FP8 values with their block scales, in float32 (the numpy core)."""
    with np.errstate(invalid="ignore", over="ignore"):
        lhs = a * _expand(sa, a.shape[0], a.shape[1], a_1d, "a_decode_scale")
        rhs = b * _expand(sb, b.shape[0], b.shape[1], b_1d, "b_decode_scale")
    return matmul(lhs, rhs.T)


def _write(result: np.ndarray, out: Optional[paddle.Tensor], dtype: str) -> paddle.Tensor:
    tensor = _ASTYPE(paddle.to_tensor(result), dtype)
    if out is None:
        return tensor
    paddle.assign(tensor, output=out)
    return out


def fp8_gemm_blockwise(a, a_decode_scale, b, b_decode_scale, out_dtype, out=None, bias=None, accumulate=False,
                       use_split_accumulator=True, is_a_1d_scaled=True, is_b_1d_scaled=True):
    """Emulates ``paddle.incubate.nn.functional.fp8_gemm_blockwise``: ``a @ b.T`` [M, N].

    ``a`` [M, K] and ``b`` [N, K] are FP8; their scales float32, 1-D ``[ceil(K/128), rows]`` or
    2-D ``[ceil(rows/128), ceil(K/128)]``. With ``out`` and ``accumulate``, ``out += a @ b.T``
    (cuBLASLt's ``beta = 1``, summed in float32 before the cast to ``out``'s dtype), in place.
    Syncs to host.

    Raises:
        TypeError: an operand is not FP8, a scale not float32, or ``out_dtype`` not bf16/fp32.
        ValueError: shapes that do not fit, 2-D scales on both sides, or a bias (not supported).
    """
    if bias is not None:
        raise ValueError("fp8_gemm_blockwise: Bias is not supported (Paddle asserts bias is None)")
    if not is_a_1d_scaled and not is_b_1d_scaled:
        raise ValueError("fp8_gemm_blockwise: 2Dx2D scaling is not supported (cuBLASLt); scale one side 1x128")
    dtype = _name(out.dtype if out is not None else out_dtype)
    if dtype not in ("bfloat16", "float32"):
        raise TypeError(f"fp8_gemm_blockwise: D must be BFloat16 or float. Received: {dtype}")
    lhs, rhs = _check_fp8(a, "A"), _check_fp8(b, "B")
    if lhs.shape[1] != rhs.shape[1]:
        raise ValueError(f"fp8_gemm_blockwise: a is {list(lhs.shape)} and b is {list(rhs.shape)}; both must be [*, K]")
    for scale, what in ((a_decode_scale, "a_decode_scale"), (b_decode_scale, "b_decode_scale")):
        if not isinstance(scale, paddle.Tensor) or _name(scale.dtype) != "float32":
            raise TypeError(f"fp8_gemm_blockwise: {what} must be float")
    result = blockwise_matmul(lhs, to_numpy(a_decode_scale), rhs, to_numpy(b_decode_scale), is_a_1d_scaled,
                              is_b_1d_scaled)
    if out is not None:
        if list(out.shape) != [lhs.shape[0], rhs.shape[0]]:
            raise ValueError(f"Expected shape {(lhs.shape[0], rhs.shape[0])}, got {list(out.shape)}")
        if accumulate:
            result = result + to_numpy(out)
    return _write(result, out, dtype)


_ACTS = {"identity": lambda v: v, "relu": lambda v: np.maximum(v, np.float32(0))}


def fp8_fp8_half_gemm_fused(x, y, transpose_x=False, transpose_y=False, bias=None, scale=1.0,
                            output_dtype="float16", act="identity", name=None):
    """Emulates ``paddle.linalg.fp8_fp8_half_gemm_fused``: ``act(scale * x @ y + bias)``.

    ``x``, ``y`` FP8 (``[..., M, K]``, ``[..., K, N]`` before the transposes); the product and the
    epilogue in float32, then ``output_dtype`` (``float16``/``bfloat16``). Syncs to host.

    Raises:
        TypeError: an operand is not FP8.
        ValueError: an ``output_dtype``/``act`` the kernel does not have, or shapes that do not fit.
    """
    if output_dtype not in ("float16", "bfloat16"):
        raise ValueError(f"The output_dtype must be float16 or bfloat16. Received: {output_dtype!r}")
    if act not in _ACTS:
        raise ValueError(f"act must be one of {sorted(_ACTS)} in the emulation. Received: {act!r}")
    mats = []
    for t, what, trans in ((x, "x", transpose_x), (y, "y", transpose_y)):
        if not isinstance(t, paddle.Tensor) or _name(t.dtype) not in _FP8_DTYPES or len(t.shape) < 2:
            raise TypeError(f"fp8_fp8_half_gemm_fused: {what} must be an FP8 tensor of rank >= 2")
        v = to_numpy(t)
        mats.append(np.swapaxes(v, -1, -2) if trans else v)
    if mats[0].shape[-1] != mats[1].shape[-2]:
        raise ValueError(f"fp8_fp8_half_gemm_fused: x is {list(mats[0].shape)} and y {list(mats[1].shape)} "
                         "after the transposes; their inner dimensions differ")
    with np.errstate(invalid="ignore", over="ignore"):
        acc = (matmul(mats[0], mats[1]) if mats[0].ndim == 2 and mats[1].ndim == 2
               else np.matmul(mats[0], mats[1]).astype(np.float32)) * np.float32(scale)
        if bias is not None:
            acc = acc + to_numpy(bias)
        return _ASTYPE(paddle.to_tensor(_ACTS[act](acc).astype(np.float32)), output_dtype)


def fused_act_dequant(x: paddle.Tensor, x_scale: paddle.Tensor) -> paddle.Tensor:
    """Emulates ``fused_act_dequant``: FP8 ``x`` [M, N] times its 1x128 scales [M, ceil(N/128)], as bf16."""
    values = _check_fp8(x, "x")
    scale = to_numpy(x_scale)
    rows, cols = values.shape
    if tuple(scale.shape) != (rows, -(-cols // BLOCK)):
        raise ValueError(f"fused_act_dequant: x_scale is {list(scale.shape)}; expected [{rows}, {-(-cols // BLOCK)}]")
    with np.errstate(invalid="ignore", over="ignore"):
        return _ASTYPE(paddle.to_tensor(values * np.repeat(scale, BLOCK, axis=1)[:, :cols]), "bfloat16")


def cast(x: paddle.Tensor, dtype: str) -> paddle.Tensor:
    """``x`` cast to an FP8 dtype as CUDA casts (SATFINITE: +-max for overflow and inf), any other
    dtype as Paddle casts. Syncs to host for FP8."""
    name = _name(dtype)
    if name not in _FP8_DTYPES:
        return _ASTYPE(x, dtype)
    return from_fp8_values(quantize(to_numpy(x), fp8_format(name)), name)


def fp8_gemm_nt(lhs, rhs, out, *args, **kwargs) -> None:
    """DeepGEMM's ``fp8_gemm_nt((a, sa), (b, sb), out)``: ``out = a @ b.T`` with ``sa`` 1x128
    scales ``[M, K/128]`` and ``sb`` 128x128 scales ``[N/128, K/128]``, written into ``out`` (bf16)."""
    (a, sa), (b, sb) = lhs, rhs
    result = blockwise_matmul(_check_fp8(a, "lhs"), to_numpy(sa).T, _check_fp8(b, "rhs"), to_numpy(sb), True, False)
    _write(result, out, _name(out.dtype))


def m_grouped_fp8_gemm_nt_contiguous(lhs, rhs, out, m_indices, *args, **kwargs) -> None:
    """DeepGEMM's grouped GEMM: row ``m`` of ``a`` times expert ``m_indices[m]`` of ``b`` [G, N, K]
    (rows with index -1 are padding and stay untouched), into ``out`` [M, N]."""
    (a, sa), (b, sb) = lhs, rhs
    values, scales = _check_fp8(a, "lhs"), to_numpy(sa).T
    experts, expert_scales = to_numpy(b), to_numpy(sb)
    index = m_indices.numpy() if isinstance(m_indices, paddle.Tensor) else np.asarray(m_indices)
    result = to_numpy(out)
    for g in np.unique(index[index >= 0]):
        rows = np.flatnonzero(index == g)
        sub = blockwise_matmul(values[rows], scales[:, rows], experts[g], expert_scales[g], True, False)
        result[rows] = sub
    _write(result, out, _name(out.dtype))
