"""FP8 rounding (paddle_amp_ext.fp8.formats) against ml_dtypes with CUDA's SATFINITE applied.

The exhaustive check over all 2**32 float32 patterns is scripts/check_fp8_rounding.py (docs/fp8.md);
here: every bfloat16 pattern and its float32 neighbours, the boundaries and the special values.
"""

from __future__ import annotations

import numpy as np
import pytest

ml_dtypes = pytest.importorskip("ml_dtypes")

from paddle_amp_ext.fp8.formats import E4M3FN, E5M2, flushed, fp8_format, quantize, saturated  # noqa: E402

REF = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}


def reference(x, name):
    spec = fp8_format(name)
    ref = x.astype(REF[name]).astype(np.float32)
    with np.errstate(invalid="ignore"):
        clip = ~np.isnan(x) & (~np.isfinite(ref) | (np.abs(ref) > spec.max))
    return np.where(clip, np.copysign(np.float32(spec.max), x), ref)


def dense_patterns():
    high = np.arange(1 << 16, dtype=np.uint32) << 16  # every bfloat16 pattern
    around = [high + d for d in (0, 1, 2, 0x7FFF, 0x8000, 0x8001)] + [high - d for d in (1, 2)]
    return np.concatenate(around).astype(np.uint32).view(np.float32)


def boundaries(spec):
    top, q = spec.max, spec.min_subnormal
    ulp_top = 2.0 ** (np.floor(np.log2(top)) - spec.mantissa_bits)
    values = [0.0, q, q / 2, q * 0.75, q * 1.5, q * 2.5, spec.min_normal, spec.min_normal - q / 2,
              top, top + ulp_top / 2, top + ulp_top / 2 + ulp_top / 64, top + ulp_top, 2 * top,
              3.4e38, float("inf"), float("nan")]
    x = np.array(values, np.float32)
    return np.concatenate([x, -x, np.nextafter(x, np.float32(np.inf)), np.nextafter(x, np.float32(0))])


@pytest.mark.parametrize("name", ["e4m3fn", "e5m2"])
def test_matches_ml_dtypes_with_saturation_on_dense_set(name):
    x = np.concatenate([dense_patterns(), boundaries(fp8_format(name))])
    ours, ref = quantize(x, name), reference(x, name)
    same = (ours.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(ours) & np.isnan(ref))
    assert not (~same).any(), x[~same][:5]


def test_cuda_saturation_values():
    x = np.array([460, 464, 465, 479, 480, 1e30, np.inf, -np.inf, np.nan], np.float32)
    got = quantize(x, "e4m3fn")
    assert got[:8].tolist() == [448, 448, 448, 448, 448, 448, 448, -448]
    assert np.isnan(got[8])
    y = np.array([57344, 61439, 61440, 65536, np.inf, -3e38], np.float32)
    assert quantize(y, "e5m2").tolist() == [57344, 57344, 57344, 57344, 57344, -57344]


def test_subnormals_round_to_nearest_even_and_keep_zero_sign():
    q = E4M3FN.min_subnormal  # 2**-9
    got = quantize(np.array([q / 2, 3 * q / 2, 5 * q / 2, -q / 2, q / 2 + 2.0**-30], np.float32), "e4m3")
    assert got.tolist() == [0.0, 2 * q, 2 * q, -0.0, q]
    assert np.signbit(got[3])
    assert quantize(np.array([2.0**-17, 2.0**-16], np.float32), E5M2).tolist() == [0.0, 2.0**-16]


def test_saturated_and_flushed_masks():
    x = np.array([0.0, 2.0**-10, 2.0**-9, 448.0, 464.0, 465.0, np.inf, np.nan], np.float32)
    assert saturated(x).tolist() == [False, False, False, False, False, True, True, False]
    assert saturated(np.array([61440.0, 61441.0], np.float32), "e5m2").tolist() == [False, True]
    assert flushed(x).tolist() == [False, True, False, False, False, False, False, False]


def test_does_not_modify_input():
    x = np.array([1000.0, 0.3], np.float32)
    quantize(x)
    assert x.tolist() == [1000.0, np.float32(0.3)]


def test_to_bits_is_the_inverse_of_the_decoding_and_keeps_nan():
    from paddle_amp_ext.fp8.formats import to_bits

    for name in ("e4m3fn", "e5m2"):
        codes = np.arange(256, dtype=np.uint8)
        values = codes.view(REF[name]).astype(np.float32)
        finite = ~np.isnan(values) & np.isfinite(values)
        assert np.array_equal(to_bits(values[finite], name), codes[finite])
    assert to_bits(np.array([np.nan, -np.nan], np.float32), "e4m3fn").tolist() == [0x7F, 0xFF]
    assert to_bits(np.array([np.nan], np.float32), "e5m2").tolist() == [0x7E]
    with pytest.raises(ValueError, match=r"0\.3.* is not an e4m3fn value; round it with quantize\(\) first"):
        to_bits(np.array([0.3], np.float32))


# ---- the compiled one-pass kernel (paddle_amp_ext.fp8.blocks) against numpy and ml_dtypes --------

from paddle_amp_ext.fp8.blocks import block_amax, quantize_blocks  # noqa: E402


def native_or_skip():
    from paddle_amp_ext._native import fp8_kernel, status

    if fp8_kernel() is None:
        pytest.skip(f"no compiled FP8 kernel here: {status().detail}")


