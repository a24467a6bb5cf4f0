"""``check --verify``'s checks in order: ask a device runner for numbers, judge them, report.

The runner (:class:`.gpu_checks.DeviceRunner` on a GPU) is passed in, so the whole pipeline runs in
tests with one that returns recorded numbers.
"""

from __future__ import annotations

import time
from typing import Any, List, Optional, Sequence, Tuple

from .comparisons import compare_op_dtypes, compare_outputs, compare_unscale, scale_backed_off
from .models import STANDARD, ModelCase, ModelError
from .report import CheckResult, VerifyReport
from .verdict import Verdict, judge

LEVELS = ("O1", "O2")
UNSCALE_DTYPES = ("float16", "bfloat16", "float32")


def configs(dtypes: Sequence[str]) -> Tuple[str, ...]:
    """``"fp32"`` and each level with each dtype, e.g. ``("fp32", "O1-float16", "O2-float16")``."""
    return ("fp32",) + tuple(f"{level}-{dtype}" for dtype in dtypes for level in LEVELS)


def plan(dtypes: Sequence[str], model: Optional[str] = None) -> Tuple[str, ...]:
    """One line per check, in the order they run."""
    names = [c.name for c in STANDARD]
    shown = ", ".join(dtypes) if dtypes else "float16 and bfloat16, where the GPU has them"
    steps = [
        f"auto_cast O1 and O2 ({shown}) on the {' and '.join(names)}: which ops ran in which dtype "
        "(Paddle's operator statistics), against the white/black lists",
        "a real float16 overflow through the GradScaler: found_inf, the step skipped, the weights "
        "unchanged, the loss scale halved",
        "Paddle's check_finite_and_unscale kernel against the package's emulation of it, on the same "
        "finite/inf/NaN tensors in float16, bfloat16 and float32",
        f"the rehearsal (fp16_emulation, on the CPU) against the GPU's auto_cast forward ({shown}) on "
        f"the {', '.join(names)} and an overflowing Linear: max error, inf/NaN positions",
        f"throughput: fp32 against O1 and O2 ({shown}), steps/s (median and spread of interleaved "
        f"repeats) and peak memory, on the {' and '.join(names)}"
        + (f" and on --model {model}" if model else "") + ", with the reason when AMP does not pay",
    ]
    return tuple(steps)


def _guarded(name: str, work: Any) -> Any:
    """Run ``work()``; a failure of it is a failed check, not a traceback."""
    try:
        return work()
    except ModelError as exc:
        return CheckResult(name, "fail", str(exc))
    except Exception as exc:  # a device error is what this command exists to report
        return CheckResult(name, "fail", f"raised {type(exc).__name__}: {exc}")


def op_dtype_checks(runner: Any, dtypes: Sequence[str]) -> List[CheckResult]:
    """One check per standard model, dtype and level: the counted op dtypes against the lists."""
    results = []
    for case in STANDARD:
        for dtype in dtypes:
            for level in LEVELS:
                name = f"op dtypes: {case.name} {level} {dtype}"

                def work(case: ModelCase = case, dtype: str = dtype, level: str = level,
                         name: str = name) -> CheckResult:
                    stats, white, black = runner.op_stats(case, dtype, level)
                    found = compare_op_dtypes(stats, dtype, level, white, black)
                    low = sorted(op for op, ran in found.ran.items() if dtype in ran)
                    summary = f"{len(low)} of {len(found.ran)} ops ran in {dtype}: {', '.join(low) or 'none'}"
                    return CheckResult(name, "pass" if found.agrees else "fail", summary, found.mismatches,
                                       {"ran": found.ran})

                results.append(_guarded(name, work))
    return results


def overflow_check(runner: Any) -> CheckResult:
    """The float16 overflow through the scaler: found_inf, skipped, weights unchanged, scale halved."""
    name = "overflow: float16 through the GradScaler"

    def work() -> CheckResult:
        out = runner.overflow()
        problems = [text for ok, text in ((out.found_inf, "found_inf was False"),
                                          (out.skipped, "the optimizer step was not skipped"),
                                          (out.weights_unchanged, "the weights changed")) if not ok]
        backoff = scale_backed_off(out.scale_before, out.scale_after)
        problems += [backoff] if backoff else []
        summary = (f"found_inf, step skipped, weights unchanged, scale {out.scale_before:g} -> "
                   f"{out.scale_after:g}") if not problems else "; ".join(problems)
        return CheckResult(name, "fail" if problems else "pass", summary, (),
                           {"found_inf": out.found_inf, "skipped": out.skipped, "scale_before": out.scale_before,
                            "scale_after": out.scale_after, "weights_unchanged": out.weights_unchanged})

    return _guarded(name, work)


