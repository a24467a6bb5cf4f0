"""`check --verify` on this CPU machine: the comparisons, the verdict, the report, the pipeline with a
recorded device runner, the device runner itself on CPU tensors, and the command without a GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Dict, Tuple

import numpy as np
import paddle
import pytest

from paddle_amp_ext.check import main
from paddle_amp_ext.gate import DeviceInfo
from paddle_amp_ext.rehearsal import rehearse
from paddle_amp_ext.verify import Measurement, ModelFacts, judge, verify
from paddle_amp_ext.verify.comparisons import (
    compare_op_dtypes,
    compare_outputs,
    compare_unscale,
    parse_op_stats,
    scale_backed_off,
)
from paddle_amp_ext.verify.gpu_checks import DeviceRunner, OverflowOutcome, UnscaleOutcome
from paddle_amp_ext.verify.models import OVERFLOWING_LINEAR, STANDARD, try_forward
from paddle_amp_ext.verify.pipeline import configs, run, unscale_checks
from paddle_amp_ext.verify.report import CheckResult, VerifyReport, render
from paddle_amp_ext.verify.verdict import odd_dimensions

T4 = DeviceInfo(index=0, name="Tesla T4", compute_capability=(7, 5), total_memory_bytes=16 * 2**30)
INF, NAN = float("inf"), float("nan")


# ----------------------------------------------------------------------------- comparisons
def test_op_stats_parse_and_compare_with_the_lists():
    stats = parse_op_stats({"matmul_v2": "0,0,3,0", "softmax": "2,0,0,0", "relu": "1,0,1,0", "cast": "0,0,9,0",
                            "conv2d": "4,0,0,0"})
    assert stats["matmul_v2"] == (0, 0, 3, 0)
    found = compare_op_dtypes(stats, "float16", "O1", white={"matmul_v2", "conv2d"}, black={"softmax"})
    assert found.mismatches == (
        "matmul_v2: on the white list, ran 3x in float32 and never in float16",
        "softmax: on the black list, ran 2x in float16",
    )
    assert "cast" not in found.ran and found.ran["relu"] == {"float16": 1, "float32": 1}
    assert compare_op_dtypes(stats, "bfloat16", "O2", {"conv2d"}, {"relu"}).agrees is True


def test_unscale_same_cpu_zeroing_and_different():
    inputs = [np.array([2.0, 4.0]), np.array([1.0, INF]), np.array([8.0])]
    emulated = [np.array([1.0, 2.0]), np.array([0.5, INF]), np.array([4.0])]
    assert compare_unscale(inputs, emulated, True, emulated, True).status == "same"
    cpu = [np.array([1.0, 2.0]), np.array([0.0, NAN]), np.array([0.0])]
    zeroing = compare_unscale(inputs, cpu, True, emulated, True)
    assert zeroing.status == "cpu_zeroing"
    assert zeroing.detail.startswith("tensors [1, 2] multiplied by 0 from tensor 1")
    wrong = [np.array([1.0, 2.0]), np.array([0.5, INF]), np.array([4.5])]
    assert compare_unscale(inputs, wrong, True, emulated, True).detail == "tensors [2] differ"
    assert compare_unscale(inputs, emulated, False, emulated, True).detail == "found_inf: kernel False, emulation True"


def test_outputs_error_and_nonfinite_positions():
    gpu = np.array([1.0, INF, 3.0, NAN, 5.0])
    rehearsed = np.array([1.0005, INF, INF, NAN, 5.0])
    found = compare_outputs(gpu, rehearsed, "float16")
    assert found.nonfinite_rehearsal_only == (2,) and found.nonfinite_gpu_only == ()
    assert found.nonfinite_both == 2 and found.scale == 5.0
    assert found.max_abs_error == pytest.approx(0.0005, abs=1e-12)
    assert found.tolerance == 16 * 2.0**-11 * 5.0 and found.agrees is False
    assert compare_outputs(gpu, gpu, "bfloat16").agrees is True


def test_scale_backed_off():
    assert scale_backed_off(65536.0, 32768.0) is None
    assert scale_backed_off(65536.0, 65536.0) == "the loss scale went from 65536.0 to 65536.0, expected 32768.0"


# ----------------------------------------------------------------------------- verdict
def _m(config: str, *rates: float, peak=None, host=None) -> Measurement:
    return Measurement(config, rates, peak, host)


def test_verdict_pays_with_the_fastest_configuration_and_memory_ratio():
    verdict = judge("cnn", [_m("fp32", 10, 10, 10, peak=400), _m("O1-float16", 15, 16, 17, peak=300),
                            _m("O2-float16", 20, 20, 21, peak=200)], ModelFacts(batch=32))
    assert verdict.pays and verdict.best == "O2-float16" and verdict.reasons == ()
    assert [(r.config, r.median, r.speedup, r.memory_ratio) for r in verdict.rows] == [
        ("fp32", 10, 1.0, 1.0), ("O1-float16", 16, 1.6, 0.75), ("O2-float16", 20, 2.0, 0.5)]
    assert verdict.rows[2].spread == 1 / 20


def test_verdict_names_every_reason_amp_does_not_pay():
    facts = ModelFacts(batch=2, odd_dims=odd_dimensions({"fc.weight": [100, 30], "out.weight": [64, 16],
                                                         "conv.weight": [32, 3, 3, 3]}))
    assert facts.odd_dims == ("fc.weight [100, 30]", "conv.weight [32, 3, 3, 3]")
    verdict = judge("mine", [_m("fp32", 100, 100, host=0.95), _m("O1-float16", 101, 102)], facts)
    assert not verdict.pays and verdict.best == "fp32"
    assert verdict.reasons[0].startswith("dimensions not multiples of 8 (fc.weight [100, 30], conv.weight")
    assert verdict.reasons[1].startswith("a batch of 2: too little work per kernel")
    assert verdict.reasons[2].startswith("the loop is bound by the host: issuing a step's ops takes 95%")
    assert len(verdict.reasons) == 3  # the spread (1%) is below the gain (+1.5%)


def test_verdict_calls_noise_inconclusive_and_says_when_no_cause_is_known():
    noisy = judge("m", [_m("fp32", 80, 100, 120), _m("O1-float16", 100, 110)], ModelFacts(batch=64))
    assert noisy.reasons == ("inconclusive: the repeats spread by 40%, more than the +5% difference between "
                             "O1-float16 and fp32",)
    plain = judge("m", [_m("fp32", 100, host=0.2), _m("O1-float16", 90)], ModelFacts(batch=64))
    assert plain.reasons == ("none of the known causes (dimensions, batch, host) applies: O1-float16 ran at "
                             "0.90x fp32",)
    alone = judge("m", [_m("fp32", 100)], ModelFacts(batch=64))
    assert alone.reasons == ("no AMP configuration could run on this GPU",) and alone.best == "fp32"


# ----------------------------------------------------------------------------- pipeline with recorded numbers
class RecordedRunner:
    """The device seam, answering with numbers recorded from the GPU behaviour Paddle's code describes."""

    def __init__(self, white_ran: str = "float16", fail_throughput: bool = False):
        self.white_ran = white_ran
        self.fail_throughput = fail_throughput
        self.calls: Dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def op_stats(self, case, dtype, level) -> Tuple[dict, frozenset, frozenset]:
        self._count("op_stats")
        column = {"float16": 0, "bfloat16": 1, "float32": 2}[dtype if self.white_ran == "float16" else "float32"]
        low = tuple(int(i == column) for i in range(4))
        return {"matmul_v2": low, "softmax": (0, 0, 1, 0)}, frozenset({"matmul_v2"}), frozenset({"softmax"})

    def overflow(self) -> OverflowOutcome:
        self._count("overflow")
        return OverflowOutcome(skipped=True, found_inf=True, scale_before=65536.0, scale_after=32768.0,
                               weights_unchanged=True)

    def unscale(self, dtype) -> UnscaleOutcome:
        self._count("unscale")
        x = (np.array([4.0, INF]),)
        y = (np.array([1.0, INF]),)
        return UnscaleOutcome(x, y, True, y, True, "Place(gpu:0)")

    def rehearsal(self, case, dtype):
        self._count("rehearsal")
        out = np.array([[1.0, 2.0], [INF, 3.0]])
        return out, out + np.array([[0.0, 2.0**-11], [0.0, 0.0]])

    def throughput(self, case, names):
        self._count("throughput")
        if self.fail_throughput:
            raise RuntimeError("out of memory")
        return [_m(n, 10.0 * (2 if n != "fp32" else 1)) for n in names], ModelFacts(batch=32)


