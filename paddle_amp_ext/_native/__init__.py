"""The compiled one-pass float16 and bfloat16 rounding kernels of the rehearsal (and a finiteness
scan, and the FP8 rounding of the FP8 rehearsal), built on first use."""

from .build import (
    Fp8Kernel,
    NativeStatus,
    Rounder,
    Scanner,
    bf16_rounder,
    finite_scanner,
    fp8_kernel,
    fp16_rounder,
    status,
    vector_bits,
)

__all__ = ["Fp8Kernel", "NativeStatus", "Rounder", "Scanner", "bf16_rounder", "finite_scanner", "fp8_kernel",
           "fp16_rounder", "status", "vector_bits"]