def unscale_checks(runner: Any) -> List[CheckResult]:
    """One check per dtype: Paddle's unscale kernel against the emulation ("known" for the CPU
    kernel's zeroing on a CPU place, "skip" where the kernel has no such dtype)."""
    results = []
    for dtype in UNSCALE_DTYPES:
        name = f"check_finite_and_unscale: {dtype}"

        def work(dtype: str = dtype, name: str = name) -> CheckResult:
            try:
                out = runner.unscale(dtype)
            except RuntimeError as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                return CheckResult(name, "skip", f"Paddle's kernel has no {dtype} version here: {first}")
            found = compare_unscale(out.inputs, out.kernel, out.kernel_found, out.emulated, out.emulated_found)
            if found.status == "same":
                status = "pass"
            elif found.status == "cpu_zeroing" and "cpu" in out.place.lower():
                status = "known"  # the CPU kernel's documented behaviour, not the CUDA one's
            else:
                status = "fail"
            return CheckResult(name, status, f"on {out.place}: {found.detail}", (), {"comparison": found.status})

        results.append(_guarded(name, work))
    return results


def rehearsal_checks(runner: Any, dtypes: Sequence[str], cases: Sequence[ModelCase]) -> List[CheckResult]:
    """One check per case and dtype: the rehearsal's output against the device's."""
    results = []
    for case in cases:
        for dtype in dtypes:
            name = f"rehearsal vs GPU: {case.name} {dtype}"

            def work(case: ModelCase = case, dtype: str = dtype, name: str = name) -> CheckResult:
                gpu, rehearsed = runner.rehearsal(case, dtype)
                found = compare_outputs(gpu, rehearsed, dtype)
                summary = (f"max error {found.max_abs_error:.3g} (tolerance {found.tolerance:.3g}, output up to "
                           f"{found.scale:.3g}), inf/NaN at {found.nonfinite_both} positions in both")
                details = []
                if found.nonfinite_gpu_only:
                    details.append(f"inf/NaN on the GPU only at {list(found.nonfinite_gpu_only)}")
                if found.nonfinite_rehearsal_only:
                    details.append(f"inf/NaN in the rehearsal only at {list(found.nonfinite_rehearsal_only)}")
                data = {"max_abs_error": found.max_abs_error, "tolerance": found.tolerance, "scale": found.scale,
                        "nonfinite_both": found.nonfinite_both,
                        "nonfinite_gpu_only": list(found.nonfinite_gpu_only),
                        "nonfinite_rehearsal_only": list(found.nonfinite_rehearsal_only)}
                return CheckResult(name, "pass" if found.agrees else "fail", summary, tuple(details), data)

            results.append(_guarded(name, work))
    return results


def throughput(runner: Any, cases: Sequence[ModelCase], dtypes: Sequence[str]
               ) -> Tuple[List[Verdict], List[CheckResult]]:
    """A verdict per case; a failed check instead for a case whose measurement raised."""
    verdicts, failures = [], []
    for case in cases:
        outcome = _guarded(f"throughput: {case.name}", lambda case=case: runner.throughput(case, configs(dtypes)))
        if isinstance(outcome, CheckResult):
            failures.append(outcome)
            continue
        measured, facts = outcome
        verdicts.append(judge(case.name, measured, facts))
    return verdicts, failures


def run(runner: Any, *, device: str, paddle_version: str, dtypes: Sequence[str],
        user: Optional[ModelCase] = None, rehearsal_cases: Sequence[ModelCase] = ()) -> VerifyReport:
    """Every check on ``runner``'s device; never raises for a failing check.

    Args:
        runner: a :class:`.gpu_checks.DeviceRunner` or a stand-in with its methods.
        device: the device's description for the report.
        paddle_version: the installed Paddle's version.
        dtypes: the low-precision dtypes this device supports (``"float16"``, ``"bfloat16"``).
        user: the ``--model`` case.
        rehearsal_cases: extra cases for the rehearsal comparison (the overflowing Linear).
    """
    start = time.perf_counter()
    checks: List[CheckResult] = []
    if not dtypes:
        checks.append(CheckResult("AMP dtypes", "skip", "this GPU supports neither float16 nor bfloat16 AMP"))
    checks += op_dtype_checks(runner, dtypes)
    if "float16" in dtypes:
        checks.append(overflow_check(runner))
    checks += unscale_checks(runner)
    checks += rehearsal_checks(runner, dtypes, tuple(STANDARD) + tuple(rehearsal_cases))
    verdicts, failures = throughput(runner, tuple(STANDARD) + ((user,) if user else ()), dtypes)
    checks += failures
    return VerifyReport(paddle_version=paddle_version, device=device, needs_gpu=None,
                        plan=plan(dtypes, user.name if user else None), checks=tuple(checks),
                        verdicts=tuple(verdicts), model=user.name if user else None,
                        elapsed_s=time.perf_counter() - start)
