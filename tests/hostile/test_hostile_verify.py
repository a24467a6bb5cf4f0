"""`check --verify` as a hostile user drives it: `--model` specs that are malformed, missing, raising,
not a Layer, on the wrong shapes; comparisons and measurements fed empty, non-finite, mismatched
values; a device runner that raises anything; the report through a closed pipe."""

from __future__ import annotations

import math
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from paddle_amp_ext.check import main
from paddle_amp_ext.gate import DeviceInfo
from paddle_amp_ext.verify import Measurement, ModelError, ModelFacts, judge, verify
from paddle_amp_ext.verify.comparisons import compare_op_dtypes, compare_outputs, compare_unscale, parse_op_stats
from paddle_amp_ext.verify.models import first_float, load, try_forward
from paddle_amp_ext.verify.pipeline import run
from paddle_amp_ext.verify.report import CheckResult

A100 = DeviceInfo(index=0, name="A100", compute_capability=(8, 0), total_memory_bytes=40 * 2**30)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """Write ``hostile_models_N.py`` with the given source; return its module name."""
    counter = iter(range(1000))

    def write(source: str) -> str:
        name = f"hostile_models_{next(counter)}_{abs(hash(source)) % 10**6}"
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        return name

    monkeypatch.syspath_prepend(str(tmp_path))
    return write


# ----------------------------------------------------------------------------- --model
@pytest.mark.parametrize("spec", ["", "nocolon", "a:", ":f", "a:b:c", "1mod:f", "mod:f()", "mod/x:f", " : "])
def test_a_malformed_spec_is_named(spec):
    with pytest.raises(ModelError, match=r"--model expects MODULE:FACTORY \(e\.g\. 'mypkg\.models:small_net'\), "
                                         r"received " + re.escape(repr(spec))):
        load(spec)


def test_a_missing_module_and_one_that_raises_on_import(user_module):
    with pytest.raises(ModelError, match=r"cannot import 'no_such_module_xyz': ModuleNotFoundError"):
        load("no_such_module_xyz:make")
    name = user_module("raise KeyError('boom at import')\n")
    with pytest.raises(ModelError, match=rf"--model {name}:make: cannot import '{name}': KeyError: 'boom at import'"):
        load(f"{name}:make")


def test_a_missing_or_uncallable_factory(user_module):
    name = user_module("make = 3\n")
    with pytest.raises(ModelError, match=rf"module '{name}' has no attribute 'other'"):
        load(f"{name}:other")
    with pytest.raises(ModelError, match=r"'make' is a int, not a callable factory"):
        load(f"{name}:make")


def test_a_dotted_factory_is_found(user_module):
    name = user_module("""
        import paddle
        class Zoo:
            @staticmethod
            def make():
                return paddle.nn.Linear(8, 8), paddle.randn([8, 8])
    """)
    assert try_forward(load(f"{name}:Zoo.make")) == ModelFacts(batch=8)


@pytest.mark.parametrize("body, message", [
    ("raise ValueError('no data dir')", r"the factory raised ValueError: no data dir"),
    ("raise SystemExit(3)", None),
    ("return paddle.nn.Linear(8, 8)", r"the factory must return \(layer, inputs\), received Linear"),
    ("return (paddle.nn.Linear(8, 8),)", r"the factory must return \(layer, inputs\), received tuple"),
    ("return 'model', paddle.randn([2, 8])", r"first value must be a paddle.nn.Layer, received str"),
    ("return paddle.nn.Linear(8, 8), [1.0, 2.0]",
     r"the inputs must be a paddle.Tensor or a tuple/list of them, received \['float', 'float'\]"),
    ("return paddle.nn.Linear(8, 8), ()", r"received an empty sequence"),
    ("return paddle.nn.Linear(8, 8), paddle.randn([2, 5])",
     r"the forward on inputs of shapes \[\[2, 5\]\] raised ValueError"),
    ("return paddle.nn.Flatten(), paddle.to_tensor([[1, 2]])",
     r"the forward returned no floating-point tensor \(received Tensor\)"),
])
def test_a_factory_that_misbehaves(user_module, body, message):
    name = user_module(f"import paddle\ndef make():\n    {body}\n")
    case = load(f"{name}:make")
    if message is None:  # SystemExit is not an Exception: it ends the command, as in the user's own script
        with pytest.raises(SystemExit):
            try_forward(case)
        return
    with pytest.raises(ModelError, match=message):
        try_forward(case)


