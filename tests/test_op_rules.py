"""The rehearsal's op rules per Paddle version, against a float16 reference built from numpy.

The reference is numpy's float16 arithmetic: ``np.matmul`` on float16 arrays sums the products
in float32 and rounds once, as tensor-core kernels do; a float32 op is numpy float32. Inputs are
small dyadic numbers, so every product and sum is exact in float32 and the order Paddle's CPU
kernels sum in cannot change a bit. What each rule is comes from reading Paddle's code (see
``paddle_amp_ext/_compat/layers.py`` and ``rehearsal/composite.py``), not from a GPU run.
"""

from __future__ import annotations

import numpy as np
import paddle
import paddle.nn.functional as F  # noqa: N812
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import _compat

F16, F32 = np.float16, np.float32
BIAS = np.array([0.1, 1.0 / 3.0, -0.7, 3.0001], dtype=F32)  # not float16 values


def dyadic(shape, scale, seed=0):
    return (np.random.default_rng(seed).integers(-15, 16, shape) / scale).astype(F32)


def im2col_matmul(x16, w16, spatial):
    """A stride-1, unpadded convolution in float16: every window's products summed by one
    float16 ``np.matmul`` (float32 accumulation, one rounding)."""
    n, c = x16.shape[:2]
    o, k = w16.shape[0], w16.shape[2:]
    windows = np.lib.stride_tricks.sliding_window_view(x16, k, axis=tuple(range(2, 2 + spatial)))
    out_shape = windows.shape[2:2 + spatial]
    cols = np.moveaxis(windows, 1, 1 + spatial).reshape(n * int(np.prod(out_shape)), c * int(np.prod(k)))
    out = np.matmul(cols, w16.reshape(o, -1).T)
    return np.moveaxis(out.reshape(n, *out_shape, o), -1, 1)


def conv_reference(x16, w16, spatial, transpose):
    if transpose:  # stride 1, no padding: a full correlation with the flipped, swapped kernel
        k = w16.shape[2:]
        x16 = np.pad(x16, [(0, 0), (0, 0)] + [(s - 1, s - 1) for s in k])
        w16 = np.flip(np.swapaxes(w16, 0, 1), axis=tuple(range(2, 2 + spatial)))
    return im2col_matmul(x16, np.ascontiguousarray(w16), spatial)


CONVS = {  # layer, spatial dims, transposed, the op type to white-list
    "Conv1D": (paddle.nn.Conv1D, 1, False, "conv2d"),
    "Conv2D": (paddle.nn.Conv2D, 2, False, "conv2d"),
    "Conv3D": (paddle.nn.Conv3D, 3, False, "conv3d"),
    "Conv1DTranspose": (paddle.nn.Conv1DTranspose, 1, True, "conv2d_transpose"),
    "Conv2DTranspose": (paddle.nn.Conv2DTranspose, 2, True, "conv2d_transpose"),
    "Conv3DTranspose": (paddle.nn.Conv3DTranspose, 3, True, "conv3d_transpose"),
}


def conv_case(name):
    cls, spatial, transpose, op = CONVS[name]
    layer = cls(2, 4, 3)
    layer.weight.set_value(dyadic(layer.weight.shape, 32, seed=1))
    layer.bias.set_value(BIAS)
    x = dyadic([2, 2] + [5] * spatial, 4, seed=2)
    return layer, x, spatial, transpose, op


@pytest.mark.parametrize("name", sorted(CONVS))
def test_a_conv_runs_in_fp16_and_adds_its_float32_bias_in_float32(name):
    """Paddle runs the conv kernel, then ``add(conv_out, bias)``: fp16 + float32 promotes, so the
    bias is never rounded and neither is the sum; the weight gradient is fp16's."""
    layer, x, spatial, transpose, op = conv_case(name)
    pre = conv_reference(x.astype(F16), layer.weight.numpy().astype(F16), spatial, transpose)
    axes = [1, -1] + [1] * spatial
    expected = pre.astype(F32) + BIAS.reshape(axes)
    grad_out = dyadic(expected.shape, 64, seed=3)
    white = [] if op == "conv2d" else [op]
    with amp.fp16_emulation(layer, custom_white_list=white):
        out = layer(paddle.to_tensor(x))
        (out * paddle.to_tensor(grad_out)).sum().backward()
    np.testing.assert_array_equal(out.numpy(), expected)
    old_rule = (pre + BIAS.astype(F16).reshape(axes)).astype(F32)  # bias rounded, sum rounded
    assert not np.array_equal(out.numpy(), old_rule)
    np.testing.assert_array_equal(layer.bias.grad.numpy(), grad_out.sum(axis=(0, *range(2, 2 + spatial))))
    weight_grad = layer.weight.grad.numpy()
    np.testing.assert_array_equal(weight_grad, weight_grad.astype(F16).astype(F32))


@pytest.mark.parametrize("name", ["Conv3D", "Conv2DTranspose", "Conv3DTranspose"])
def test_convs_no_default_list_names_run_in_float32(name):
    """conv3d and the transposed convs are on neither default list (2.6.2, 3.3.1): with float32
    inputs and weights they promote to float32."""
    layer, x, *_ = conv_case(name)
    plain = layer(paddle.to_tensor(x)).numpy()
    with amp.fp16_emulation(layer):
        np.testing.assert_array_equal(layer(paddle.to_tensor(x)).numpy(), plain)