@pytest.mark.parametrize("kernel", ["native", "numpy"])
@pytest.mark.parametrize("name", ["e4m3fn", "e5m2"])
def test_both_paths_match_ml_dtypes_and_count_on_dense_set(name, kernel):
    if kernel == "native":
        native_or_skip()
    x = np.concatenate([dense_patterns(), boundaries(fp8_format(name))])
    out = quantize_blocks(x.reshape(1, -1), (1, x.size), np.ones(1, np.float32), name, dequant=False,
                          use_native=kernel == "native")
    ref = reference(x, name)
    got = out.values.reshape(-1)
    same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
    assert not (~same).any(), x[~same][:5]
    assert (out.saturated, out.flushed) == (int(saturated(x, name).sum()), int(flushed(x, name).sum()))
    assert out.amax == float("inf")  # the boundaries hold +-inf; NaN is ignored


@pytest.mark.parametrize("block", [(1, 128), (128, 128), (7, 5), (300, 260)])
def test_native_blocks_equal_numpy_blocks_bit_for_bit(block):
    native_or_skip()
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((300, 260)) * np.exp(rng.standard_normal((300, 260)) * 4)).astype(np.float32)
    x[3, 4], x[5, 6], x[7, 8] = np.nan, np.inf, 2.0**-140  # a float32 subnormal too
    amax = block_amax(x, block)
    assert np.array_equal(amax, block_amax(x, block, use_native=False))
    scales = (np.float32(448) / np.maximum(amax, np.float32(1e-30))).astype(np.float32)
    for name in ("e4m3fn", "e5m2"):
        for dequant in (True, False):
            a = quantize_blocks(x, block, scales, name, dequant)
            b = quantize_blocks(x, block, scales, name, dequant, use_native=False)
            assert np.array_equal(a.values, b.values, equal_nan=True)
            assert np.array_equal(np.signbit(a.values), np.signbit(b.values))
            assert a[1:4] == b[1:4] and np.array_equal(a.scales, b.scales)


def test_kernel_counts_exact_values():
    native_or_skip()
    x = np.array([[465.0, -np.inf, 2.0**-10, -2.0**-11, 0.0, np.nan, 1.0, 448.0]], np.float32)
    out = quantize_blocks(x, (1, 8), np.ones(1, np.float32), "e4m3fn", dequant=False)
    assert out.values[0, :5].tolist() == [448.0, -448.0, 0.0, -0.0, 0.0] and np.isnan(out.values[0, 5])
    assert (out.saturated, out.flushed, out.amax) == (2, 2, float("inf"))
    halves = quantize_blocks(np.array([[3.0, 3.0]], np.float32), (1, 1), np.array([[2.0, 0.5]]), "e4m3fn")
    assert halves.values.tolist() == [[3.0, 3.0]]  # 6 and 1.5 are e4m3 values: dequantized exactly


@pytest.mark.parametrize("pow2", [True, False])
@pytest.mark.parametrize("epsilon", [0.0, 1e-3])
def test_scales_from_the_amax_in_the_kernel_equal_paddles_scale_wrapper(pow2, epsilon):
    from paddle_amp_ext.fp8.blocks import scale_from_amax

    rng = np.random.default_rng(2)
    x = (rng.standard_normal((130, 300)) * np.exp(rng.standard_normal((130, 300)) * 6)).astype(np.float32)
    x[:, :128] = 0.0  # zero blocks: scale 1
    x[0, 200], x[1, 5], x[129, 299] = np.inf, np.nan, 1e-45  # inf: scale 0; a subnormal amax: 2**127 / 0x1.FEp127
    for block in ((1, 128), (128, 128), (128, 1), (3, 1)):  # (r, 1): the column-block kernel
        want = scale_from_amax(block_amax(x, block, use_native=False), epsilon, pow2)
        for use_native in (None, False):
            got = quantize_blocks(x, block, None, epsilon=epsilon, pow2=pow2, use_native=use_native)
            assert np.array_equal(got.scales, want)
            fixed = quantize_blocks(x, block, want, use_native=use_native)
            assert np.array_equal(got.values, fixed.values, equal_nan=True) and got[1:4] == fixed[1:4]


@pytest.mark.parametrize("width", [512, 256, 128])
@pytest.mark.parametrize("name", ["e4m3fn", "e5m2"])
def test_every_vector_width_of_the_kernel_matches_ml_dtypes(name, width):
    """The AVX-512, AVX2 and plain-C loops (capped in turn on this CPU), on the dense set and on
    every length from 0 to 40 (vector bodies and tails), rounding and counting."""
    native_or_skip()
    from paddle_amp_ext._native import vector_bits

    try:
        assert vector_bits(width) <= width
        x = np.concatenate([dense_patterns(), boundaries(fp8_format(name))])
        for part in [x] + [x[n * 997:n * 997 + n] for n in range(41)]:
            out = quantize_blocks(part.reshape(1, -1), (1, max(part.size, 1)), np.ones(1, np.float32), name,
                                  dequant=False) if part.size else None
            if out is None:
                continue
            ref, got = reference(part, name), out.values.reshape(-1)
            same = (got.view(np.uint32) == ref.view(np.uint32)) | (np.isnan(got) & np.isnan(ref))
            assert same.all(), (width, part.size, part[~same][:5])
            assert (out.saturated, out.flushed) == (int(saturated(part, name).sum()), int(flushed(part, name).sum()))
    finally:
        vector_bits(512)
