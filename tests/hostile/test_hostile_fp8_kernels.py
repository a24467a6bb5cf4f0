"""Hostile inputs to the emulated FP8 kernels: wrong dtypes, shapes not multiples of 128, empty
tensors, zeros, non-finite values, huge amaxes, mismatched scales; the errors name the value."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

from paddle_amp_ext.fp8 import kernels

pytestmark = pytest.mark.skipif(not hasattr(paddle, "float8_e4m3fn"), reason="Paddle 2.6 has no FP8 dtypes")


def bf16(shape, value=1.0):
    return paddle.full(shape, value, "float32").astype("bfloat16")


def test_wrong_dtypes_name_the_kernel_check():
    with pytest.raises(TypeError, match="X datatype error, can only be bfloat16 or float16.*Received: float32"):
        kernels.fp8_quant_blockwise(paddle.ones([128, 128]))
    with pytest.raises(TypeError, match="expects a paddle.Tensor. Received: ndarray"):
        kernels.fp8_quant_blockwise(np.ones((128, 128)))
    q, s = kernels.fp8_quant_blockwise(bf16([128, 128]))
    with pytest.raises(TypeError, match=r"A must be FP8 \(float8_e4m3fn or float8_e5m2\). Received: bfloat16"):
        kernels.fp8_gemm_blockwise(bf16([128, 128]), s, q, s, "float32")
    with pytest.raises(TypeError, match="D must be BFloat16 or float. Received: float16"):
        kernels.fp8_gemm_blockwise(q, s, q, s, "float16")
    with pytest.raises(TypeError, match="a_decode_scale must be float"):
        kernels.fp8_gemm_blockwise(q, s.astype("float64"), q, s, "float32")


@pytest.mark.parametrize("shape, kwargs, match", [
    ([128, 100], {}, "last dim of Input\\(X\\) should be exactly divided by 128, but got 100"),
    ([100, 128], {"input_transpose": True}, "first dim .* for input_transpose, but got 100"),
    ([100, 128], {"quant_method": "128x128"}, "first dim .* for quant_method=128x128, but got 100"),
    ([128], {}, "exactly 2 dimensions. Received shape \\[128\\]"),
    ([2, 128, 128], {}, "exactly 2 dimensions"),
])
def test_shapes_the_gpu_refuses(shape, kwargs, match):
    with pytest.raises(ValueError, match=match):
        kernels.fp8_quant_blockwise(bf16(shape), **kwargs)


def test_rows_not_multiple_of_128_in_1x128_without_transpose_work():
    q, s = kernels.fp8_quant_blockwise(bf16([100, 256], 2.0))
    assert list(q.shape) == [100, 256] and list(s.shape) == [2, 100]
    assert kernels.to_numpy(s).tolist() == [[1 / 128] * 100] * 2


@pytest.mark.parametrize("kwargs, error, match", [
    ({"quant_method": "1x64"}, ValueError, "Unsupported quantization method '1x64'"),
    ({"output_type": "e5m2"}, ValueError, "Unsupported output type 'e5m2'"),
    ({"using_ue8m0_scale": True}, NotImplementedError, "using_ue8m0_scale=True"),
])
def test_unsupported_options(kwargs, error, match):
    with pytest.raises(error, match=match):
        kernels.fp8_quant_blockwise(bf16([128, 128]), **kwargs)


def test_zeros_and_empty():
    q, s = kernels.fp8_quant_blockwise(bf16([128, 128], 0.0), quant_method="128x128")
    assert kernels.to_numpy(s).tolist() == [[1.0]] and not kernels.to_numpy(q).any()
    q, s = kernels.fp8_quant_blockwise(bf16([0, 128]))
    assert list(q.shape) == [0, 128] and list(s.shape) == [1, 0]


def test_huge_and_tiny_amax():
    tiny = kernels.fp8_quant_blockwise(paddle.full([128, 128], 1e-38).astype("bfloat16"), epsilon=0.0)
    # 448 / 1e-38 overflows float32: ScaleWrapper's inf branch gives 2**127, stored as 2**-127
    assert set(kernels.to_numpy(tiny[1]).ravel().tolist()) == {2.0**-127}
    q, s = kernels.fp8_quant_blockwise(bf16([128, 128], 3e38))
    assert np.all(kernels.to_numpy(q) <= 448)


def test_gemm_shape_and_scale_mismatches():
    q, s = kernels.fp8_quant_blockwise(bf16([128, 256]))
    w, ws = kernels.fp8_quant_blockwise(bf16([128, 128]), quant_method="128x128", output_scale_transpose=False)
    with pytest.raises(ValueError, match=r"a is \[128, 256\] and b is \[128, 128\]; both must be \[\*, K\]"):
        kernels.fp8_gemm_blockwise(q, s, w, ws, "float32", is_b_1d_scaled=False)
    with pytest.raises(ValueError, match=r"a_decode_scale has shape \[1, 1\]; expected \[1, 128\]"):
        kernels.fp8_gemm_blockwise(w, ws.T, w, ws, "float32", is_a_1d_scaled=True)
    with pytest.raises(ValueError, match="2Dx2D scaling is not supported"):
        kernels.fp8_gemm_blockwise(w, ws, w, ws, "float32", is_a_1d_scaled=False, is_b_1d_scaled=False)
    with pytest.raises(ValueError, match="Bias is not supported"):
        kernels.fp8_gemm_blockwise(w, ws, w, ws, "float32", bias=paddle.ones([128]))
    with pytest.raises(ValueError, match=r"Expected shape \(128, 128\), got \[64, 128\]"):
        w2, w2s = kernels.fp8_quant_blockwise(bf16([128, 256]), quant_method="128x128", output_scale_transpose=False)
        kernels.fp8_gemm_blockwise(q, s, w2, w2s, "float32", out=paddle.zeros([64, 128]), is_b_1d_scaled=False)


def test_half_gemm_fused_errors():
    x = paddle.ones([16, 64]).astype("float8_e4m3fn")
    with pytest.raises(ValueError, match="The output_dtype must be float16 or bfloat16. Received: 'float32'"):
        kernels.fp8_fp8_half_gemm_fused(x, x, output_dtype="float32")
    with pytest.raises(ValueError, match="act must be one of"):
        kernels.fp8_fp8_half_gemm_fused(x, x, transpose_y=True, act="swish")
    with pytest.raises(ValueError, match="inner dimensions differ"):
        kernels.fp8_fp8_half_gemm_fused(x, x)
    with pytest.raises(TypeError, match="y must be an FP8 tensor of rank >= 2"):
        kernels.fp8_fp8_half_gemm_fused(x, paddle.ones([64]))


def test_dequant_and_cast_and_deep_gemm_hostile():
    q, s = kernels.fp8_quant_blockwise(bf16([128, 256]), output_scale_transpose=False)
    with pytest.raises(ValueError, match=r"fused_act_dequant: x_scale is \[2, 128\]; expected \[128, 2\]"):
        kernels.fused_act_dequant(q, s.T)
    with pytest.raises(TypeError, match="x must be FP8"):
        kernels.fused_act_dequant(bf16([128, 256]), s)
    assert kernels.cast(paddle.to_tensor([1.5]), "float16").dtype == paddle.float16
    nan = kernels.to_numpy(kernels.cast(paddle.to_tensor([np.nan, -np.inf]), "float8_e5m2"))
    assert np.isnan(nan[0]) and nan[1] == -57344.0
    with pytest.raises(TypeError, match="lhs must be FP8"):
        kernels.fp8_gemm_nt((bf16([128, 128]), s), (q, s), paddle.zeros([128, 128]))
