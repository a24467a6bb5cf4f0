"""The doctor's FP8 mode: ``python -m paddle_amp_ext.doctor --fp8 RECIPE [--advise AMP_TOML] SCRIPT``.

Runs the script with its ``nn.Linear`` layers as FP8 linears under ``RECIPE`` (and Paddle's FP8
kernels emulated on Paddle 3.x: :func:`~paddle_amp_ext.fp8.script.run_script_fp8`), then prints
:func:`~paddle_amp_ext.fp8.advice.diagnose`: the layer and tensor (input, weight, output
gradient) that lose most, and the fix. With ``--advise`` it writes ``fp8_exclude_layers``
(:func:`~paddle_amp_ext.fp8.advice.advise_fp8`) to the TOML file. Exit 0 when no tensor loses
more than 1% of its values and the script ended normally, 1 when one does (``--advise``: the
file is written all the same), 3 when the script failed and nothing lost more, 2 usage errors.
"""

from __future__ import annotations

import argparse
from typing import Any, Dict

from . import FOUND, OK, SCRIPT_FAILED, emit, fail, report_script_end

RECIPES = ("blockwise", "current", "delayed")


def run(prog: str, args: argparse.Namespace) -> int:
    """The ``--fp8`` mode of the doctor (``args`` from its parser); returns the exit code."""
    from ..fp8.advice import findings
    from ..fp8.script import run_script_fp8

    if args.dtype != "float16" or args.loss_scale != 1.0:
        return fail(prog, "--dtype and --loss-scale apply to the fp16/bf16 doctor, not with --fp8")
    try:
        ran = run_script_fp8(args.script, args.args, args.fp8)
    except FileNotFoundError as exc:
        return fail(prog, str(exc))
    report_script_end(ran.error, ran.exit_message)
    found = findings(ran.stats)  # the records reduced once, for every part of the report
    code = FOUND if found.worst is not None else (OK if ran.exit_code == 0 else SCRIPT_FAILED)
    text = [f"FP8 rehearsal, recipe {args.fp8!r}: {found.quantizations} quantizations of "
            f"{found.layers} FP8 linears in {ran.models} model(s).", found.diagnosis]
    data: Dict[str, Any] = {"fp8": args.fp8, "worst": found.worst, "diagnosis": found.diagnosis,
                            "summary": found.summary, "notes": ran.notes, "script_exit_code": ran.exit_code,
                            "script_error": None if ran.error is None else repr(ran.error),
                            "script_exit_message": ran.exit_message, "config": None}
    if args.advise:
        config = found.advise()
        try:
            with open(args.advise, "w", encoding="utf-8") as out:
                out.write(config.to_toml(keys=["fp8_exclude_layers"]))
        except OSError as exc:
            return fail(prog, f"cannot write --advise {args.advise!r}: {exc}")
        data["config"], data["fp8_exclude_layers"] = args.advise, list(config.fp8_exclude_layers)
        text.append(f"Wrote {args.advise}: fp8_exclude_layers = {list(config.fp8_exclude_layers)}.")
    data["exit_code"] = code
    text += [f"Note: {note}." for note in ran.notes]
    emit(data, "\n".join(text) + f"\n(exit code {code})", args.json)
    return code