def test_a_depthwise_conv2d_is_not_the_white_listed_conv2d():
    """groups == in_channels: Paddle's GPU path runs ``depthwise_conv2d``, on no default list."""
    layer = paddle.nn.Conv2D(4, 4, 3, groups=4, bias_attr=False)
    x = paddle.rand([1, 4, 6, 6])
    plain = layer(x).numpy()
    assert not np.array_equal(plain, plain.astype(F16).astype(F32))
    with amp.fp16_emulation(layer):
        np.testing.assert_array_equal(layer(x).numpy(), plain)
    with amp.fp16_emulation(layer, custom_white_list=["depthwise_conv2d"]):
        out = layer(x).numpy()
    np.testing.assert_array_equal(out, out.astype(F16).astype(F32))


def linear_case():
    layer = paddle.nn.Linear(16, 4)
    layer.weight.set_value(dyadic([16, 4], 32, seed=4))
    layer.bias.set_value(BIAS)
    return layer, dyadic([8, 16], 4, seed=5)


def test_linear_follows_the_installed_paddle():
    """3.3.1 on a GPU: one ``linear_v2`` (white-listed), bias included, rounded once; 2.6.2:
    ``_C_ops.linear`` is ``matmul`` (fp16) then ``add`` with the float32 bias (float32)."""
    fused = _compat.gpu_linear_is_fused()
    assert fused == (_compat.PADDLE_VERSION >= (3, 3, 0)), "the two versions checked"
    layer, x = linear_case()
    x16, w16 = x.astype(F16), layer.weight.numpy().astype(F16)
    if fused:
        expected = (x16.astype(F32) @ w16.astype(F32) + BIAS.astype(F16).astype(F32)).astype(F16).astype(F32)
    else:
        expected = np.matmul(x16, w16).astype(F32) + BIAS
    with amp.fp16_emulation(layer):
        out = layer(paddle.to_tensor(x))
        (out * 1e-8).sum().backward()  # 1e-8 is below fp16's smallest subnormal
    np.testing.assert_array_equal(out.numpy(), expected)
    bias_grad = layer.bias.grad.numpy()
    if fused:
        assert (bias_grad == 0).all(), "the fp16 output's gradient flushes to zero"
    else:
        np.testing.assert_array_equal(bias_grad, np.full(4, 8e-8, dtype=F32)), "float32 add: the bias trains"


def test_an_embedding_is_rounded_only_where_lookup_table_v2_runs_in_fp16():
    table = paddle.nn.Embedding(4, 3)
    values = np.array([[300.0, 1.0 / 3.0, 0.1]] * 4, dtype=F32)
    table.weight.set_value(values)
    ids = paddle.to_tensor([0, 3])
    with amp.fp16_emulation(table):
        rows = table(ids)
        np.testing.assert_array_equal(rows.numpy(), values[[0, 3]])  # on no default list: float32
        assert np.isfinite((rows * 300.0).numpy()).all()
        with amp.auto_cast(custom_white_list=["lookup_table_v2"]):  # PaddleFormers' lists
            rows = table(ids)
            np.testing.assert_array_equal(rows.numpy(), values[[0, 3]].astype(F16).astype(F32))
            assert np.isposinf((rows * 300.0).numpy()[:, 0]).all(), "an fp16 row times 300 overflows"
    with amp.rehearse(custom_white_list=["embedding"]):
        np.testing.assert_array_equal(table(ids).numpy(), values[[0, 3]].astype(F16).astype(F32))


def test_norms_follow_x_alone_and_layer_norm_is_black_only_at_o1():
    """batch_norm and layer_norm: AMP decides by X and never casts their parameters; layer_norm
    is on the O1 black list, not on O2's."""
    paddle.seed(0)
    proj = paddle.nn.Linear(4, 4, bias_attr=False)
    norm, batch = paddle.nn.LayerNorm(4), paddle.nn.BatchNorm1D(4)
    x = paddle.rand([8, 4])
    h16 = paddle.to_tensor(np.matmul(x.numpy().astype(F16), proj.weight.numpy().astype(F16)).astype(F32))
    normed_h = F.layer_norm(h16, [4], norm.weight, norm.bias).numpy()  # Paddle's float32 kernel
    normed_x = F.layer_norm(x, [4], norm.weight, norm.bias).numpy()
    batched_x = batch(x).numpy()
    with amp.fp16_emulation(paddle.nn.Sequential(proj, norm, batch)):
        np.testing.assert_array_equal(proj(x).numpy(), h16.numpy())
        np.testing.assert_array_equal(norm(proj(x)).numpy(), normed_h)  # black at O1: float32
        with amp.auto_cast(level="O2"):
            np.testing.assert_array_equal(norm(proj(x)).numpy(), normed_h.astype(F16).astype(F32))
            np.testing.assert_array_equal(norm(x).numpy(), normed_x)  # a float32 X: float32
        normed = batch(proj(x)).numpy()
        np.testing.assert_array_equal(normed, normed.astype(F16).astype(F32))
        np.testing.assert_array_equal(batch(x).numpy(), batched_x)
    assert not np.array_equal(normed_h, normed_h.astype(F16).astype(F32))
