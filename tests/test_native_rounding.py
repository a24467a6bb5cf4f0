"""The one-pass F16C float16 rounding kernel: built on first use, cached, loaded; exact; and the
rehearsal falls back to Paddle's kernels, with the same results, wherever it cannot be had."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import numpy as np
import paddle
import pytest
from helpers import bf16, fp16, kernel_name, no_compiler, require_native_kernel

import paddle_amp_ext as amp
from paddle_amp_ext._compat import kernels
from paddle_amp_ext._native import build, probes
from paddle_amp_ext.rehearsal import rounding

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def wide_values(size, seed=0):
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(size) * 10.0 ** rng.integers(-12, 7, size)
    return values.astype(np.float32)


def test_builds_into_the_cache_and_loads_from_it(rebuild):
    require_native_kernel()
    first = build.status()
    assert first.available and first.detail.startswith(str(rebuild)), first
    library = os.path.basename(first.detail)
    assert sorted(os.listdir(rebuild)) == [library[:-3] + ".json", library], "the library and its record, nothing partial"
    assert str(first).startswith("native F16C kernel: ")
    build.reset()
    built_at = os.path.getmtime(first.detail)
    assert build.status() == first and os.path.getmtime(first.detail) == built_at, "loaded, not built again"


def test_a_damaged_cached_library_is_built_again(rebuild, monkeypatch, tmp_path):
    require_native_kernel()
    folder = tmp_path / "damaged"
    folder.mkdir()
    monkeypatch.setenv(build.ENV_CACHE, str(folder))
    build.reset()
    path = str(folder / kernel_name())
    with open(path, "wb") as handle:  # (never over a loaded library: its mapping would break)
        handle.write(b"\x7fELF cut short by a full disk")
    current = build.status()
    assert current.available, current
    assert current.detail == (f"{path} (built again: {path} was not loaded: it has no record of its build "
                              f"({kernel_name()[:-3]}.json))")
    assert os.path.getsize(path) > 1000


def test_an_unusable_cache_folder_builds_in_a_temporary_one(rebuild, monkeypatch, tmp_path):
    require_native_kernel()
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("a file where the cache folder should be")
    monkeypatch.setenv(build.ENV_CACHE, str(blocked))
    build.reset()
    current = build.status()
    assert current.available, current
    assert current.detail.startswith(f"built in a temporary folder ({blocked}: ")


def test_a_library_built_before_loads_without_a_compiler(rebuild, monkeypatch, tmp_path):
    """As in docker/Dockerfile.cpu: built at image build time, the compiler removed after."""
    require_native_kernel()
    built = build.status()
    build.reset()
    no_compiler(monkeypatch, tmp_path)
    assert build.status() == built


def test_a_damaged_library_without_a_compiler_says_both(rebuild, monkeypatch, tmp_path):
    rebuild.mkdir()
    name = build.library_prefix() + "0" * 12 + ".so"  # without a compiler, any of this build's names
    (rebuild / name).write_bytes(b"not a library")
    if build.platform.machine().lower() not in build._X86:
        pytest.skip("no F16C kernel is built on this CPU")
    no_compiler(monkeypatch, tmp_path)
    current = build.status()
    assert not current.available
    assert current.detail == (f"{rebuild / name} was not loaded: it has no record of its build "
                              f"({name[:-3]}.json), and no C compiler found (set CC, or install gcc)")


def test_a_full_cache_disk_builds_in_a_temporary_folder(rebuild, monkeypatch, tmp_path):
    """The compiler cannot write into the cache folder (as on a full disk): built again in a
    private temporary folder, and the reason kept."""
    require_native_kernel()
    real, full = build.compiler(), tmp_path / "full"
    monkeypatch.setenv(build.ENV_CACHE, str(full))
    build.reset()
    wrapper = tmp_path / "cc"
    wrapper.write_text(f"""#!/bin/sh
