"""``python -m paddle_amp_ext.check``: the GPU capability report and the AMP verdict.

Collect into a frozen record, render it as text or JSON, return an exit code (the convention of
:mod:`paddle_amp_ext.cli`): 0 usable (or no ``--require``), 1 not usable for ``--require``,
2 usage error.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import numpy

from .._native import NativeStatus
from .._native import status as rounding_status
from ..config import AmpConfig
from ..fp8 import readiness as fp8_ready
from ..gate import AmpDecision, DeviceInfo, decide
from . import FOUND, OK, UsageError, emit, fail, parse

_WHAT_IF = re.compile(r"^(?P<name>.+?):(?P<cc>\d+)\.(?P<minor>\d)(?::(?P<mem>\d+(?:\.\d+)?))?$")


@dataclass(frozen=True)
class CheckReport:
    paddle_version: str
    cuda_version: Optional[str]
    cudnn_version: Optional[str]
    numpy_version: str
    devices: Tuple[DeviceInfo, ...]
    decision: AmpDecision
    probe_reason: Optional[str]
    notes: Tuple[str, ...]
    what_if: bool = False
    smoke: Optional[str] = None
    device: Optional[DeviceInfo] = None  # the GPU the verdict is for
    rounding: Optional[NativeStatus] = None  # the fp16 rehearsal's rounding kernel
    fp8: Tuple[fp8_ready.RecipeVerdict, ...] = ()  # per FP8 recipe (paddle_amp_ext.fp8.readiness)

    def to_dict(self) -> dict:
        return {
            "paddle_version": self.paddle_version,
            "cuda_version": self.cuda_version,
            "cudnn_version": self.cudnn_version,
            "numpy_version": self.numpy_version,
            "what_if": self.what_if,
            "probe_reason": self.probe_reason,
            "devices": [
                {
                    "index": d.index,
                    "name": d.name,
                    "compute_capability": d.cc_text,
                    "total_memory_mb": d.total_memory_mb,
                    "tensor_cores": d.tensor_cores,
                    "fp16": d.supports_fp16,
                    "bf16": d.supports_bf16,
                }
                for d in self.devices
            ],
            "decision": self.decision.to_dict(),
            "notes": list(self.notes),
            "smoke": self.smoke,
            "rehearsal_rounding": None if self.rounding is None else {
                "native": self.rounding.available, "detail": self.rounding.detail},
            "fp8": [v.to_dict() for v in self.fp8],
        }


def parse_what_if(text: str) -> DeviceInfo:
    """``"NAME:CC[:MEM_GB]"`` (e.g. ``"Tesla T4:7.5:16"``) as a DeviceInfo.

    Raises:
        ValueError: the text does not have that form.
    """
    match = _WHAT_IF.match(text.strip())
    if not match:
        raise ValueError(
            f"--what-if expects NAME:CC[:MEM_GB], e.g. 'Tesla T4:7.5:16'. Received: {text!r}"
        )
    memory = float(match["mem"]) if match["mem"] else 0.0
    return DeviceInfo(
        index=0,
        name=match["name"],
        compute_capability=(int(match["cc"]), int(match["minor"])),
        total_memory_bytes=int(memory * 2**30),
    )


def numpy_notes(paddle_version: Tuple[int, int, int], numpy_version: str) -> List[str]:
    """Known Paddle/numpy incompatibilities for these versions."""
    major_minor = tuple(int(p) for p in re.findall(r"\d+", numpy_version)[:2])
    notes = []
    if paddle_version[0] >= 3 and major_minor >= (2, 4):
        notes.append(
            f"numpy {numpy_version}: paddle.amp.GradScaler crashes at the first overflow "
            "(TypeError: only 0-dimensional arrays can be converted to Python scalars); "
            "paddle_amp_ext.GradScaler is not affected."
        )
    if paddle_version[:2] <= (2, 6) and major_minor >= (2, 0):
        notes.append(
            f"numpy {numpy_version}: Paddle {'.'.join(map(str, paddle_version))} is built "
            "against numpy 1.x; install 'numpy<2'."
        )
    return notes


def smoke_test(devices: Sequence[DeviceInfo], dtype: str) -> str:
    """A tiny auto_cast matmul on the GPU; reports the output dtype."""
    if not devices:
        return "skipped: no GPU"
    if dtype == "float32":
        return "skipped: AMP is off on this GPU"
    import paddle

    from ..autocast import auto_cast

    try:
        x = paddle.randn([64, 64])
        with auto_cast(dtype=dtype):
            out = paddle.matmul(x, x)
        got = str(out.dtype).replace("paddle.", "")
    except Exception as exc:  # report, never a traceback
        return f"failed: {exc!r}"
    return f"ok: matmul under auto_cast gave {got}" if got == dtype else f"failed: got {got}, expected {dtype}"


def collect(requested: str = "auto", what_if: Optional[DeviceInfo] = None, smoke: bool = False) -> CheckReport:
    """Probe Paddle and the GPUs; never raises for a failed probe."""
    from .. import _compat
    from ..device import _current_index, probe_report

    report = probe_report()
    if what_if is not None:
        devices: Tuple[DeviceInfo, ...] = (what_if,)
        device: Optional[DeviceInfo] = what_if
    else:
        devices = report.devices
        device = next((d for d in devices if d.index == _current_index()), None)
    decision = decide(device, requested, cuda_version=report.cuda_version,
                      no_device_reason=report.reason or "no CUDA GPU is visible")
    notes = numpy_notes(_compat.PADDLE_VERSION, numpy.__version__) + [f"probe error: {e}" for e in report.errors]
    smoke_text = None
    if smoke:
        smoke_text = "skipped: --what-if GPU is not present" if what_if else smoke_test(report.devices, decision.dtype)
    return CheckReport(
        paddle_version=report.paddle_version,
        cuda_version=report.cuda_version,
        cudnn_version=report.cudnn_version,
        numpy_version=numpy.__version__,
        devices=devices,
        decision=decision,
        probe_reason=None if what_if else report.reason,
        notes=tuple(notes),
        what_if=what_if is not None,
        smoke=smoke_text,
        device=device,
        rounding=rounding_status(),
        fp8=fp8_ready.fp8_readiness(device, fp8_ready.probe_software(),
                                    no_device_reason=report.reason or "no CUDA GPU is visible"),
    )


def render(report: CheckReport) -> str:
    yes = {True: "yes", False: "no"}
    lines = [
        "paddle-amp-ext check",
        f"  Paddle        {report.paddle_version}",
        f"  CUDA / cuDNN  {report.cuda_version or 'CPU build'} / {report.cudnn_version or '-'}",
        f"  numpy         {report.numpy_version}",
    ]
    if report.rounding is not None:
        lines.append(f"  fp16 rehearsal rounds with the {report.rounding}")
    lines += [
        "",
        "GPUs" + (" (what-if, not present)" if report.what_if else ""),
    ]
    if not report.devices:
        lines.append(f"  none: {report.probe_reason or 'could not collect'}")
    for d in report.devices:
        memory = f"{d.total_memory_mb / 1024:.1f} GiB" if d.total_memory_bytes else "memory unknown"
        lines.append(
            f"  [{d.index}] {d.name}  CC {d.cc_text}  {memory}  Tensor Cores: {yes[d.tensor_cores]}"
            f"  fp16: {yes[d.supports_fp16]}  bf16: {yes[d.supports_bf16]}"
        )
    dec = report.decision
    lines += [
        "",
        f"Verdict: {dec.dtype}" + (" with dynamic loss scaling" if dec.use_loss_scaling else "")
        + ("" if dec.enabled else " (AMP off)"),
        f"  {dec.reason}",
    ]
    if report.smoke is not None:
        lines.append(f"Smoke test: {report.smoke}")
    lines += fp8_ready.render(report.fp8)
    if report.notes:
        lines.append("")
        lines += [f"Note: {n}" for n in report.notes]
    return "\n".join(lines)


def usable(report: CheckReport, require: Optional[str]) -> bool:
    if require is None:
        return True
    if require == "fp8":
        return fp8_ready.fp8_usable(report.fp8)
    d = report.device
    if d is None:
        return False
    bf16 = report.decision.dtype == "bfloat16" or (d.supports_bf16 and report.decision.enabled)
    return {"fp16": d.supports_fp16, "bf16": bf16, "any": d.supports_fp16}[require]


def list_ops(dtype: str, level: str, config: Optional[AmpConfig], config_path: Optional[str] = None) -> dict:
    """The effective white/black lists Paddle's tracer holds for these settings."""
    from ..autocast import effective_op_lists

    if config is not None:
        dtype = config.dtype if config.dtype != "auto" else dtype
        level = config.level
    white, black = effective_op_lists(dtype, level, config)
    return {"dtype": dtype, "level": level, "config": config_path, "white": sorted(white), "black": sorted(black)}


