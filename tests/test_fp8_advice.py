"""The FP8 doctor (diagnose) and advisor (advise_fp8 -> AmpConfig.fp8_exclude_layers)."""

from __future__ import annotations

import paddle
import pytest

from paddle_amp_ext import AmpConfig, fp8_linears
from paddle_amp_ext.fp8.advice import advise_fp8, diagnose
from paddle_amp_ext.fp8.stats import Fp8Stats


def model_and_input():
    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(200, 64), paddle.nn.ReLU(), paddle.nn.Linear(64, 8))
    x = paddle.full([8, 200], 1e-4)
    x[:, 0] = 100.0
    return model, x


def test_diagnose_names_layer_tensor_and_fix_and_the_advisor_keeps_it_out():
    model, x = model_and_input()
    with fp8_linears(model, "current") as stats:
        model(x)
    text = diagnose(stats)
    assert text.startswith("layer '0' input: 99.50% of nonzero values flush to zero (e4m3fn); keep the layer in bf16")
    config = advise_fp8(stats, AmpConfig(dtype="bfloat16"))
    assert config.fp8_exclude_layers == ("0",) and config.dtype == "bfloat16"
    with fp8_linears(model, "current", exclude=config.fp8_exclude_layers) as again:
        model(x)
    assert diagnose(again) == "FP8 loses little: no tensor of 1 FP8 linears saturates or flushes more than 1.0% of its values."


def test_advisor_keeps_existing_exclusions_and_round_trips():
    model, x = model_and_input()
    with fp8_linears(model, "current") as stats:
        model(x)
    config = advise_fp8(stats, AmpConfig(fp8_exclude_layers=["2"]))
    assert config.fp8_exclude_layers == ("2", "0")
    assert AmpConfig.from_dict(config.to_dict()) == config
    assert "fp8_exclude_layers" in config.given
    assert AmpConfig.from_dict({"fp8_exclude_layers": ["a.b"]}).to_dict()["fp8_exclude_layers"] == ["a.b"]


def test_diagnose_without_records():
    assert diagnose(Fp8Stats()).startswith("No FP8 quantization was recorded")


@pytest.mark.parametrize("value, error, match", [
    ("lm_head", TypeError, "fp8_exclude_layers must be an iterable"),
    ([3], TypeError, "fp8_exclude_layers must contain only str"),
    ([""], ValueError, "fp8_exclude_layers=\\[''\\] contains ''"),
])
def test_config_field_validation(value, error, match):
    with pytest.raises(error, match=match):
        AmpConfig(fp8_exclude_layers=value)


@pytest.mark.parametrize("args, error, match", [
    (("stats",), TypeError, "stats must be the Fp8Stats that fp8_linears yields. Received: str"),
    ((Fp8Stats(), None, 1.5), ValueError, "threshold must be a fraction in \\[0, 1\\). Received: threshold=1.5"),
    ((Fp8Stats(), {"dtype": "bfloat16"}), TypeError, "config must be an AmpConfig. Received: dict"),
])
def test_advisor_hostile_arguments(args, error, match):
    with pytest.raises(error, match=match):
        advise_fp8(*args)


def test_findings_reduce_once_and_agree_with_the_separate_calls(monkeypatch):
    from paddle_amp_ext.fp8.advice import findings

    model, x = model_and_input()
    with fp8_linears(model, "current") as stats:
        model(x)
        model(x * 1e6)  # a second call: two records per tensor to reduce
    calls = []
    real = Fp8Stats.summary
    monkeypatch.setattr(Fp8Stats, "summary", lambda self: calls.append(1) or real(self))
    found = findings(stats)
    assert len(calls) == 1, "the doctor's report reduces the records once"
    monkeypatch.setattr(Fp8Stats, "summary", real)
    assert found.summary == stats.summary() and found.worst == stats.worst(0.01)
    assert found.diagnosis == diagnose(stats) and found.advise() == advise_fp8(stats)
    assert found.lossy_layers == ("0",) and (found.quantizations, found.layers) == (8, 2)
    assert findings(stats, threshold=0.999).worst is None


@pytest.mark.parametrize("args, error, match", [
    (("stats",), TypeError, "stats must be the Fp8Stats that fp8_linears yields. Received: str"),
    ((Fp8Stats(), -0.1), ValueError, "threshold must be a fraction in \\[0, 1\\). Received: threshold=-0.1"),
    ((Fp8Stats(), float("nan")), ValueError, "threshold must be a fraction in \\[0, 1\\). Received: threshold=nan"),
    ((Fp8Stats(), True), ValueError, "threshold must be a fraction"),
])
def test_findings_hostile_arguments(args, error, match):
    from paddle_amp_ext.fp8.advice import findings

    with pytest.raises(error, match=match):
        findings(*args)


def test_findings_of_empty_stats_and_a_wrong_config():
    from paddle_amp_ext.fp8.advice import findings

    empty = findings(Fp8Stats())
    assert (empty.summary, empty.worst, empty.lossy_layers, empty.quantizations, empty.layers) == ([], None, (), 0, 0)
    assert empty.diagnosis.startswith("No FP8 quantization was recorded")
    assert empty.advise(AmpConfig(fp8_exclude_layers=["x"])).fp8_exclude_layers == ("x",)
    with pytest.raises(TypeError, match="config must be an AmpConfig. Received: str"):
        empty.advise("bfloat16")
