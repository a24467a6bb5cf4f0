"""The emulated FP8 kernels against the arithmetic of their CUDA sources (named in fp8/kernels.py)."""

from __future__ import annotations

import numpy as np
import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.errors import AmpUnsupportedError
from paddle_amp_ext.fp8 import blocks, helpers, kernels

HAS_FP8 = hasattr(paddle, "float8_e4m3fn")
needs_fp8 = pytest.mark.skipif(not HAS_FP8, reason="Paddle 2.6 has no FP8 dtypes")


def bf16(values):
    return paddle.to_tensor(np.asarray(values, np.float32)).astype("bfloat16")


def test_scale_wrapper_arithmetic():
    amax = np.array([1.0, 448.0, 0.0, 3.0, np.inf, 1e-45, np.nan], np.float32)
    pow2 = blocks.scale_from_amax(amax)
    assert pow2.tolist()[:6] == [256.0, 1.0, 1.0, 128.0, 0.0, 2.0**127]
    assert pow2[6] == 1.0  # fmaxf(NaN, 0) = 0 -> scale 1
    plain = blocks.scale_from_amax(amax, pow2=False)
    assert plain.tolist()[:6] == [448.0, 1.0, 1.0, np.float32(448.0) / np.float32(3.0), 0.0, float.fromhex("0x1.FEp127")]
    assert blocks.scale_from_amax(np.float32(0.0), epsilon=1e-4).tolist() == 2.0**22  # 448/1e-4 = 4.48e6


@needs_fp8
def test_quant_1x128_values_and_scales():
    x = np.zeros((128, 256), np.float32)
    x[0, 0], x[0, 1], x[0, 2] = 1.0, 0.30078125, -0.001  # block (0, 0): amax 1 -> scale 256
    x[1, 128] = 1000.0  # block (1, 1): 448/1000 -> 0.25
    out, scale = amp.fp8.kernels.fp8_quant_blockwise(bf16(x), output_scale_transpose=False)
    q, s = kernels.to_numpy(out), kernels.to_numpy(scale)
    assert str(out.dtype).endswith("float8_e4m3fn") and list(scale.shape) == [128, 2]
    # 0.30078125 * 256 = 77 -> 80 (e4m3's step is 8 in [64, 128)); bf16(-0.001) * 256 = -0.2561 -> -0.25
    assert q[0, :3].tolist() == [256.0, 80.0, -0.25]
    assert s[0, 0] == 1 / 256 and s[1, 1] == 4.0 and s[2, 0] == 1.0  # a zero block: scale 1
    assert q[1, 128] == 256.0  # 1000 * 0.25 = 250 -> 256 (step 16 in [128, 256))
    transposed, _ = amp.fp8.kernels.fp8_quant_blockwise(bf16(x))
    assert list(transposed.shape) == [128, 256]


@needs_fp8
@pytest.mark.parametrize("method", ["1x128", "128x128"])
@pytest.mark.parametrize("ost", [True, False])
def test_transposed_outputs_and_scale_layouts(method, ost):
    rng = np.random.default_rng(0)
    x = bf16(rng.standard_normal((256, 384)) * np.exp(rng.uniform(-8, 8, (256, 1))))
    out, scale, out_t, scale_t = kernels.fp8_quant_blockwise(x, quant_method=method, input_transpose=True,
                                                             output_scale_transpose=ost)
    only = kernels.fp8_quant_blockwise(x, quant_method=method, input_transpose=True, output_scale_transpose=ost,
                                       return_transpose_only=True)
    assert len(only) == 2 and np.array_equal(kernels.to_numpy(only[0]), kernels.to_numpy(out_t))
    if method == "1x128":  # InferMeta: scale [M, K/128] (ost: [K/128, M]); scale_t [K, M/128] (ost: [M/128, K])
        assert [list(scale.shape), list(scale_t.shape)] == ([[3, 256], [2, 384]] if ost else [[256, 3], [384, 2]])
        again, again_scale = kernels.fp8_quant_blockwise(x.T.contiguous(), output_scale_transpose=ost)
        assert np.array_equal(kernels.to_numpy(again), kernels.to_numpy(out_t))
        assert np.array_equal(kernels.to_numpy(again_scale), kernels.to_numpy(scale_t))
    else:
        assert [list(scale.shape), list(scale_t.shape)] == ([[3, 2], [2, 3]] if ost else [[2, 3], [3, 2]])
        assert np.array_equal(kernels.to_numpy(out_t), kernels.to_numpy(out).T)
    # every block: dequantized values within half an e4m3 step of the input, scales powers of 2
    values = kernels.to_numpy(scale)
    assert np.all(np.log2(values) == np.round(np.log2(values)))


