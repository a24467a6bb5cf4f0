"""Op-level rehearsal: functional ops AMP runs in fp16 are rounded wherever they are called."""

from __future__ import annotations

import math

import numpy as np
import paddle
import pytest
from helpers import ATTENTION_MODEL_SCRIPT, in_another_thread

import paddle_amp_ext as amp
from paddle_amp_ext.rehearsal import ops

BIG, TINY = 300.0, 1e-5  # BIG * BIG = 90000 > 65504; TINY * TINY = 1e-10 < fp16's 6e-8 subnormal


def square_matrix(value):
    return paddle.full([2, 2], value / 2 ** 0.5, dtype="float32")


CALLS = {
    "paddle.matmul": lambda a, b: paddle.matmul(a, b),
    "paddle.einsum": lambda a, b: paddle.einsum("ij,jk->ik", a, b),
    "@": lambda a, b: a @ b,
    "Tensor.matmul": lambda a, b: a.matmul(b),
    "F.linear": lambda a, b: paddle.nn.functional.linear(a, b),
}


@pytest.mark.parametrize("path", sorted(CALLS))
def test_functional_ops_overflow_and_underflow_as_fp16_would(path):
    call = CALLS[path]
    big, tiny = square_matrix(BIG), square_matrix(TINY)
    plain_big, plain_tiny = call(big, big).numpy(), call(tiny, tiny).numpy()
    assert np.isfinite(plain_big).all() and (plain_tiny != 0).all(), "float32 holds both"
    with amp.rehearse():
        assert np.isposinf(call(big, big).numpy()).all()
        assert (call(tiny, tiny).numpy() == 0).all()
        with amp.auto_cast(custom_black_list=["matmul", "einsum"]):  # the enclosing auto_cast's lists decide
            np.testing.assert_array_equal(call(big, big).numpy(), plain_big)
    with amp.rehearse("bfloat16"):
        out = call(big, big).numpy()
        assert np.isfinite(out).all() and not np.array_equal(out, plain_big), "bf16: float32's range, 8 bits"
    np.testing.assert_array_equal(call(big, big).numpy(), plain_big)  # after the rehearsal: Paddle's own
    assert not any(ops.wrapped_paths().values())


def attention_model():
    paddle.seed(0)
    layer = paddle.nn.TransformerEncoderLayer(d_model=64, nhead=1, dim_feedforward=64, dropout=0.0)
    attn = layer.self_attn
    for proj in (attn.q_proj, attn.k_proj):
        proj.weight.set_value(paddle.zeros_like(proj.weight))
        proj.bias.set_value(paddle.full_like(proj.bias, 100.0))
    return layer


def test_attention_logits_overflow_under_rehearsal_and_not_with_matmul_black_listed():
    """q.k = 64 x 12.5 x 100 = 80000: every Linear output (100) fits fp16, the logits do not."""
    model, x = attention_model(), paddle.rand([2, 4, 64])
    assert np.isfinite(model(x).numpy()).all()
    with amp.fp16_emulation(model):
        assert not np.isfinite(model(x).numpy()).all(), "the white-listed matmul writes inf, softmax makes NaN"
    with amp.fp16_emulation(model, custom_black_list=["matmul"]):
        assert np.isfinite(model(x).numpy()).all()
    with amp.fp16_emulation(model):
        with amp.auto_cast(custom_black_list=["matmul"]):
            assert np.isfinite(model(x).numpy()).all()
        with amp.auto_cast(enable=False):
            assert np.isfinite(model(x).numpy()).all()


def test_kept_layers_and_other_threads_are_not_rounded():
    class Functional(paddle.nn.Layer):
        def forward(self, a):
            return paddle.matmul(a, a)

    big = square_matrix(BIG)
    kept, model = amp.keep_fp32(Functional()), Functional()
    with amp.fp16_emulation(kept):
        with amp.rehearse():
            seen = {"other thread": in_another_thread(lambda: bool(np.isfinite(model(big).numpy()).all())),
                    "kept": bool(np.isfinite(kept(big).numpy()).all()),
                    "here": bool(np.isfinite(paddle.matmul(big, big).numpy()).all())}
    assert seen == {"other thread": True, "kept": True, "here": False}


def test_gradients_through_a_rounded_op_are_rounded():
    a = paddle.to_tensor([[1.0 + 2 ** -12]], stop_gradient=False)  # not an fp16 value
    with amp.rehearse():
        out = paddle.matmul(a, paddle.to_tensor([[3.0]]))
        (out * (1.0 + 2 ** -13)).sum().backward()
    assert out.numpy()[0, 0] == 3.0, "input rounded to 1.0, then 3.0 is exact"
    assert a.grad.numpy()[0, 0] == 3.0, "the output gradient (1 + 2**-13) is rounded to 1, times 3"