def test_the_pipeline_on_a_t4_runs_every_check_and_passes():
    runner = RecordedRunner()
    report = run(runner, device="[0] Tesla T4 (CC 7.5)", paddle_version="3.3.1", dtypes=("float16",),
                 rehearsal_cases=(OVERFLOWING_LINEAR,))
    assert runner.calls == {"op_stats": 4, "overflow": 1, "unscale": 3, "rehearsal": 3, "throughput": 2}
    assert report.status == "passed" and [c.status for c in report.checks] == ["pass"] * 11
    assert [c.name for c in report.checks][:4] == ["op dtypes: cnn O1 float16", "op dtypes: cnn O2 float16",
                                                   "op dtypes: transformer O1 float16",
                                                   "op dtypes: transformer O2 float16"]
    assert [v.best for v in report.verdicts] == ["O1-float16", "O1-float16"]
    text = render(report)
    assert "[ok  ] overflow: float16 through the GradScaler: found_inf, step skipped, weights unchanged, " \
           "scale 65536 -> 32768" in text
    assert "11 checks, 0 failed" in text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["status"] == "passed" and data["verdicts"][0]["rows"][1]["speedup"] == 2.0


def test_the_pipeline_reports_ops_in_float32_and_a_failing_device_as_failed_checks():
    runner = RecordedRunner(white_ran="float32", fail_throughput=True)
    report = run(runner, device="gpu", paddle_version="3.3.1", dtypes=("float16", "bfloat16"))
    assert report.status == "failed" and report.verdicts == ()
    ops = [c for c in report.checks if c.name.startswith("op dtypes")]
    assert len(ops) == 8 and {c.status for c in ops} == {"fail"}
    assert ops[0].details == ("matmul_v2: on the white list, ran 1x in float32 and never in float16",)
    assert [c.summary for c in report.checks if c.name.startswith("throughput")] == [
        "raised RuntimeError: out of memory"] * 2