case "$*" in *{full}*) echo "fatal error: write failed: No space left on device" >&2; exit 1;; esac
exec {' '.join(real)} "$@"
""")
    wrapper.chmod(0o755)
    monkeypatch.setenv("CC", str(wrapper))
    current = build.status()
    assert current.available, current
    assert current.detail == (f"built in a temporary folder ({full}: {wrapper} failed (exit 1): "
                              "fatal error: write failed: No space left on device)")
    assert os.listdir(full) == [], "nothing half-written left in the cache"


def test_without_a_compiler_the_reason_is_given(rebuild, monkeypatch, tmp_path):
    if build.platform.machine().lower() not in build._X86:
        pytest.skip("no F16C kernel is built on this CPU")
    no_compiler(monkeypatch, tmp_path)
    current = build.status()
    assert not current.available and build.fp16_rounder() is None
    assert current.detail == "no C compiler found (set CC, or install gcc)"
    assert str(current) == "Paddle kernels (13 passes): no C compiler found (set CC, or install gcc)"


def test_a_failing_compiler_is_named(rebuild, monkeypatch):
    if build.platform.machine().lower() not in build._X86:
        pytest.skip("no F16C kernel is built on this CPU")
    monkeypatch.setenv("CC", "false")
    current = build.status()
    assert not current.available
    assert current.detail.startswith("false failed (exit 1)"), current.detail
    assert [p for p in os.listdir(rebuild)] == [], "the partial output is removed"


@pytest.mark.parametrize("value", ["0", "off", "False", "no"])
def test_the_switch_turns_it_off(rebuild, monkeypatch, value):
    monkeypatch.setenv(build.ENV_SWITCH, value)
    assert build.status().detail == f"turned off by {build.ENV_SWITCH}={value}"
    assert build.fp16_rounder() is None
    values = wide_values(5000)
    np.testing.assert_array_equal(kernels.round_to_float16(paddle.to_tensor(values)).numpy(), fp16(values))


def test_an_unknown_switch_value_warns_and_keeps_it_on(rebuild, monkeypatch, caplog_amp):
    monkeypatch.setenv(build.ENV_SWITCH, "sometimes")
    build.status()
    assert "PADDLE_AMP_EXT_NATIVE='sometimes' is not one of 0/1" in caplog_amp.text


def test_processes_building_at_once_share_one_library(rebuild):
    require_native_kernel()
    code = "from paddle_amp_ext._native import status; s = status(); print(s.available, s.detail)"
    env = {**os.environ, build.ENV_CACHE: str(rebuild)}
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
             for _ in range(3)]
    outputs = {p.communicate(timeout=120)[0].strip() for p in procs}
    assert len(outputs) == 1 and outputs.pop().startswith(f"True {rebuild}")
    assert len(os.listdir(rebuild)) == 2, "one library and its record"


def test_in_place_writes_into_the_tensor_and_views_are_handled():
    require_native_kernel()
    values = wide_values(4096).reshape(64, 64)
    x = paddle.to_tensor(values)
    pointer = x.data_ptr()
    out = kernels.round_to_float16(x, in_place=True)
    assert out.data_ptr() == pointer
    np.testing.assert_array_equal(x.numpy(), fp16(values))
    fresh = paddle.to_tensor(values)
    copy = kernels.round_to_float16(fresh)
    assert copy.data_ptr() != fresh.data_ptr()
    np.testing.assert_array_equal(fresh.numpy(), values, "the input is kept")
    transposed = paddle.to_tensor(values).t()  # a strided view on Paddle 3.x and 2.6: not contiguous
    np.testing.assert_array_equal(kernels.round_to_float16(transposed).numpy(), fp16(values.T))
    np.testing.assert_array_equal(kernels.round_to_float16(transposed, in_place=True).numpy(), fp16(values.T))
    np.testing.assert_array_equal(transposed.numpy(), values.T, "a strided view is rounded in a copy")
    rows = paddle.to_tensor(values)[10:20]  # a view with an offset
    np.testing.assert_array_equal(kernels.round_to_float16(rows).numpy(), fp16(values[10:20]))
    empty = paddle.to_tensor(np.zeros((0, 3), np.float32))
    assert kernels.round_to_float16(empty).shape == [0, 3]


@pytest.mark.parametrize("dtype, rounder", [("float16", "fp16_rounder"), ("bfloat16", "bf16_rounder")])
def test_a_rehearsal_trains_the_same_with_either_kernel(monkeypatch, dtype, rounder):
    require_native_kernel()

    def run():
        paddle.seed(0)
        model = paddle.nn.Sequential(paddle.nn.Linear(64, 256), paddle.nn.ReLU(), paddle.nn.Linear(256, 1))
        opt = paddle.optimizer.AdamW(learning_rate=1e-3, parameters=model.parameters())
        x, y = paddle.randn([128, 64]) * 30, paddle.randn([128, 1])
        losses = []
        with amp.fp16_emulation(model, dtype):
            for _ in range(3):
                with amp.auto_cast(dtype=dtype):
                    loss = paddle.nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                opt.clear_grad()
                losses.append(float(loss))
        return losses, [p.numpy() for p in model.parameters()]

    native_losses, native_params = run()
    monkeypatch.setattr(kernels, rounder, lambda: None)
    fallback_losses, fallback_params = run()
    assert native_losses == fallback_losses
    for a, b in zip(native_params, fallback_params):
        np.testing.assert_array_equal(a, b)


def check_script():
    spec = importlib.util.spec_from_file_location("check_fp16_rounding",
                                                  os.path.join(ROOT, "scripts", "check_fp16_rounding.py"))
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    return script


def test_every_bit_pattern_of_a_sample_rounds_as_numpy_does():
    """Every 4099th float32 bit pattern (1M values over all exponents) through both kernels;
    ``scripts/check_fp16_rounding.py`` checks all 2**32."""
    script = check_script()
    which = ["native", "arithmetic"] if build.status().available else ["arithmetic"]
    report = script.check(which, step=4099)
    for name in which:
        assert report[name]["checked"] == 1047809 and report[name]["wrong"] == 0, report
    assert script.passed(report)
    assert report["arithmetic"]["zero_sign"] > 0, "the documented +0 for flushed negatives"


def test_every_bit_pattern_of_a_sample_rounds_to_the_nearest_bfloat16():
    """Every 4099th float32 bit pattern, and every pattern of the subnormal and overflow ends,
    through the bfloat16 kernels there are (one-pass, Paddle's cast where it is exact,
    arithmetic): nearest-even, signs of zero kept, nan for nan."""
    script = check_script()
    which = script.available("bfloat16", "both")
    assert "arithmetic" in which and ("cast" in which) == paddle.__version__.startswith("3.")
    for start, stop, step, count in ((0, 1 << 32, 4099, 1047809), (0x80000000, 0x80020000, 1, 1 << 17),
                                     (0x7F7F0000, 0x7F810000, 1, 1 << 17)):
        report = script.check(which, step=step, start=start, stop=stop, dtype="bfloat16")
        for name in which:
            assert report[name]["checked"] == count and report[name]["wrong"] == 0, report
            assert report[name]["zero_sign"] == 0, report
    assert script.passed(report, "bfloat16")


def test_the_bfloat16_probe_is_nearest_even():
    """The values the loader checks a built library with are bfloat16's nearest-even roundings."""
    values, expected = probes.bf16_probe()
    np.testing.assert_array_equal(np.array(expected, np.float32), bf16(values))
    assert np.signbit(np.array(expected, np.float32)[values.index(-0.0)])


