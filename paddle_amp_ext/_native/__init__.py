"""The compiled one-pass float16 rounding kernel of the fp16 rehearsal, built on first use."""

from .build import NativeStatus, fp16_rounder, status

__all__ = ["NativeStatus", "fp16_rounder", "status"]
