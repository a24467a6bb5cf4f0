"""The compiled one-pass float16 and bfloat16 rounding kernels of the rehearsal, built on first use."""

from .build import NativeStatus, Rounder, bf16_rounder, fp16_rounder, status

__all__ = ["NativeStatus", "Rounder", "bf16_rounder", "fp16_rounder", "status"]
