"""``python -m paddle_amp_ext.check``: the GPU capability report and the AMP verdict.

Collect into a frozen record, render it as text or JSON, return an exit code (the convention of
:mod:`paddle_amp_ext.cli`): 0 usable (or no ``--require``), 1 not usable for ``--require`` (the
reason on stderr and in ``--json``), 2 usage error, Paddle not installed included. Nothing is
written: the rehearsal's kernel is only looked up, unless ``--build-kernel`` asks for it.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple, Union

import numpy

from .. import _deferred
from .._native import NativeStatus, build
from ..backends import Accelerator, paddle_support
from ..config import AmpConfig
from ..errors import AmpUnsupportedError
from ..gate import AmpDecision, DeviceInfo, decide
from ._common import FOUND, OK, UsageError, emit, fail, parse
from ._whatif import WHAT_IF_FORMS, parse_what_if

if TYPE_CHECKING:
    from ..fp8 import readiness as fp8_ready

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
    accelerator: Optional[Accelerator] = None  # a ROCm GPU, XPU or custom device: Paddle's own rule decides
    rules_of: Tuple[int, ...] = ()  # the Paddle version whose rules judged the accelerator
    requirements: Tuple[Tuple[str, AmpDecision], ...] = ()  # --require fp16/bf16/any: the gate's answer
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
            "accelerator": None if self.accelerator is None else {
                **self.accelerator.to_dict(), **dict(zip(("fp16", "bf16", "rule"),
                                                         paddle_support(self.accelerator, self.rules_of)))},
            "decision": self.decision.to_dict(),
            "notes": list(self.notes),
            "smoke": self.smoke,
            "rehearsal_rounding": None if self.rounding is None else {
                "native": self.rounding.available, "detail": self.rounding.detail},
            "fp8": [v.to_dict() for v in self.fp8],
        }


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


REQUIRES = {"fp16": "float16", "bf16": "bfloat16", "any": "auto"}
Device = Union[DeviceInfo, Accelerator, None]


def requirement(device: Device, require: str, cuda_version: Optional[str], no_device: str,
                paddle_version: Tuple[int, ...]) -> AmpDecision:
    """The gate's answer for ``--require`` (``fp16``, ``bf16`` or ``any``), without warnings."""
    try:
        return decide(device, REQUIRES[require], strict=True, cuda_version=cuda_version, no_device_reason=no_device,
                      paddle_version=paddle_version)
    except AmpUnsupportedError as exc:
        return AmpDecision(False, "float32", False, str(exc), REQUIRES[require], fallback=True)


def _probe_accelerator(notes: List[str]) -> Optional[Accelerator]:
    from ..device import probe_accelerator

    try:
        return probe_accelerator()
    except RuntimeError as exc:
        notes.append(f"probe error: {exc}")
        return None


def collect(requested: str = "auto", what_if: Device = None, smoke: bool = False,
            build_kernel: bool = False) -> CheckReport:
    """Probe Paddle and the GPUs; never raises for a failed probe. Writes nothing unless
    ``build_kernel`` (then the rehearsal's kernel is built in its cache if it is not there)."""
    from .. import _compat
    from ..device import _current_index, probe_report

    report = probe_report()
    notes = numpy_notes(_compat.PADDLE_VERSION, numpy.__version__) + [f"probe error: {e}" for e in report.errors]
    accelerator = what_if if isinstance(what_if, Accelerator) else None
    if what_if is None:
        accelerator = _probe_accelerator(notes)
    devices: Tuple[DeviceInfo, ...] = ()
    device: Device = accelerator
    if isinstance(what_if, DeviceInfo):
        devices, device = (what_if,), what_if
    elif what_if is None and accelerator is None:
        devices = report.devices
        device = next((d for d in devices if d.index == _current_index()), None)
    no_device = report.reason or "no CUDA GPU is visible"
    version = _compat.PADDLE_VERSION
    decision = decide(device, requested, cuda_version=report.cuda_version, no_device_reason=no_device,
                      paddle_version=version)
    requirements = tuple((name, requirement(device, name, report.cuda_version, no_device, version))
                         for name in REQUIRES)
    smoke_text = None
    if smoke:
        smoke_text = "skipped: --what-if device is not present" if what_if else smoke_test(report.devices,
                                                                                            decision.dtype)
    return CheckReport(
        paddle_version=report.paddle_version,
        cuda_version=report.cuda_version,
        cudnn_version=report.cudnn_version,
        numpy_version=numpy.__version__,
        devices=devices,
        decision=decision,
        probe_reason=None if what_if is not None or accelerator is not None else report.reason,
        notes=tuple(notes),
        what_if=what_if is not None,
        smoke=smoke_text,
        device=device if isinstance(device, DeviceInfo) else None,
        rounding=build.status() if build_kernel else build.cached_status(),
        requirements=requirements,
        accelerator=accelerator,
        rules_of=version,
        fp8=_fp8_verdicts(device, accelerator, no_device),
    )


def _fp8_verdicts(device: Device, accelerator: Optional[Accelerator], no_device: str) -> tuple:
    """Per FP8 recipe, whether this device and software run it (Paddle's FP8 kernels are CUDA's only).

    Imported here: ``paddle_amp_ext.fp8`` imports Paddle, and ``check`` must answer without it."""
    from ..fp8 import readiness as fp8_ready

    if accelerator is not None:
        no_device = f"Paddle's FP8 kernels are CUDA-only; this device is {accelerator.kind}"
    return fp8_ready.fp8_readiness(device if isinstance(device, DeviceInfo) else None, fp8_ready.probe_software(),
                                   no_device_reason=no_device)