def test_a_bad_model_is_a_usage_error_before_any_check(user_module, capsys):
    name = user_module("import paddle\ndef make():\n    return paddle.nn.Linear(8, 8), paddle.randn([2, 3])\n")
    assert main(["--verify", "--model", f"{name}:make"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m paddle_amp_ext.check: error: {name}:make: the forward on inputs of shapes")

    class Refuses:
        def __getattr__(self, name):
            raise AssertionError("no device call may run for a bad --model")

    with pytest.raises(ModelError):
        verify(f"{name}:make", runner=Refuses(), gpu=(A100, None))


def test_first_float_looks_into_nested_outputs():
    import paddle

    ints = paddle.to_tensor([1, 2])
    floats = paddle.to_tensor([1.5])
    assert first_float({"ids": ints, "rest": [ints, (floats,)]}) is floats
    with pytest.raises(ModelError, match=r"no floating-point tensor \(received dict\)"):
        first_float({"ids": ints, "none": None})


# ----------------------------------------------------------------------------- comparisons and numbers
@pytest.mark.parametrize("raw", [{"mm": "1,2,3"}, {"mm": "1,2,3,x"}, {"mm": "-1,0,0,0"}, {"mm": None}])
def test_op_stats_that_are_not_four_counts(raw):
    with pytest.raises(ValueError, match=r"op statistics for 'mm': expected four counts 'fp16,bf16,fp32,other'"):
        parse_op_stats(raw)


def test_op_comparison_refuses_other_dtypes_and_levels_and_takes_no_ops():
    with pytest.raises(ValueError, match=r"dtype must be 'float16' or 'bfloat16', received 'float32'"):
        compare_op_dtypes({}, "float32", "O1", (), ())
    with pytest.raises(ValueError, match=r"level must be 'O1' or 'O2', received 'O3'"):
        compare_op_dtypes({}, "float16", "O3", (), ())
    assert compare_op_dtypes({}, "float16", "O1", ("matmul_v2",), ()).agrees


def test_unscale_comparison_with_no_tensors_wrong_lengths_and_shapes():
    assert compare_unscale([], [], False, [], False).status == "same"
    with pytest.raises(ValueError, match=r"received 1 inputs, 0 kernel outputs and 1 emulated outputs"):
        compare_unscale([np.ones(2)], [], False, [np.ones(2)], False)
    shorter = compare_unscale([np.ones(2)], [np.ones(1)], False, [np.ones(2)], False)
    assert shorter.status == "different" and shorter.detail == "tensors [0] differ"
    # -0.0 and 0.0 compare equal; NaN equals NaN; inf differs from NaN
    assert compare_unscale([np.zeros(1)], [np.array([-0.0])], False, [np.zeros(1)], False).status == "same"
    assert compare_unscale([np.array([np.inf])], [np.array([np.nan])], True, [np.array([np.inf])], True
                           ).status == "cpu_zeroing"


def test_output_comparison_with_empty_all_nonfinite_and_bad_arguments():
    empty = compare_outputs(np.zeros((0, 4)), np.zeros((0, 4)), "float16")
    assert (empty.max_abs_error, empty.scale, empty.agrees) == (0.0, 0.0, True)
    nan = compare_outputs(np.full(3, np.nan), np.full(3, np.inf), "bfloat16")
    assert nan.nonfinite_both == 3 and nan.agrees
    many = compare_outputs(np.zeros(100), np.full(100, np.inf), "float16", limit=3)
    assert many.nonfinite_rehearsal_only == (0, 1, 2)
    with pytest.raises(ValueError, match=r"the GPU output has shape \(2,\), the rehearsal's \(3,\)"):
        compare_outputs(np.zeros(2), np.zeros(3), "float16")
    with pytest.raises(ValueError, match=r"dtype must be one of \['bfloat16', 'float16', 'float32'\], "
                                         r"received 'float8'"):
        compare_outputs(np.zeros(2), np.zeros(2), "float8")
    for ulps in (-1, math.inf, math.nan):
        with pytest.raises(ValueError, match=r"ulps must be a finite number >= 0"):
            compare_outputs(np.zeros(2), np.zeros(2), "float16", ulps=ulps)


@pytest.mark.parametrize("rates", [(), (0.0,), (-1.0,), (math.nan,), (math.inf,), ("10",), (None,)])
def test_measurements_that_cannot_be_rates(rates):
    with pytest.raises(ValueError, match=r"fp32: steps_per_s"):
        Measurement("fp32", rates)


def test_a_verdict_without_fp32_or_with_a_configuration_twice():
    with pytest.raises(ValueError, match=r"no 'fp32' measurement among \['O1-float16'\]"):
        judge("m", [Measurement("O1-float16", (1.0,))], ModelFacts(batch=8))
    with pytest.raises(ValueError, match=r"configuration 'fp32' measured twice"):
        judge("m", [Measurement("fp32", (1.0,)), Measurement("fp32", (2.0,))], ModelFacts(batch=8))
    zero_peak = judge("m", [Measurement("fp32", (1.0,), 0), Measurement("O1-float16", (2.0,), 10)], ModelFacts(8))
    assert zero_peak.rows[1].memory_ratio is None  # no division by a zero fp32 peak


def test_a_check_result_with_an_unknown_status():
    with pytest.raises(ValueError, match=r"status must be one of \('pass', 'fail', 'known', 'skip'\), "
                                         r"received 'ok'"):
        CheckResult("x", "ok", "")


# ----------------------------------------------------------------------------- a runner that raises anything
class Exploding:
    def __init__(self, exc: BaseException):
        self.exc = exc

    def __getattr__(self, name):
        def call(*args, **kwargs):
            raise self.exc
        return call


@pytest.mark.parametrize("exc", [RuntimeError("CUDA error 700"), MemoryError(), ValueError(""),
                                 ModelError("--model x:y: the factory raised OSError: gone")])
def test_every_device_failure_becomes_a_failed_check(exc):
    report = run(Exploding(exc), device="gpu", paddle_version="3", dtypes=("float16", "bfloat16"))
    assert report.status == "failed" and report.verdicts == ()
    unscale = [c for c in report.checks if c.name.startswith("check_finite_and_unscale")]
    expected = "skip" if isinstance(exc, RuntimeError) else "fail"  # RuntimeError: no kernel for the dtype
    assert {c.status for c in unscale} == {expected}
    assert {c.status for c in report.checks if c not in unscale} == {"fail"}


def test_a_keyboard_interrupt_is_not_swallowed():
    with pytest.raises(KeyboardInterrupt):
        run(Exploding(KeyboardInterrupt()), device="gpu", paddle_version="3", dtypes=("float16",))


@pytest.mark.parametrize("extra", [["--what-if", "Tesla T4:7.5"], ["--list-ops"]])
def test_verify_refuses_a_pretend_gpu_and_list_ops(extra, capsys):
    assert main(["--verify", *extra]) == 2
    assert "--verify runs on the GPU that is present: it cannot be combined with --what-if or --list-ops" in \
        capsys.readouterr().err


def test_verify_in_a_directory_without_the_users_module_on_the_path(tmp_path):
    (tmp_path / "mine.py").write_text("import paddle\ndef make():\n    return paddle.nn.Linear(8, 8), paddle.randn([8, 8])\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    command = [sys.executable, "-m", "paddle_amp_ext.check", "--verify", "--model", "mine:make"]
    env = {**__import__("os").environ}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=elsewhere, env=env)
    assert proc.returncode == 2 and "cannot import 'mine': ModuleNotFoundError" in proc.stderr
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert proc.returncode == 1 and "(--model mine:make loaded and ran one float32 forward here)" in proc.stdout