def test_a_gpu_without_amp_dtypes_skips_them():
    report = run(RecordedRunner(), device="gpu", paddle_version="3.3.1", dtypes=())
    assert report.checks[0].status == "skip" and "overflow" not in {c.name.split(":")[0] for c in report.checks}
    assert configs(()) == ("fp32",) and configs(("float16",)) == ("fp32", "O1-float16", "O2-float16")


# ----------------------------------------------------------------------------- the device runner on CPU tensors
def test_the_real_unscale_kernel_on_the_cpu_is_reported_as_the_known_cpu_difference():
    checks = unscale_checks(DeviceRunner())
    float16, bfloat16, float32 = checks
    assert float32.status == "known" and float32.data == {"comparison": "cpu_zeroing"}
    assert float32.summary.startswith("on Place(cpu): tensors [1, 2, 3, 4] multiplied by 0 from tensor 1")
    for check in (float16, bfloat16):  # Paddle's CPU build registers the kernel for float32/float64 only
        assert check.status == "skip" and "(NotFound)" in check.summary


def test_the_real_overflow_check_under_the_rehearsal_skips_and_halves_the_scale():
    with rehearse("float16"):
        outcome = DeviceRunner().overflow()
    assert outcome == OverflowOutcome(skipped=True, found_inf=True, scale_before=65536.0, scale_after=32768.0,
                                      weights_unchanged=True)


def test_the_real_op_statistics_on_the_cpu_show_auto_cast_doing_nothing():
    stats, white, black = DeviceRunner().op_stats(STANDARD[1], "float16", "O1")
    assert stats["matmul_v2"] == (0, 0, 8, 0) and "matmul_v2" in white and "softmax" in black
    found = compare_op_dtypes(stats, "float16", "O1", white, black)
    assert "matmul_v2: on the white list, ran 8x in float32 and never in float16" in found.mismatches


def test_the_real_rehearsal_comparison_finds_the_overflowing_rows():
    gpu, rehearsed = DeviceRunner().rehearsal(OVERFLOWING_LINEAR, "float16")  # on a CPU "gpu" is float32
    assert np.isfinite(gpu).all() and gpu[:, 0].tolist() == [12800.0 * i for i in range(16)]
    assert np.isinf(rehearsed[6:]).all() and np.isfinite(rehearsed[:6]).all()
    found = compare_outputs(gpu, rehearsed, "float16")
    assert found.nonfinite_rehearsal_only == tuple(range(6 * 64, 6 * 64 + 8))