def test_bfloat16_in_place_writes_into_the_tensor_and_views_are_handled():
    require_native_kernel()
    values = wide_values(4096).reshape(64, 64)
    values[0, :4] = [-0.0, -1e-45, np.inf, np.nan]
    x = paddle.to_tensor(values)
    pointer = x.data_ptr()
    assert kernels.round_to_bfloat16(x, in_place=True).data_ptr() == pointer
    np.testing.assert_array_equal(x.numpy(), bf16(values))
    assert np.signbit(x.numpy()[0, :2]).all()
    fresh = paddle.to_tensor(values)
    copy = kernels.round_to_bfloat16(fresh)
    assert copy.data_ptr() != fresh.data_ptr()
    np.testing.assert_array_equal(fresh.numpy(), values, "the input is kept")
    transposed = paddle.to_tensor(values).t()
    np.testing.assert_array_equal(kernels.round_to_bfloat16(transposed).numpy(), bf16(values.T))
    np.testing.assert_array_equal(kernels.round_to_bfloat16(transposed, in_place=True).numpy(), bf16(values.T))
    np.testing.assert_array_equal(transposed.numpy(), values.T, "a strided view is rounded in a copy")
    np.testing.assert_array_equal(rounding.round_values(paddle.to_tensor(values).t(), "bfloat16").numpy(),
                                  bf16(values.T))
    np.testing.assert_array_equal(rounding.round_values(paddle.to_tensor(values)[10:20], "bfloat16").numpy(),
                                  bf16(values[10:20]))
    assert kernels.round_to_bfloat16(paddle.to_tensor(np.zeros((0, 3), np.float32))) is None


@pytest.mark.parametrize("switch", ["1", "0"])
def test_bfloat16_round_trips_match_with_either_kernel(rebuild, monkeypatch, switch):
    """Large and small tensors, with and without a gradient, in place or not: the same values
    whichever kernel rounds (the switch turns the one-pass kernel off)."""
    monkeypatch.setenv(build.ENV_SWITCH, switch)
    build.reset()
    if switch == "1":
        require_native_kernel()
    assert rounding.kernel("bfloat16").split(" (")[0] == (
        "bf16 kernel" if switch == "1" else "Paddle cast" if rounding.cast_is_exact("bfloat16") else "Paddle arithmetic")
    for size in (100, 5000, 70000):
        values = wide_values(size, seed=size)
        x = paddle.to_tensor(values, stop_gradient=False)
        y = rounding.round_trip(x * 1.0, "bfloat16", in_place=True)
        np.testing.assert_array_equal(y.numpy(), bf16(values))
        (y * paddle.to_tensor(values)).sum().backward()
        np.testing.assert_array_equal(x.grad.numpy(), bf16(values))
        np.testing.assert_array_equal(rounding.round_values(paddle.to_tensor(values), "bfloat16").numpy(),
                                      bf16(values))


