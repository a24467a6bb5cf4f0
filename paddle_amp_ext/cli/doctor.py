"""``python -m paddle_amp_ext.doctor [--dtype D] [--loss-scale S] [--json] SCRIPT [ARGS...]``.

``--fp8 RECIPE``: the FP8 doctor instead (:mod:`._doctor_fp8`).

Also ``paddle-amp-doctor``. Exit codes (see :mod:`paddle_amp_ext.cli`): 0 every watched value fit and the script ended
normally, 1 an overflow was found or the model is already inf/nan in float32 (``--advise``: the
rehearsal with the proposal is not clean, or the batch is not finite in float32: nothing is
written), 2 usage error (bad flag, missing script, a directory),
3 the script failed on its own (an exception or a non-zero ``sys.exit``) and no overflow was
found (``--advise``: before its first model call). The report is printed however the script
ended, after what Python would print for it (a traceback, a ``sys.exit("message")``).
"""

from __future__ import annotations

import argparse
import sys
from typing import List, Optional

from . import FOUND, OK, SCRIPT_FAILED, UsageError, _doctor_fp8, emit, fail, parse, positive_float, report_script_end
from ._doctor_fp8 import RECIPES

PROG = "python -m paddle_amp_ext.doctor"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Run a Paddle training script and name the first layer whose forward or "
        "backward value would overflow fp16 (or is already inf/nan). Exit 0 clean, 1 overflow, "
        "2 usage error, 3 the script failed.",
    )
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"))
    parser.add_argument("--loss-scale", type=positive_float, default=1.0,
                        help="check backward values as if the loss were scaled by this (> 0)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--advise", metavar="AMP_TOML",
                        help="instead: run the script to its first model call, measure that batch in float32 and in "
                             "rehearsal, print the advice and write the proposed config to AMP_TOML (exit 0 when the "
                             "rehearsal with it is clean, 1 when not or when the batch is inf/nan in float32)")
    parser.add_argument("--fp8", metavar="RECIPE", choices=RECIPES,
                        help="instead: run the script with its nn.Linear layers in FP8 under RECIPE (blockwise, "
                             "current or delayed) and name the layer and tensor that lose most, with the fix; "
                             "with --advise, write fp8_exclude_layers to AMP_TOML (exit 1 when a tensor loses "
                             "more than 1%%)")
    parser.add_argument("script")
    parser.add_argument("args", nargs=argparse.REMAINDER)
    return parser


def main(argv: Optional[List[str]] = None) -> int:
    from ..rehearsal.script import run_script
    from ..run._scripting import claim_start_entry

    try:
        args = parse(build_parser(), argv)
    except UsageError as exc:
        return fail(PROG, str(exc))
    if argv is None:
        claim_start_entry()  # the script's folder replaces the command's on sys.path, as python script.py
    if args.fp8:
        return _doctor_fp8.run(PROG, args)
    if args.advise:
        return _advise(args)
    try:
        run = run_script(args.script, args.args, args.dtype, args.loss_scale)
    except FileNotFoundError as exc:
        return fail(PROG, str(exc))
    report_script_end(run.error, run.exit_message)
    report = run.report
    code = FOUND if report else (OK if run.exit_code == 0 else SCRIPT_FAILED)
    culprit = report.culprit
    data = {
        "overflow": bool(report),
        "dtype": report.dtype,
        "limit": report.limit,
        "float32_finite": culprit is None or not culprit.in_float32,
        "finding": None if culprit is None else {
            "layer": culprit.layer, "layer_type": culprit.layer_type, "op": culprit.op, "ops": list(culprit.ops),
            "direction": culprit.direction, "max_abs": culprit.max_abs, "in_float32": culprit.in_float32,
            "fixes": culprit.fixes(report.dtype)},
        "script_exit_code": run.exit_code,
        "script_error": None if run.error is None else repr(run.error),
        "script_exit_message": run.exit_message,
        "exit_code": code,
    }
    ended = ("stopped by the doctor" if run.exit_code is None else
             f"the script raised {type(run.error).__name__}" if run.error is not None else
             f"the script exited with code {run.exit_code}")
    emit(data, f"{report}\n({ended}; exit code {code})", args.json)
    return code


def _advise(args: argparse.Namespace) -> int:
    from ..rehearsal.advisor import advise
    from ..rehearsal.script import capture_first_call
    from ..run._scripting import ScriptEnd

    try:
        call = capture_first_call(args.script, args.args)
    except FileNotFoundError as exc:
        return fail(PROG, str(exc))
    if isinstance(call, ScriptEnd):
        report_script_end(call.error, call.exit_message)
        if call.error is None and call.exit_code == 0:
            return fail(PROG, f"{args.script} ended without calling a paddle.nn.Layer: nothing to advise on.")
        how = (f"raised {type(call.error).__name__}" if call.error is not None
               else f"exited with code {call.exit_code}")
        print(f"{PROG}: {args.script} {how} before its first model call: nothing to advise on "
              f"(exit code {SCRIPT_FAILED}).", file=sys.stderr, flush=True)
        return SCRIPT_FAILED
    model, inputs, kwargs = call
    if kwargs:
        return fail(PROG, f"the script's first model call passes keyword inputs {sorted(kwargs)}: call "
                          "paddle_amp_ext.advise(model, ...) from Python instead.")
    advice = advise(model, *inputs, dtype=args.dtype)
    if advice.float32_nonfinite is not None:  # nothing to certify, nothing written
        data = {"dtype": advice.dtype, "fp32_layers": [], "clean": False, "float32_finite": False,
                "config": None, "notes": list(advice.notes)}
        emit(data, f"{advice}\nNothing written to {args.advise}.", args.json)
        return FOUND
    try:
        with open(args.advise, "w", encoding="utf-8") as out:
            proposal = advice.to_config()
            out.write(proposal.to_toml(keys=proposal.given))  # what it proposes: run --config applies each key
    except OSError as exc:
        return fail(PROG, f"cannot write --advise {args.advise!r}: {exc}")
    data = {"dtype": advice.dtype, "fp32_layers": list(advice.fp32_layers), "clean": advice.clean,
            "float32_finite": True, "config": args.advise, "notes": list(advice.notes)}
    emit(data, f"{advice}\nWrote {args.advise}.", args.json)
    return OK if advice.clean else FOUND


if __name__ == "__main__":
    sys.exit(main())