def _fp8_lines(report: CheckReport) -> List[str]:
    from ..fp8 import readiness as fp8_ready

    return fp8_ready.render(report.fp8)


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
        ("Devices" if report.accelerator is not None else "GPUs")
        + (" (what-if, not present)" if report.what_if else ""),
    ]
    if report.accelerator is not None:
        fp16, bf16, rule = paddle_support(report.accelerator, report.rules_of)
        lines.append(f"  {report.accelerator.label}  fp16: {yes[fp16]}  bf16: {yes[bf16]}  ({rule})")
    elif not report.devices:
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
    lines += _fp8_lines(report)
    if report.notes:
        lines.append("")
        lines += [f"Note: {n}" for n in report.notes]
    return "\n".join(lines)


def unmet(report: CheckReport, require: Optional[str]) -> Optional[str]:
    """Why ``--require`` is not met (``--require bf16: ...``), or None when it is (or was not asked)."""
    if require is None:
        return None
    if require == "fp8":
        if any(v.ok for v in report.fp8):
            return None
        return "--require fp8 is not met: no FP8 recipe can run here (see the FP8 recipes lines for why)"
    decision = dict(report.requirements)[require]
    return None if decision.enabled else f"--require {require} is not met: {decision.reason}"


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
        epilog="Exit codes: 0 usable (or no --require; --verify: every check passed), 1 not usable for "
               "--require (why: on stderr; --verify: a check failed, or no GPU to run them on), 2 usage error "
               "or Paddle not installed.",
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--require", choices=("fp16", "bf16", "any", "fp8"),
                        help="exit 1 unless this AMP precision is usable (fp8: any FP8 recipe)")
    parser.add_argument("--what-if", metavar="DEVICE",
                        help=f"evaluate the gate for a device that is not present: {WHAT_IF_FORMS}")
    parser.add_argument("--smoke", action="store_true", help="run a tiny auto_cast matmul on the GPU")
    parser.add_argument("--build-kernel", action="store_true",
                        help="build the fp16 rehearsal's rounding kernel in its cache now if it is not there "
                             "(without it, check writes nothing)")
    parser.add_argument("--list-ops", action="store_true", help="print the effective white/black op lists")
    parser.add_argument("--dtype", default="float16", choices=("float16", "bfloat16"),
                        help="dtype for --list-ops (default float16)")
    parser.add_argument("--level", default="O1", choices=("O1", "O2"), help="level for --list-ops")
    parser.add_argument("--verify", action="store_true",
                        help="run AMP for real on this GPU and check it against the package (docs/verify.md)")
    parser.add_argument("--model", metavar="MODULE:FACTORY",
                        help="with --verify: also time your model; FACTORY() returns (layer, inputs)")
    parser.add_argument("--config", metavar="FILE",
                        help="an AmpConfig TOML/JSON file: its dtype is the request, its lists feed --list-ops")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Exit codes: 0 usable (or no ``--require``), 1 not usable for ``--require``, 2 usage error
    (Paddle not installed included)."""
    parser = build_parser()
    try:
        args = parse(parser, argv)
        config = _read_config(args.config)
        what_if = parse_what_if(args.what_if) if args.what_if is not None else None
        _require_paddle()
    except (UsageError, ValueError) as exc:
        return fail(parser.prog, str(exc))
    if args.model is not None and not args.verify:
        return fail(parser.prog, "--model needs --verify")
    if args.verify and (args.what_if is not None or args.list_ops):
        return fail(parser.prog, "--verify runs on the GPU that is present: it cannot be combined with "
                    "--what-if or --list-ops")
    if args.verify:
        from .verify import run_verify  # imports Paddle: only after _require_paddle() said it is there

        return run_verify(parser.prog, args.model, args.json)
    if args.list_ops:
        ops = list_ops(args.dtype, args.level, config, args.config)
        emit(ops, render_ops(ops), args.json)
        return OK
    requested = "auto" if config is None else (config.dtype if config.enable else "float32")
    report = collect(requested=requested, what_if=what_if, smoke=args.smoke, build_kernel=args.build_kernel)
    why_not = unmet(report, args.require)
    data = report.to_dict()
    if args.require is not None:
        data["require"] = {"name": args.require, "met": why_not is None, "reason": why_not}
    emit(data, render(report), args.json)
    if why_not is not None:
        print(f"{parser.prog}: {why_not}", file=sys.stderr, flush=True)
        return FOUND
    return OK


def _require_paddle() -> None:
    """Raise :class:`UsageError` naming what is missing when paddle cannot be imported."""
    try:
        import paddle  # noqa: F401
    except ImportError as exc:
        raise UsageError(f"PaddlePaddle cannot be imported ({exc}). {_deferred.INSTALL_PADDLE}") from None


def _read_config(path: Optional[str]) -> Optional[AmpConfig]:
    if path is None:
        return None
    try:
        return AmpConfig.from_file(path)
    except (OSError, ValueError, TypeError) as exc:
        raise UsageError(f"--config {path!r}: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