def test_a_cached_library_without_the_kernels_is_not_used(rebuild, monkeypatch, tmp_path):
    """A library under the cache's name that lacks the rounding symbols (another source, no record
    of its build): never loaded, named, and both kernels built again in its place."""
    require_native_kernel()
    folder = tmp_path / "other"
    folder.mkdir()
    source, target = tmp_path / "other.c", folder / kernel_name()
    source.write_text("int pae_something_else(void) { return 0; }\n")
    subprocess.run([*build.compiler(), "-shared", "-fPIC", "-o", str(target), str(source)], check=True, timeout=120)
    monkeypatch.setenv(build.ENV_CACHE, str(folder))
    build.reset()
    current = build.status()
    assert current.available and build.bf16_rounder() is not None
    assert current.detail.startswith(f"{target} (built again: {target} was not loaded: it has no record of its build")


@pytest.mark.parametrize("n", [1, 7, 8, 31, 32, 33, 4096, 65537])
def test_the_finiteness_scan_finds_every_inf_and_nan_and_agrees_with_the_sum_test(n, monkeypatch):
    require_native_kernel()
    assert probes.wrong_finite_answer(build.finite_scanner()) == ""
    rng = np.random.default_rng(n)
    values = (rng.standard_normal(n) * 1e4).astype(np.float32)
    assert kernels.all_finite(paddle.to_tensor(values))
    for position in {0, n // 2, n - 1}:
        for bad in (np.inf, -np.inf, np.nan):
            poisoned = values.copy()
            poisoned[position] = bad
            assert not kernels.all_finite(paddle.to_tensor(poisoned)), (bad, position)
    huge = np.full(max(n, 2), 3.0e38, dtype=np.float32)  # finite, though its sum overflows
    assert kernels.all_finite(paddle.to_tensor(huge))
    monkeypatch.setattr(kernels, "finite_scanner", lambda: None)  # the fallback: the sum's test
    assert not kernels.all_finite(paddle.to_tensor(huge))
    assert kernels.all_finite(paddle.to_tensor(values)) == bool(np.isfinite(values.sum()))


@pytest.mark.parametrize("width", build.WIDTHS)
def test_every_vector_width_rounds_exactly_at_every_length(width):
    """The 16-, 8- and 1-value code paths (AVX-512F, AVX2/F16C, plain C), each capped at in turn
    on this CPU: the bit-pattern sample and every length from 0 to 70 (vector bodies and tails),
    in place and into another buffer, as numpy rounds (float16) and nearest-even (bfloat16)."""
    require_native_kernel()
    from paddle_amp_ext._native import vector_bits

    script = check_script()
    try:
        in_effect = vector_bits(width)
        assert in_effect <= width
        for dtype in ("float16", "bfloat16"):
            report = script.check(["native"], step=4099, dtype=dtype)
            assert report["native"]["wrong"] == 0 and report["native"]["zero_sign"] == 0, (width, dtype, report)
        for n in range(71):
            values = wide_values(n, seed=n)
            for dtype, rounder, expected in (("float16", build.fp16_rounder(), fp16(values)),
                                             ("bfloat16", build.bf16_rounder(), bf16(values))):
                out = np.empty_like(values)
                rounder(values.ctypes.data, out.ctypes.data, n)
                np.testing.assert_array_equal(out, expected, err_msg=f"{dtype}, {n} values, {width} bits")
                copy = values.copy()
                rounder(copy.ctypes.data, copy.ctypes.data, n)
                np.testing.assert_array_equal(copy, expected, err_msg=f"{dtype} in place, {n}, {width} bits")
    finally:
        vector_bits(build.WIDTHS[0])


def test_the_probe_reaches_every_lane():
    """A rounder wrong in one lane of a 16-value vector only (past the probe's own length) fails
    the load-time probe."""
    import ctypes

    values, expected = probes.fp16_probe()

    def rounder(wrong_lane):
        def round_values(src, dst, n):
            source, buffer = (ctypes.c_float * n).from_address(src), (ctypes.c_float * n).from_address(dst)
            rounded = fp16(np.array(source[:], np.float32))
            for i in range(n):
                buffer[i] = float(rounded[i]) + (1.0 if i == wrong_lane else 0.0)
            return 0
        return round_values

    assert len(values) < 33 < probes.TILED
    assert not probes.wrong_answer(rounder(None), (values, expected))
    assert probes.wrong_answer(rounder(33), (values, expected))