@needs_fp8
def test_non_finite_and_huge_amax_follow_the_kernel():
    x = np.ones((128, 128), np.float32)
    x[0, 5] = np.nan
    x[1, 7] = np.inf
    out, scale = kernels.fp8_quant_blockwise(bf16(x), output_scale_transpose=False)
    q, s = kernels.to_numpy(out), kernels.to_numpy(scale)
    assert s[0, 0] == 1 / 256 and q[0, 0] == 256.0 and np.isnan(q[0, 5])  # NaN ignored by fmaxf's amax
    assert s[1, 0] == np.inf and q[1, 0] == 0.0 and np.isnan(q[1, 7])  # amax inf: scale 448/inf = 0
    big = kernels.fp8_quant_blockwise(bf16(np.full((128, 128), 3e38)), quant_method="128x128")[1]
    assert kernels.to_numpy(big).tolist() == [[2.0**120]]  # 448/bf16(3e38) -> 2**-120 (power of 2, down)


def _reference_gemm(a, sa, b, sb, a_1d, b_1d):
    """Independent float64 reference: per 128-block of K, sum the exact products, then scale."""
    m, k = a.shape
    n = b.shape[0]
    out = np.zeros((m, n))
    for kb in range(-(-k // 128)):
        part = a[:, kb * 128:(kb + 1) * 128].astype(np.float64) @ b[:, kb * 128:(kb + 1) * 128].T.astype(np.float64)
        scale_a = sa[kb, :] if a_1d else np.repeat(sa[:, kb], 128)[:m]
        scale_b = sb[kb, :] if b_1d else np.repeat(sb[:, kb], 128)[:n]
        out += part * scale_a[:, None] * scale_b[None, :]
    return out


@needs_fp8
@pytest.mark.parametrize("a_1d, b_1d", [(True, True), (True, False), (False, True)])
def test_gemm_blockwise_matches_the_per_block_sum(a_1d, b_1d):
    rng = np.random.default_rng(1)
    x, w = bf16(rng.standard_normal((256, 384))), bf16(rng.standard_normal((128, 384)) * 0.02)
    qa, sa = kernels.fp8_quant_blockwise(x, quant_method="1x128" if a_1d else "128x128", output_scale_transpose=a_1d)
    qb, sb = kernels.fp8_quant_blockwise(w, quant_method="1x128" if b_1d else "128x128", output_scale_transpose=b_1d)
    got = kernels.fp8_gemm_blockwise(qa, sa, qb, sb, "float32", is_a_1d_scaled=a_1d, is_b_1d_scaled=b_1d)
    ref = _reference_gemm(*(kernels.to_numpy(t) for t in (qa, sa, qb, sb)), a_1d, b_1d)
    np.testing.assert_allclose(kernels.to_numpy(got), ref, rtol=1e-5, atol=1e-6)
    out = paddle.full([256, 128], 2.0, "float32")
    same = kernels.fp8_gemm_blockwise(qa, sa, qb, sb, "float32", out=out, accumulate=True,
                                      is_a_1d_scaled=a_1d, is_b_1d_scaled=b_1d)
    assert same is out
    np.testing.assert_allclose(kernels.to_numpy(out), ref + 2.0, rtol=1e-5, atol=1e-6)
    as_bf16 = kernels.fp8_gemm_blockwise(qa, sa, qb, sb, "bfloat16", is_a_1d_scaled=a_1d, is_b_1d_scaled=b_1d)
    assert np.array_equal(kernels.to_numpy(as_bf16), kernels.to_numpy(got.astype("bfloat16")))


@needs_fp8
def test_half_gemm_fused_and_dequant():
    x = paddle.ones([16, 64]).astype("float8_e4m3fn")
    y = paddle.ones([32, 64]).astype("float8_e4m3fn")
    out = kernels.fp8_fp8_half_gemm_fused(x, y, transpose_y=True, scale=0.5, output_dtype="float16")
    assert str(out.dtype).endswith("float16") and kernels.to_numpy(out).tolist() == [[32.0] * 32] * 16
    bias = paddle.full([32], -40.0)
    relu = kernels.fp8_fp8_half_gemm_fused(x, y, transpose_y=True, bias=bias, output_dtype="bfloat16", act="relu")
    assert kernels.to_numpy(relu).tolist() == [[24.0] * 32] * 16
    q, s = kernels.fp8_quant_blockwise(bf16(np.full((128, 256), 3.0)), output_scale_transpose=False)
    assert kernels.to_numpy(kernels.fused_act_dequant(q, s)).tolist() == [[3.0] * 256] * 128


@needs_fp8
def test_emulation_installs_and_restores_and_casts_saturate():
    import paddle.incubate.nn.functional as incubate_f

    before = (incubate_f.fp8_quant_blockwise, paddle.linalg.fp8_fp8_half_gemm_fused, paddle.Tensor.astype, paddle.cast)
    x = paddle.to_tensor([479.0, 1e6, -np.inf, 0.3])
    assert np.isnan(kernels.to_numpy(x.astype("float8_e4m3fn"))[0]), "Paddle's CPU cast: 479 -> NaN"
    with amp.fp8_emulation():
        assert incubate_f.fp8_quant_blockwise is kernels.fp8_quant_blockwise
        assert kernels.to_numpy(x.astype("float8_e4m3fn")).tolist() == [448.0, 448.0, -448.0, 0.3125]
        assert kernels.to_numpy(paddle.cast(x, "float8_e5m2")).tolist() == [448.0, 57344.0, -57344.0, 0.3125]  # e5m2 step 64 in [256, 512)
        assert x.astype("float16").dtype == paddle.float16
        with amp.fp8_emulation():  # nests
            incubate_f.fp8_quant_blockwise(bf16(np.ones((128, 128))))
    assert (incubate_f.fp8_quant_blockwise, paddle.linalg.fp8_fp8_half_gemm_fused, paddle.Tensor.astype, paddle.cast) == before
    with pytest.raises(RuntimeError), amp.fp8_emulation():
        raise RuntimeError("boom")
    assert incubate_f.fp8_quant_blockwise is before[0]


@pytest.mark.skipif(HAS_FP8, reason="this Paddle has FP8 dtypes")
def test_emulation_on_paddle_2_6_says_there_are_no_fp8_dtypes():
    with pytest.raises(AmpUnsupportedError, match=r"Paddle 2\.6\.\d has no FP8|which Paddle 2\.6\.\d does not have"):
        with amp.fp8_emulation():
            pass


def test_swiglu_helpers_match_float32_autograd():
    rng = np.random.default_rng(2)
    x = paddle.to_tensor(rng.standard_normal((4, 16)).astype(np.float32), stop_gradient=False)
    out = helpers.swiglu(x)
    a, b = paddle.chunk(x, 2, axis=-1)
    np.testing.assert_allclose(out.numpy(), (paddle.nn.functional.silu(a) * b).numpy(), rtol=1e-6)
    dout = paddle.to_tensor(rng.standard_normal((4, 8)).astype(np.float32))
    (grad,) = paddle.grad(out, x, dout)
    mine, none = helpers.swiglu_grad(x.detach(), None, dout)
    assert none is None
    np.testing.assert_allclose(mine.numpy(), grad.numpy(), rtol=1e-5, atol=1e-6)


@needs_fp8
def test_deep_gemm_entry_points_as_fp8_utils_calls_them():
    rng = np.random.default_rng(4)
    x = bf16(rng.standard_normal((256, 256)))
    w = bf16(rng.standard_normal((2, 128, 256)) * 0.1)
    xq, xs = kernels.fp8_quant_blockwise(x)  # scale [K/128, M]; DeepGEMM takes its transpose
    experts = [kernels.fp8_quant_blockwise(w[g], quant_method="128x128", output_scale_transpose=False)
               for g in range(2)]
    out = paddle.zeros([256, 128], "bfloat16")
    kernels.fp8_gemm_nt((xq, xs.T), experts[0], out)
    ref = kernels.fp8_gemm_blockwise(xq, xs, experts[0][0], experts[0][1], "bfloat16", is_b_1d_scaled=False)
    assert np.array_equal(kernels.to_numpy(out), kernels.to_numpy(ref))
    index = np.array([0] * 100 + [1] * 100 + [-1] * 56)
    grouped = paddle.full([256, 128], 7.0, "bfloat16")
    stacked_w = paddle.stack([e[0].astype("float32") for e in experts]).astype("float8_e4m3fn")
    stacked_s = paddle.stack([e[1] for e in experts])
    kernels.m_grouped_fp8_gemm_nt_contiguous((xq, xs.T), (stacked_w, stacked_s), grouped, paddle.to_tensor(index))
    got = kernels.to_numpy(grouped)
    assert np.array_equal(got[:100], kernels.to_numpy(ref)[:100])
    other = kernels.fp8_gemm_blockwise(xq, xs, experts[1][0], experts[1][1], "bfloat16", is_b_1d_scaled=False)
    assert np.array_equal(got[100:200], kernels.to_numpy(other)[100:200])
    assert (got[200:] == 7.0).all(), "rows with index -1 are padding and stay untouched"