def test_the_doctor_names_the_op_and_the_innermost_layer():
    model = paddle.nn.Sequential(attention_model())
    report = amp.find_overflow(model, paddle.rand([2, 4, 64]))
    culprit = report.culprit
    assert (culprit.op, culprit.layer, culprit.layer_type, culprit.direction) == (
        "matmul_v2", "0.self_attn", "MultiHeadAttention", "forward")
    assert 65504 < culprit.max_abs <= 80000 * 1.01
    text = str(report)
    assert "op 'matmul_v2' in layer '0.self_attn' (MultiHeadAttention)" in text
    assert "keep_fp32(model, ['0.self_attn'])" in text and "custom_black_list=['matmul_v2']" in text
    assert not any(ops.wrapped_paths().values()), "the doctor leaves Paddle's functions as they were"


def test_overflow_watch_names_a_functional_op_when_a_step_overflows(caplog_amp):
    model = attention_model()
    watch = amp.OverflowWatch(model)
    scaler = amp.GradScaler(hooks=[watch])
    opt = paddle.optimizer.SGD(learning_rate=0.0, parameters=model.parameters())
    with amp.fp16_emulation(model):
        scaler.scale(model(paddle.rand([2, 4, 64])).mean()).backward()
        assert scaler.step(opt).skipped
        scaler.update()
    watch.close()
    assert watch.last_report.culprit.op == "matmul_v2" and watch.last_report.culprit.layer == "self_attn"
    assert "op 'matmul_v2' in layer 'self_attn'" in caplog_amp.text


ATTENTION_SCRIPT = ATTENTION_MODEL_SCRIPT + """
try:
    model(paddle.rand([2, 4, 64])).mean().backward()
except Exception:
    pass
"""


def test_the_doctor_cli_names_the_op_and_the_layer_in_a_script(tmp_path):
    import json
    import subprocess
    import sys

    script = tmp_path / "attention.py"
    script.write_text(ATTENTION_SCRIPT)
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.doctor", "--json", str(script)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr[-3000:]
    finding = json.loads(proc.stdout)["finding"]
    assert (finding["op"], finding["layer"], finding["direction"]) == ("matmul_v2", "0.self_attn", "forward")


# --------------------------------------------------------------------------- the advisor
def test_advice_for_the_attention_model_makes_its_rehearsal_clean():
    model, x = paddle.nn.Sequential(attention_model()), paddle.rand([2, 4, 64])
    with amp.fp16_emulation(model):
        assert not np.isfinite(model(x).numpy()).all()
    advice = amp.advise(model, x, loss_fn=lambda out: out.mean())
    assert (advice.dtype, advice.fp32_layers, advice.clean) == ("float16", ("0.self_attn",), True)
    config = advice.to_config()
    assert config.fp32_layers == ("0.self_attn",) and math.log2(advice.init_loss_scaling).is_integer()
    assert amp.AmpConfig.from_dict(config.to_dict()) == config
    with amp.fp16_emulation(model, config=config):
        assert np.isfinite(model(x).numpy()).all(), "applying the advice makes the rehearsal clean"
    text = str(advice)
    assert "matmul_v2 in 0.self_attn" in text and "keep '0.self_attn' in float32" in text and "clean" in text
    assert all(p.grad is None for p in model.parameters()), "the model's gradients are left cleared"


def test_advice_proposes_a_loss_scale_from_the_gradient_range_and_bf16_when_fp16_cannot_be_saved():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 1))
    x = paddle.randn([4, 8])
    advice = amp.advise(model, x, loss_fn=lambda out: out.mean() * 1e-6)
    low, high = advice.grad_range
    assert advice.clean and advice.fp32_layers == () and 0 < low <= high
    assert high * advice.init_loss_scaling <= 65504 / 2 < high * advice.init_loss_scaling * 4 or \
        advice.init_loss_scaling == 2.0**24

    class Blowup(paddle.nn.Layer):  # the model's own output does not fit fp16: no layer to keep
        def forward(self, a):
            return a * 1e6

    blown = amp.advise(Blowup(), x, dtype="float16")
    assert blown.dtype == "bfloat16" and blown.clean and "use bfloat16" in str(blown)
    assert blown.fp32_layers == ()
    culprit = amp.find_overflow(Blowup(), x).culprit
    assert culprit.layer == "Blowup", "the model itself, labelled by its class"
    assert culprit.fixes("float16") == ["switch to dtype='bfloat16' (float32's range) on a GPU with CC >= 8.0"], \
        "no keep_fp32(model, ['Blowup']): keeping the whole model is no AMP (and refused)"


