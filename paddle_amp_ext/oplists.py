"""Validated custom white/black op lists.

Paddle accepts any string in ``custom_white_list`` and ignores names that are not op types, and
eager AMP looks ops up by their legacy names (``paddle.matmul`` is ``matmul_v2``, ``+`` is
``elementwise_add``). Here every name is checked against the ops the installed Paddle defines for
any backend (a CPU wheel registers no GPU-only op such as ``sync_batch_norm``, yet configs written
for GPUs list them), API names are mapped through :data:`ALIASES`, names that change nothing are
reported, and so are names with no kernel in this build.

Example:
    >>> lists = resolve(["matmul"], ["softmx"])  # doctest: +SKIP
    ValueError: Unknown op 'softmx' in custom_black_list. Did you mean 'softmax'?
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from dataclasses import dataclass
from typing import Callable, Collection, FrozenSet, Iterable, Mapping, Tuple

#: API names users write -> the op types eager AMP looks up (Paddle 2.6 and 3.x). The name itself
#: is always listed too, since some versions record it (Paddle 3.x records ``reshape``, 2.6
#: ``reshape2``). The test suite runs each API under ``paddle.amp.debugging`` operator statistics
#: and checks that the recorded op type is among the names handed to Paddle.
ALIASES: Mapping[str, Tuple[str, ...]] = {
    "matmul": ("matmul_v2",),
    "mm": ("matmul_v2",),
    "linear": ("matmul_v2",),
    "add": ("elementwise_add",),
    "subtract": ("elementwise_sub",),
    "multiply": ("elementwise_mul",),
    "divide": ("elementwise_div",),
    "maximum": ("elementwise_max",),
    "minimum": ("elementwise_min",),
    "remainder": ("elementwise_mod",),
    "floor_divide": ("elementwise_floordiv",),
    "sum": ("reduce_sum",),
    "mean": ("reduce_mean",),
    "max": ("reduce_max",),
    "min": ("reduce_min",),
    "prod": ("reduce_prod",),
    "cross_entropy": ("softmax_with_cross_entropy",),
    "cross_entropy_with_softmax": ("softmax_with_cross_entropy",),
    "binary_cross_entropy_with_logits": ("sigmoid_cross_entropy_with_logits",),
    "embedding": ("lookup_table_v2",),
    "transpose": ("transpose2",),
    "reshape": ("reshape2",),
    "flatten": ("flatten_contiguous_range",),
}

#: A callable returning a collection of op type names.
Registry = Callable[[], Collection[str]]


def _default_registry() -> Collection[str]:
    """Every op the installed Paddle defines, for any backend (what a list may name)."""
    from ._compat import ops_paddle_defines

    return ops_paddle_defines()


def _build_registry() -> Collection[str]:
    """The ops this build of Paddle registers (what can run here)."""
    from ._compat import ops_this_build_registers

    return ops_this_build_registers()


def _op_of_api(name: str) -> str | None:
    """The op a fused API named ``name`` runs (``fused_layer_norm``), or None."""
    from ._compat import op_of_api

    return op_of_api(name)


#: A backward (gradient) op: ``softmax_grad``, ``conv2d_grad_grad``, ``tanh_triple_grad``,
#: ``cross_entropy_grad2``, ``embedding_sparse_grad``.
_LONGEST = 256  # characters; Paddle's longest op name has under 80
_BACKWARD = re.compile(r"^(?P<forward>.+?)(?:_double|_triple)?_grad(?:_grad)*(?P<variant>2|_sr|_dense|_strided)?$")


def forward_op_of(name: str, known: Collection[str]) -> str | None:
    """The forward op a backward op ``name`` belongs to, among ``known`` (or ALIASES); None for a
    name that is no backward op, or whose forward op is not known.

    ``embedding_sparse_grad`` belongs to ``embedding``: the longest known prefix is taken. A name
    longer than any op's (:data:`_LONGEST`) is none (the match would cost its length squared).
    """
    match = _BACKWARD.match(name) if len(name) <= _LONGEST else None
    if match is None:
        return None
    stem = match["forward"]
    candidates = [stem + "2"] if match["variant"] == "2" else []
    parts = stem.split("_")
    candidates += ["_".join(parts[:end]) for end in range(len(parts), 0, -1)]
    return next((c for c in candidates if c in known or c in ALIASES), None)


def shown(name: str) -> str:
    """``name`` quoted, non-ASCII characters escaped and named (a Cyrillic 'о' looks like 'o')."""
    if name.isascii():
        return repr(name)
    odd = ", ".join(f"{ascii(ch)[1:-1]} {unicodedata.name(ch, 'unnamed character')} at {i}"
                    for i, ch in enumerate(name) if not ch.isascii())
    return f"{ascii(name)} (non-ASCII: {odd})"


@dataclass(frozen=True)
class ResolvedLists:
    """Custom lists after validation and alias mapping.

    Attributes:
        white, black: what is passed to Paddle (the names as written plus their alias targets).
        mapped: one sentence per API name that was mapped to the op type eager AMP sees.
        no_effect: one sentence per name that changes nothing for this dtype/level.
        elsewhere: one sentence per op Paddle defines that this build registers no kernel for
            (GPU-only, XPU-only or fused ops on a CPU wheel); they are handed to Paddle as well.
    """

    white: FrozenSet[str]
    black: FrozenSet[str]
    mapped: Tuple[str, ...] = ()
    no_effect: Tuple[str, ...] = ()
    elsewhere: Tuple[str, ...] = ()


def expand(names: Iterable[str]) -> list[str]:
    """Each name followed by its alias targets, without duplicates, in order."""
    out: list[str] = []
    for name in names:
        for item in (name, *ALIASES.get(name, ())):
            if item not in out:
                out.append(item)
    return out


def suggest(name: str, registry: Collection[str]) -> list[str]:
    """Up to three real names closest to ``name``."""
    pool = set(registry) | set(ALIASES)
    return difflib.get_close_matches(name, sorted(pool), n=3, cutoff=0.6)


def validate(
    white: Iterable[str], black: Iterable[str], registry: Registry = _default_registry
) -> None:
    """Raise ValueError for an unknown name or a name in both lists (after alias mapping).

    Args:
        white, black: custom lists as the user wrote them.
        registry: every valid name; by default every op the installed Paddle defines for any
            backend, so a GPU-only op is valid on a CPU.

    Raises:
        ValueError: a name Paddle does not define (with up to three close names, or the op of a
            fused API's name), a backward op (naming its forward op), or a name in both lists.
    """
    white, black = list(white), list(black)
    if not white and not black:
        return
    known = registry()
    for list_name, names in (("custom_white_list", white), ("custom_black_list", black)):
        for name in names:
            forward = forward_op_of(name, known)
            if forward is not None:
                raise ValueError(
                    f"{shown(name)} in {list_name} is a backward (gradient) op: op lists act in the forward "
                    f"pass only, and an op's backward runs in the dtype its forward chose. List the forward "
                    f"op {forward!r} instead.")
            if name in ALIASES or name in known:
                continue
            op = _op_of_api(name)
            if op is not None:
                raise ValueError(f"Unknown op {shown(name)} in {list_name}: it is the API "
                                 f"paddle.incubate.nn.functional.{name}, not an op type. The op it runs is "
                                 f"{op!r}: list that.")
            hints = suggest(name, known)
            if hints:
                hint = " Did you mean " + " or ".join(repr(h) for h in hints) + "?"
            else:
                hint = " Run `python -m paddle_amp_ext.check --list-ops` to see valid op names."
            raise ValueError(f"Unknown op {shown(name)} in {list_name}.{hint}")
    both = sorted(set(expand(white)) & set(expand(black)))
    if both:
        raise ValueError(
            f"Ops in both custom_white_list and custom_black_list: {both}. "
            "An op can be forced to low precision or to float32, not both: remove it from one list."
        )


def resolve(
    white: Iterable[str] | None,
    black: Iterable[str] | None,
    dtype: str = "float16",
    level: str = "O1",
    registry: Registry = _default_registry,
    defaults: Callable[[str, str], Tuple[FrozenSet[str], FrozenSet[str]]] | None = None,
    built: Registry = _build_registry,
) -> ResolvedLists:
    """Validate and map custom lists for ``dtype``/``level``; explain names that do nothing.

    Args:
        white, black: custom lists as the user wrote them.
        dtype: ``"float16"`` or ``"bfloat16"``.
        level: ``"O1"``, ``"O2"`` or ``"OD"``.
        registry: every valid name (see :func:`validate`).
        defaults: Paddle's (white, black) lists for a dtype and level.
        built: the names this build registers; a valid name outside it gets an ``elsewhere`` note.

    Returns:
        ResolvedLists with the names to hand to Paddle and sentences for the log.

    Raises:
        ValueError: unknown op (with suggestions) or an op in both lists.
    """
    white = list(white or ())
    black = list(black or ())
    if not white and not black:  # nothing to check or explain (every auto_cast without lists)
        return ResolvedLists(frozenset(), frozenset(), (), ())
    validate(white, black, registry)
    if defaults is None:
        from ._compat import default_op_lists

        defaults = default_op_lists
    default_white, default_black = defaults(dtype, level if level in ("O1", "O2") else "O1")
    mapped = [
        f"{name!r} is looked up by eager AMP as "
        + ", ".join(repr(t) for t in ALIASES[name])
        + "; both are listed."
        for name in white + black
        if name in ALIASES
    ]
    notes: list[str] = []
    for name in white:
        targets = set(expand([name]))
        if level == "O2":
            notes.append(
                f"custom_white_list entry {name!r} has no effect at level O2, where every op "
                "but the black list already runs in low precision."
            )
        elif targets & default_white and not targets & default_black:
            notes.append(
                f"custom_white_list entry {name!r} has no effect: it is already in Paddle's "
                f"default {dtype} white list."
            )
    for name in black:
        targets = set(expand([name]))
        if targets & default_black and not targets & default_white:
            notes.append(
                f"custom_black_list entry {name!r} has no effect: it is already in Paddle's "
                f"default {dtype} {level} black list."
            )
    here = built()
    elsewhere = [
        f"{list_name} entry {name!r} is a Paddle op with no kernel in this build (Paddle defines it "
        "for other backends: GPU-only, XPU-only or fused); it is kept and takes effect where the op runs."
        for list_name, names in (("custom_white_list", white), ("custom_black_list", black))
        for name in names
        if name not in ALIASES and name not in here
    ]
    return ResolvedLists(
        frozenset(expand(white)), frozenset(expand(black)), tuple(mapped), tuple(notes), tuple(elsewhere)
    )
