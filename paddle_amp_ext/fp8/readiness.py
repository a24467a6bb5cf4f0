"""Whether this GPU, CUDA, cuBLAS and Paddle can run each FP8 recipe, and why not.

Pure: no Paddle import; :func:`probe_software` collects the Paddle facts, the gate's
:class:`~paddle_amp_ext.gate.DeviceInfo` the GPU. Every rule names the code it was read from
(docs/fp8.md keeps the details):

- ``per_tensor``: ``paddle.linalg.fp8_fp8_half_gemm_fused`` (per-tensor scale, fp16/bf16 out;
  a CUTLASS kernel). Paddle's own test of it (``check_fp8_support`` in its fp8 GEMM test) runs it
  on compute capability >= 9.0, or 8.9 with CUDA >= 12.1: "Fp8 matmul requires CUDA >= 12.1 on
  Ada arch or hopper arch".
- ``blockwise``: ``paddle.incubate.nn.functional.fp8_quant_blockwise`` + ``fp8_gemm_blockwise``
  (DeepSeek-V3's 1x128 / 128x128 recipe). ``paddle/phi/kernels/legacy/gpu/fp8_gemm_blockwise_kernel.cu``
  compiles the block-scale modes only ``#if CUBLAS_VERSION >= 120805 && CUDA_VERSION >= 12080``
  ("Sub-channel FP8 GEMM requires CUDA 12.8 and cuBLAS 12.8.5 or later"); cuBLASLt documents its
  VEC128/BLK128x128 scale modes for compute capability 9.0.
- ``ernie_qat``: PaddleFormers' FP8 QAT (``weight_quantize_algo="fp8linear"``,
  ``paddleformers/quantization/qat_utils.py``) over ``fp8_fp8_half_gemm_fused``;
  ``paddleformers/quantization/quantization_config.py`` raises "fp8Linear is only supported on
  NVIDIA Hopper GPUs." for any arch but 89 and 90.
- ``deep_gemm``: PaddleFormers' ``paddleformers/transformers/fp8_utils.py`` (1.2.0) imports
  ``deep_gemm`` from ``paddlefleet_ops`` or ``paddle.incubate.fp8`` and calls
  ``deep_gemm.fp8_gemm_nt`` in every FP8 forward, with no fallback; DeepGEMM's kernels target
  sm_90 (Hopper) and sm_100 (Blackwell).

Paddle 2.6 has no FP8 dtypes (``paddle.float8_e4m3fn`` arrived in Paddle 3.0): every recipe is
refused there, and says so.

Example:
    >>> from paddle_amp_ext.gate import DeviceInfo
    >>> h100 = DeviceInfo(0, "NVIDIA H100", (9, 0))
    >>> sw = Fp8Software("3.3.1", True, frozenset(API_NEEDS["per_tensor"]), cuda="12.8", cublas="12.8.5")
    >>> fp8_readiness(h100, sw)[0].ok
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, FrozenSet, Optional, Tuple

from ..gate import DeviceInfo

RECIPES = ("per_tensor", "blockwise", "ernie_qat", "deep_gemm")

#: The Paddle (or PaddleFormers) entry points each recipe calls.
API_NEEDS: Dict[str, Tuple[str, ...]] = {
    "per_tensor": ("paddle.linalg.fp8_fp8_half_gemm_fused",),
    "blockwise": ("paddle.incubate.nn.functional.fp8_quant_blockwise",
                  "paddle.incubate.nn.functional.fp8_gemm_blockwise"),
    "ernie_qat": ("paddle.linalg.fp8_fp8_half_gemm_fused",),
    "deep_gemm": ("deep_gemm",),
}

SOURCES: Dict[str, str] = {
    "per_tensor": "Paddle's fp8_fp8_half_gemm_fused test (check_fp8_support)",
    "blockwise": "paddle/phi/kernels/legacy/gpu/fp8_gemm_blockwise_kernel.cu",
    "ernie_qat": "paddleformers/quantization/quantization_config.py",
    "deep_gemm": "paddleformers/transformers/fp8_utils.py",
}


@dataclass(frozen=True)
class Fp8Software:
    """What the installed Paddle offers for FP8.

    Attributes:
        paddle_version: ``paddle.__version__``.
        fp8_dtypes: whether ``paddle.float8_e4m3fn`` exists (Paddle 3.x).
        apis: the entry points of :data:`API_NEEDS` that are importable.
        cuda: Paddle's CUDA version (``"12.8"``), None on a CPU build.
        cublas: the cuBLAS version when it can be read (pip's ``nvidia-cublas-cu12``), else None.
        archs: the compute capabilities Paddle was compiled for (``(80, 90)``), empty if unknown.
    """

    paddle_version: str
    fp8_dtypes: bool
    apis: FrozenSet[str] = frozenset()
    cuda: Optional[str] = None
    cublas: Optional[str] = None
    archs: Tuple[int, ...] = field(default=())


@dataclass(frozen=True)
class RecipeVerdict:
    """One recipe's answer.

    Attributes:
        recipe: ``"per_tensor"``, ``"blockwise"``, ``"ernie_qat"`` or ``"deep_gemm"``.
        ok: whether this GPU, CUDA, cuBLAS and Paddle can run it.
        reason: one sentence saying why (or why not).
        source: the file of Paddle or PaddleFormers the rule was read from.
    """

    recipe: str
    ok: bool
    reason: str
    source: str

    def to_dict(self) -> dict:
        return {"recipe": self.recipe, "ok": self.ok, "reason": self.reason, "source": self.source}


def _version(text: Optional[str]) -> Optional[Tuple[int, ...]]:
    if not text or text == "False":
        return None
    parts = []
    for piece in str(text).split(".")[:3]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts) or None


def _at_least(text: Optional[str], need: Tuple[int, ...]) -> Optional[bool]:
    have = _version(text)
    return None if have is None else have >= need


def _hardware(recipe: str, device: DeviceInfo, sw: Fp8Software) -> Optional[str]:
    """Why ``device`` with ``sw``'s CUDA/cuBLAS cannot run ``recipe``; None if it can."""
    cc = device.compute_capability
    arch = cc[0] * 10 + cc[1]
    gpu = f"{device.name} (compute capability {device.cc_text})"
    if recipe in ("per_tensor", "ernie_qat") and cc < (8, 9):
        return f"{gpu} has no FP8 Tensor Cores: fp8_fp8_half_gemm_fused needs sm_89+ (Ada, Hopper)"
    if recipe == "per_tensor" and cc < (9, 0) and _at_least(sw.cuda, (12, 1)) is False:
        return f"on {gpu} fp8_fp8_half_gemm_fused needs CUDA 12.1+, Paddle has CUDA {sw.cuda}"
    if recipe == "ernie_qat" and arch not in (89, 90):
        return f"PaddleFormers' FP8 QAT accepts only arch 89 and 90 (\"fp8Linear is only supported on NVIDIA " \
               f"Hopper GPUs.\"), {gpu} is arch {arch}"
    if recipe == "blockwise":
        if cc[0] != 9:
            return f"cuBLASLt's 1x128/128x128 block-scale modes run on compute capability 9.0 (Hopper); {gpu} is not"
        if _at_least(sw.cuda, (12, 8)) is False:
            return (f"fp8_gemm_blockwise needs CUDA 12.8 and cuBLAS 12.8.5 (compiled out below), "
                    f"Paddle has CUDA {sw.cuda}")
        if _at_least(sw.cublas, (12, 8, 5)) is False:
            return f"fp8_gemm_blockwise needs cuBLAS 12.8.5, found cuBLAS {sw.cublas}"
    if recipe == "deep_gemm" and cc[0] < 9:
        return f"DeepGEMM's kernels are written for sm_90 and sm_100; {gpu} is older"
    if sw.archs and recipe != "deep_gemm" and not any(a >= 89 and a <= arch for a in sw.archs):
        return f"this Paddle was compiled for sm_{', sm_'.join(map(str, sw.archs))}: no FP8 kernels for {gpu}"
    return None


def fp8_readiness(device: Optional[DeviceInfo], software: Fp8Software, *,
              no_device_reason: str = "no CUDA GPU is visible") -> Tuple[RecipeVerdict, ...]:
    """Each recipe of :data:`RECIPES`: can it run on ``device`` with ``software``, and why not.

    Args:
        device: the GPU, or None.
        software: the Paddle facts (:func:`probe_software`, or built by hand for a what-if).
        no_device_reason: why there is no GPU, for the reason sentence.

    Returns:
        One :class:`RecipeVerdict` per recipe, in the order of :data:`RECIPES`.
    """
    out = []
    for recipe in RECIPES:
        why: Optional[str]
        if not software.fp8_dtypes:
            why = (f"Paddle {software.paddle_version} has no FP8 dtypes (paddle.float8_e4m3fn and float8_e5m2 "
                   "arrived in Paddle 3.0); install Paddle 3.x")
        elif device is None:
            why = f"FP8 needs an sm_89+ GPU: {no_device_reason}"
        else:
            missing = [name for name in API_NEEDS[recipe] if name not in software.apis]
            why = _hardware(recipe, device, software)
            if why is None and missing:
                why = f"this install lacks {', '.join(missing)}"
        if why is None:
            cuda = f"CUDA {software.cuda}" if software.cuda else "a CUDA build of this Paddle (this one is a CPU build)"
            reason = f"{device.name} (compute capability {device.cc_text}) with {cuda} can run it"
            if recipe == "blockwise" and software.cublas is None:
                reason += " if cuBLAS is 12.8.5 or later (its version could not be read)"
            out.append(RecipeVerdict(recipe, True, reason + ".", SOURCES[recipe]))
        else:
            out.append(RecipeVerdict(recipe, False, why + ".", SOURCES[recipe]))
    return tuple(out)


def fp8_usable(verdicts: Tuple[RecipeVerdict, ...]) -> bool:
    """Whether any recipe can run (``check --require fp8``)."""
    return any(v.ok for v in verdicts)


def render(verdicts: Tuple[RecipeVerdict, ...]) -> list:
    """The check report's FP8 lines (none when there are no verdicts)."""
    if not verdicts:
        return []
    lines = ["", "FP8 recipes"]
    for v in verdicts:
        lines.append(f"  {v.recipe:<11} {'yes' if v.ok else 'no '}  {v.reason} [{v.source}]")
    return lines


def probe_software() -> Fp8Software:
    """The installed Paddle's FP8 facts; never raises (an unreadable fact is left unknown)."""
    import importlib

    import paddle

    apis = set()
    for recipe_apis in API_NEEDS.values():
        for name in recipe_apis:
            if name == "deep_gemm":
                for module in ("paddlefleet_ops", "paddle.incubate.fp8"):
                    try:
                        if hasattr(importlib.import_module(module), "deep_gemm"):
                            apis.add(name)
                    except Exception:  # noqa: BLE001 - an absent or broken module: not available
                        pass
                continue
            module, _, attr = name.rpartition(".")
            try:
                if hasattr(importlib.import_module(module), attr):
                    apis.add(name)
            except Exception:  # noqa: BLE001
                pass
    cuda = None
    archs: Tuple[int, ...] = ()
    try:
        cuda = paddle.version.cuda()
        cuda = None if cuda in (None, "False") else str(cuda)
        archs = tuple(int(a) for a in (getattr(paddle.version, "cuda_archs", lambda: [])() or ()))
    except Exception:  # noqa: BLE001
        pass
    cublas = None
    try:
        from importlib.metadata import version

        cublas = version("nvidia-cublas-cu12")
    except Exception:  # noqa: BLE001 - not a pip CUDA install
        pass
    return Fp8Software(paddle.__version__, hasattr(paddle, "float8_e4m3fn"), frozenset(apis), cuda, cublas, archs)