def test_the_doctor_cli_writes_the_advice_as_amp_toml(tmp_path):
    import json
    import subprocess
    import sys

    script = tmp_path / "attention.py"
    script.write_text(ATTENTION_SCRIPT)
    out = tmp_path / "amp.toml"
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.doctor", "--advise", str(out), "--json",
                           str(script)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(proc.stdout)
    assert data["clean"] and data["fp32_layers"] == ["0.self_attn"]
    assert amp.AmpConfig.from_file(out).fp32_layers == ("0.self_attn",)


def test_rehearse_without_a_model_rounds_ops_and_turns_the_scaler_on():
    big = square_matrix(BIG)
    with amp.rehearse("float16"):
        assert np.isposinf(paddle.matmul(big, big).numpy()).all()
        linear = paddle.nn.Linear(2, 2)
        out = linear(paddle.to_tensor([[1.0 + 2 ** -12, 0.0]]))
        assert np.array_equal(out.numpy(), out.numpy().astype(np.float16).astype(np.float32)), "Linear via F.linear"
        scaler = amp.GradScaler()
        scaler.scale(out.sum())
        assert scaler.is_enable()
    assert np.isfinite(paddle.matmul(big, big).numpy()).all()
    with pytest.raises(ValueError, match="rehearse dtype must be one of"):
        with amp.rehearse("fp16"):
            pass


def test_auto_cast_inside_a_rehearsal_at_its_level_rounds_by_its_lists_without_paddles_guard(monkeypatch):
    """``auto_cast()`` without lists, at the rehearsal's level: the rehearsal's lists go on
    deciding (and a black list it was given still holds) while Paddle's guard is not entered (the
    tracer stays at O0 as in every rehearsal); another level, custom lists, or a master-gradient
    hook Paddle would register enter it."""
    from paddle.amp.auto_cast import amp_global_state

    from paddle_amp_ext import _compat, autocast

    entered = []
    real = _compat.paddle_auto_cast
    monkeypatch.setattr(autocast._compat, "paddle_auto_cast", lambda **kw: entered.append(kw) or real(**kw))
    big = square_matrix(BIG)
    with amp.rehearse(custom_black_list=["matmul"]):
        del entered[:]
        with amp.auto_cast():
            assert np.isfinite(paddle.matmul(big, big).numpy()).all()
        assert entered == []
    with amp.rehearse():
        entered.clear()  # what the rehearsal entered itself
        with amp.auto_cast():
            assert np.isposinf(paddle.matmul(big, big).numpy()).all()
            assert _compat.tracer_amp_level() == "O0"
        assert entered == []
        with amp.auto_cast(level="O2"):
            pass
        with amp.auto_cast(custom_black_list=["matmul"]):
            assert np.isfinite(paddle.matmul(big, big).numpy()).all()
        assert "O2" in [kw["level"] for kw in entered]
        assert "matmul_v2" in entered[-1]["custom_black_list"] and entered[-1]["level"] == "O1"
        state, before = amp_global_state(), len(entered)
        monkeypatch.setattr(state, "use_master_grad", True, raising=False)
        monkeypatch.setattr(state, "already_register_final_backward_hook", True, raising=False)
        with amp.auto_cast():  # the hook is registered already: nothing to do
            pass
        assert len(entered) == before
        monkeypatch.setattr(state, "already_register_final_backward_hook", False, raising=False)
        assert _compat.master_grad_hook_due()
        monkeypatch.setattr(autocast._compat, "master_grad_hook_due", lambda: True)
        with amp.auto_cast():
            assert np.isposinf(paddle.matmul(big, big).numpy()).all()
        assert len(entered) == before + 1 and not entered[-1]["enable"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16", "float64", "int32", "int64", "bool", "uint8"])
def test_the_fast_float32_test_agrees_with_paddles_dtype(dtype, monkeypatch):
    from paddle_amp_ext._compat import tensors

    tensor = paddle.zeros([2], dtype=dtype)
    assert tensors.is_float32(tensor) == (tensor.dtype == paddle.float32) == (dtype == "float32")
    assert tensors.is_float32(paddle.create_parameter([2], "float32"))
    monkeypatch.setattr(tensors, "_FLOAT32_VALUE", None)  # a Paddle whose dtypes have no value
    assert tensors.is_float32(tensor) == (dtype == "float32")


def test_a_grad_hook_added_directly_runs_and_may_replace_the_gradient():
    from paddle_amp_ext._compat.tensors import add_grad_hook

    x = paddle.ones([3])
    x.stop_gradient = False
    y = x * 2.0
    seen = []
    add_grad_hook(y, lambda g: seen.append(g.numpy().copy()) or g * 10.0)
    y.sum().backward()
    np.testing.assert_array_equal(seen[0], np.ones(3, np.float32))
    np.testing.assert_array_equal(x.grad.numpy(), np.full(3, 20.0, np.float32))