def render_ops(ops: dict) -> str:
    return "\n".join([f"Effective op lists for dtype={ops['dtype']} level={ops['level']}"
                      + (f" with {ops['config']}" if ops["config"] else "") + ":",
                      f"white ({len(ops['white'])}): " + ", ".join(ops["white"]),
                      f"black ({len(ops['black'])}): " + ", ".join(ops["black"])])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m paddle_amp_ext.check",
        description="GPU capability report and AMP verdict for PaddlePaddle.",
        epilog="Exit codes: 0 usable (or no --require), 1 not usable for --require, 2 usage error.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--require", choices=("fp16", "bf16", "any", "fp8"),
                        help="exit 1 unless this AMP precision is usable (fp8: any FP8 recipe)")
    parser.add_argument("--what-if", metavar="NAME:CC[:MEM_GB]",
                        help="evaluate the gate for a GPU that is not present, e.g. 'Tesla T4:7.5:16'")
    parser.add_argument("--smoke", action="store_true", help="run a tiny auto_cast matmul on the GPU")
    parser.add_argument("--list-ops", action="store_true", help="print the effective white/black op lists")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"),
                        help="dtype for --list-ops (default float16)")
    parser.add_argument("--level", default="O1", choices=("O1", "O2"), help="level for --list-ops")
    parser.add_argument("--config", metavar="FILE",
                        help="an AmpConfig TOML/JSON file: its dtype is the request, its lists feed --list-ops")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Exit codes: 0 usable (or no ``--require``), 1 not usable for ``--require``, 2 usage error."""
    parser = build_parser()
    try:
        args = parse(parser, argv)
        config = _read_config(args.config)
        what_if = parse_what_if(args.what_if) if args.what_if is not None else None
    except UsageError as exc:
        return fail(parser.prog, str(exc))
    except ValueError as exc:
        return fail(parser.prog, str(exc))
    if args.list_ops:
        ops = list_ops(args.dtype, args.level, config, args.config)
        emit(ops, render_ops(ops), args.json)
        return OK
    requested = "auto" if config is None else (config.dtype if config.enable else "float32")
    report = collect(requested=requested, what_if=what_if, smoke=args.smoke)
    emit(report.to_dict(), render(report), args.json)
    return OK if usable(report, args.require) else FOUND


def _read_config(path: Optional[str]) -> Optional[AmpConfig]:
    if path is None:
        return None
    try:
        return AmpConfig.from_file(path)
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"--config {path!r}: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
