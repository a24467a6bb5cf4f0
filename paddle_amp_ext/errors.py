"""Exceptions raised by paddle-amp-ext."""

from __future__ import annotations


class AmpUnsupportedError(RuntimeError):
    """The requested precision cannot run on this device (raised with ``strict=True``)."""


class AmpOverflowError(FloatingPointError):
    """Gradients stayed inf/nan for too many consecutive steps, whatever the loss scale."""
