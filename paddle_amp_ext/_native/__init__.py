"""The compiled one-pass float16 and bfloat16 rounding kernels of the rehearsal (and a finiteness
scan), built on first use."""

from .build import NativeStatus, Rounder, Scanner, bf16_rounder, finite_scanner, fp16_rounder, status, vector_bits

__all__ = ["NativeStatus", "Rounder", "Scanner", "bf16_rounder", "finite_scanner", "fp16_rounder", "status",
           "vector_bits"]