def test_the_real_throughput_measurement_on_the_cpu():
    names = configs(("float16", "bfloat16"))  # on a CPU the AMP configurations run in float32: the loop is tested
    measured, facts = DeviceRunner().throughput(STANDARD[0], names, repeats=2, steps=1, warmup=1)
    assert [m.config for m in measured] == list(names) and {len(m.steps_per_s) for m in measured} == {2}
    assert {m.peak_memory_bytes for m in measured} == {None}
    assert all(0 < m.host_fraction <= 1 for m in measured)
    assert facts == ModelFacts(batch=32, odd_dims=("0.weight [32, 3, 3, 3]",))
    assert [r.config for r in judge("cnn", measured, facts).rows] == list(names)


def test_the_standard_models_run_in_float32():
    assert try_forward(STANDARD[1]) == ModelFacts(batch=16)


# ----------------------------------------------------------------------------- the command without a GPU
def test_verify_without_a_gpu_lists_the_plan_and_exits_1(capsys):
    assert main(["--verify"]) == 1
    out = capsys.readouterr().out
    assert "Needs a CUDA GPU: Paddle is a CPU build" in out and "Nothing was run." in out
    assert "a real float16 overflow through the GradScaler" in out


def test_verify_json_without_a_gpu(capsys):
    assert main(["--verify", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "needs_gpu" and data["checks"] == [] and len(data["plan"]) == 5
    assert data["needs_gpu"].startswith("Paddle is a CPU build")


def test_verify_with_a_gpu_stand_in_runs_the_pipeline():
    report = verify(runner=RecordedRunner(), gpu=(T4, None))
    assert report.device == "[0] Tesla T4 (CC 7.5)" and report.status == "passed"
    assert not any("bfloat16" in c.name for c in report.checks if c.name.startswith("op dtypes"))


def test_model_without_verify_is_a_usage_error(capsys):
    assert main(["--model", "x:y"]) == 2
    assert "--model needs --verify" in capsys.readouterr().err


def test_verify_loads_the_users_model_on_a_cpu(tmp_path, monkeypatch, capsys):
    (tmp_path / "mymodel.py").write_text(
        "import paddle\n"
        "def make():\n"
        "    return paddle.nn.Linear(12, 8), paddle.randn([4, 12])\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert main(["--verify", "--model", "mymodel:make", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["model"] == "mymodel:make" and data["plan"][-1].endswith(
        "and on --model mymodel:make, with the reason when AMP does not pay")


def test_verify_in_a_fresh_process_prints_no_traceback():
    proc = subprocess.run([sys.executable, "-m", "paddle_amp_ext.check", "--verify"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stdout.startswith(f"paddle-amp-ext check --verify (Paddle {paddle.__version__})")


def test_report_status_and_check_result_values():
    assert VerifyReport("3", None, "no GPU", ()).status == "needs_gpu"
    failed = VerifyReport("3", "gpu", None, (), (CheckResult("a", "pass", ""), CheckResult("b", "fail", "")))
    assert failed.status == "failed"


class QuickRunner(DeviceRunner):
    def throughput(self, case, names):
        return super().throughput(case, names, repeats=1, steps=1, warmup=1)


def test_the_whole_pipeline_on_the_cpu_fails_where_auto_cast_does_nothing():
    """The real device runner on a CPU, where AMP is off: the checks must say so (they can fail)."""
    report = run(QuickRunner(), device="cpu", paddle_version=paddle.__version__, dtypes=("float16",),
                 rehearsal_cases=(OVERFLOWING_LINEAR,))
    status = {c.name: c.status for c in report.checks}
    assert report.status == "failed"
    assert status["op dtypes: cnn O1 float16"] == status["op dtypes: transformer O2 float16"] == "fail"
    overflow = next(c for c in report.checks if c.name.startswith("overflow"))
    assert overflow.summary == ("found_inf was False; the optimizer step was not skipped; the weights changed; "
                                "the loss scale went from 1.0 to 1.0, expected 0.5")
    assert [status[f"check_finite_and_unscale: {d}"] for d in ("float16", "bfloat16", "float32")] == [
        "skip", "skip", "known"]
    linear = next(c for c in report.checks if c.name == "rehearsal vs GPU: overflowing Linear float16")
    assert linear.status == "fail" and linear.data["nonfinite_rehearsal_only"] == list(range(384, 392))
    assert [v.model for v in report.verdicts] == ["cnn", "transformer"]
