"""Paddle's own op-level overflow checker around a doctor pass, its log read back as findings.

Paddle's tensor checker (``paddle.amp.debugging``, ``DebugMode.CHECK_ALL_FOR_OVERFLOW``) checks
the output of every op, forward and backward, including ops reached only from C++ and the weight
gradients no layer hook sees, and writes a line per output beyond float16's range (format
checked on Paddle 2.6.2 and 3.3.1)::

    [PRECISION] in [device=cpu, op=matmul_grad, tensor=, dtype=fp32], numel=16, num_zero=0,
    max=7.500000e+04, min=7.500000e+04, mean=7.500000e+04

The doctor runs it around its own watched pass and adds the ops AMP would run in float16 that
its own watch did not already name. Enabling the checker has side effects this module undoes:
it reseeds Paddle's, numpy's and Python's random generators, sets ``FLAGS_cpu_deterministic``
(and ``FLAGS_cudnn_deterministic``) and prints; the states and flags are restored and the prints
dropped. A checker the user enabled (``FLAGS_check_nan_inf`` already on) is left alone, and
this one is then not used.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import random
import re
import tempfile
from typing import Collection, Dict, Iterable, Iterator, List, Set, Tuple

import numpy as np
import paddle

from ..oplists import ALIASES

_FLAGS = ("FLAGS_check_nan_inf", "FLAGS_check_nan_inf_level", "FLAGS_cpu_deterministic",
          "FLAGS_cudnn_deterministic")
_LINE = re.compile(r"\[PRECISION\].*?\bop=(?P<op>[\w.]+)[^\]]*\](?P<rest>.*)")
_FIELD = re.compile(r"\b(num_nan|num_inf|max|min)=([^,\s]+)")


def _flags() -> Dict[str, object]:
    """The flags the checker sets, as they are now. A flag Paddle does not let Python read (3.3.1:
    ``FLAGS_cpu_deterministic``) is taken from its environment variable, else its default, off."""
    values: Dict[str, object] = {}
    for name in _FLAGS:
        try:
            values.update(paddle.get_flags([name]))
        except ValueError:
            values[name] = os.environ.get(name, "").lower() in ("1", "true")
    return values


def _restore(flags: Dict[str, object]) -> None:
    for name, value in flags.items():
        try:
            paddle.set_flags({name: value})
        except ValueError:  # a flag this build does not have (cudnn on a CPU build)
            pass


def parse(lines: Iterable[str]) -> List[Tuple[str, float]]:
    """(op type, largest |value|) per checker line; inf where the op wrote inf or nan."""
    found = []
    for line in lines:
        match = _LINE.search(line)
        if match is None:
            continue
        fields = dict(_FIELD.findall(match.group("rest")))
        try:
            peak = max(abs(float(fields.get("max", "nan"))), abs(float(fields.get("min", "nan"))))
        except ValueError:
            continue
        if any(fields.get(key, "0") not in ("0", "") for key in ("num_nan", "num_inf")) or math.isnan(peak):
            peak = math.inf
        found.append((match.group("op"), peak))
    return found


def _read(directory: str) -> List[Tuple[str, float]]:
    found = []
    for root, _, files in os.walk(directory):
        for name in sorted(files):
            with open(os.path.join(root, name), encoding="utf-8", errors="replace") as f:
                found.extend(parse(f))
    return found


@contextlib.contextmanager
def paddle_checker() -> Iterator[List[Tuple[str, float]]]:
    """Check every op of the block for values beyond float16's range with Paddle's checker.

    Yields a list, filled when the block ends with (op type, largest |value|) per op output
    beyond 65504 (``matmul_grad`` for a weight gradient). Empty when the user's own checker is
    on. Paddle's checker is process-wide: do not run two at once.
    """
    from paddle.amp.debugging import DebugMode, TensorCheckerConfig, disable_tensor_checker, enable_tensor_checker

    found: List[Tuple[str, float]] = []
    flags = _flags()
    if flags.get("FLAGS_check_nan_inf"):
        yield found
        return
    states = (paddle.get_rng_state(), np.random.get_state(), random.getstate())
    with tempfile.TemporaryDirectory(prefix="paddle_amp_ext_checker_") as directory:
        with contextlib.redirect_stdout(io.StringIO()):
            enable_tensor_checker(TensorCheckerConfig(
                enable=True, debug_mode=DebugMode.CHECK_ALL_FOR_OVERFLOW, output_dir=directory))
        try:
            yield found
        finally:
            disable_tensor_checker()
            _restore(flags)
            paddle.set_rng_state(states[0])
            np.random.set_state(states[1])
            random.setstate(states[2])
            found.extend(_read(directory))


def _canonical(op: str) -> str:
    return ALIASES.get(op, (op,))[0]  # the checker says matmul, eager AMP's lists matmul_v2


def unnamed(checked: List[Tuple[str, float]], white: Collection[str], named: Set[Tuple[str, str]],
            limit: float) -> List[Tuple[str, str, str, float]]:
    """(op, base op, direction, largest |value|) for each op the checker found beyond ``limit``
    that AMP runs in low precision (a ``white`` op, or its ``_grad``) and that is not among the
    (op, direction) pairs already ``named``; one entry per base op and direction."""
    low = {_canonical(op) for op in white}
    seen = {(_canonical(op), direction) for op, direction in named}
    out = []
    for op, peak in checked:
        base, direction = (op[:-5], "backward") if op.endswith("_grad") else (op, "forward")
        key = (_canonical(base), direction)
        if key[0] in low and key not in seen and peak > limit:
            seen.add(key)
            out.append((op, base, direction, peak))
    return out
