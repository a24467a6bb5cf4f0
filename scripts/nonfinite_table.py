"""Measure what Paddle's CPU kernels return for +inf, -inf and NaN inputs, against the CUDA kernels.

For every op the fp16 rehearsal leaves to a Paddle CPU kernel (the default black list, the
"follow the inputs" ops, and their backward), rows of every length in ``--lengths`` are run in
float32 on the CPU with one +inf, one -inf or one NaN among finite values, all +inf or all -inf
(and, for backward, a non-finite upstream gradient). Each result is compared with a numpy
reference of what the CUDA kernel computes, written from reading Paddle's CUDA sources
(``paddle/phi/kernels/gpudnn/softmax_gpudnn.h``, ``gpu/cross_entropy_kernel.cu``,
``funcs/activation_functor.h``, ``gpu/gelu_grad_kernel.cu``, ``primitive/functor_primitives.h``,
``funcs/layer_norm_impl.cu.h``): not from a GPU run. With ``--rehearsal`` the same rows go
through ``paddle_amp_ext.rehearse()``, which should agree with the CUDA column everywhere.

Prints a markdown table (docs/nonfinite.md holds one run). Usage:
    python scripts/nonfinite_table.py [--lengths 1-2048] [--rehearsal]
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from typing import Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

inf, nan = np.float32(np.inf), np.float32(np.nan)
CASES = ("one +inf", "one -inf", "one NaN", "all +inf", "all -inf")
GRAD_CASES = ("dout +inf", "dout NaN")


def row(n: int, case: str) -> np.ndarray:
    """A row of ``n`` finite values in [-1, 1] (first element negative) with ``case`` applied."""
    x = np.linspace(-1.0, 1.0, n, dtype=np.float32) if n > 1 else np.array([-0.5], np.float32)
    if case.startswith("one "):
        x[0] = {"one +inf": inf, "one -inf": -inf, "one NaN": nan}[case]
    elif case == "all +inf":
        x[:] = inf
    elif case == "all -inf":
        x[:] = -inf
    return x


def upstream(n: int, case: Optional[str]) -> np.ndarray:
    g = np.linspace(0.5, 1.5, n, dtype=np.float32)
    if case == "dout +inf":
        g[0] = inf
    elif case == "dout NaN":
        g[0] = nan
    return g


# ----------------------------------------------------------------- CUDA references (numpy)
def _erf(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(x.astype(np.float64)).astype(np.float32)


def _rowmax(x: np.ndarray) -> np.ndarray:
    # WarpSoftmaxForward reduces with CUDA's max() (fmaxf: a NaN operand is dropped); a NaN still
    # reaches the sum through exp(x - max)
    return np.fmax.reduce(x, axis=-1, keepdims=True)


def gpu_softmax(x, g):
    with np.errstate(all="ignore"):
        e = np.exp(x - _rowmax(x))
        y = e / e.sum(-1, keepdims=True)
        return y, y * (g - (g * y).sum(-1, keepdims=True))


def gpu_log_softmax(x, g):
    with np.errstate(all="ignore"):
        m = _rowmax(x)
        y = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
        return y, g - np.exp(y) * g.sum(-1, keepdims=True)


def gpu_cross_entropy(x, g, label=0):
    # VectorizedSoftmaxForward / WarpSoftmaxForward(kCrossEntropy): loss = -(x[l] - max - log sum)
    with np.errstate(all="ignore"):
        m = _rowmax(x)
        logp = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
        loss = -logp[..., label:label + 1]
        onehot = np.zeros_like(x)
        onehot[..., label] = 1
        return loss, (np.exp(logp) - onehot) * g[..., :1]


def gpu_layer_norm(x, g, eps=1e-5):
    with np.errstate(all="ignore"):
        x64 = x.astype(np.float32)
        mean = x64.mean(-1, keepdims=True)
        var = ((x64 - mean) ** 2).mean(-1, keepdims=True)
        rstd = 1 / np.sqrt(var + eps)
        y = (x64 - mean) * rstd
        n = x.shape[-1]
        dx = rstd * (g - g.mean(-1, keepdims=True) - y * (g * y).sum(-1, keepdims=True) / n)
        return y, dx


def _reduce(fn, grad):
    def ref(x, g):
        with np.errstate(all="ignore"):
            y = fn(x)
            return y, grad(x, y, g)
    return ref


def _shared_grad(x, y, g):
    """max_grad/min_grad: the stored copy of Paddle's GPU kernel includes
    ``impl/reduce_max_grad_kernel_impl.h``, the CPU's own code (an older copy multiplied dout by
    ``x == out``), so the backward is not compared."""
    return None


def gpu_logsumexp(x, g):
    with np.errstate(all="ignore"):
        # LogsumexpFallbackKernel (rows over 1024): max, then log(sum(exp(x - max))) + max; the
        # warp kernel for shorter rows (DispatchLogsumexpWarp) was not read
        m = np.max(x, -1, keepdims=True)
        y = np.log(np.exp(x - m).sum(-1, keepdims=True)) + m
        return y, g[..., :1] * np.exp(x - y)


def _unary(fwd, bwd):
    def ref(x, g):
        with np.errstate(all="ignore"):
            y = fwd(x).astype(np.float32)
            return y, bwd(x, y, g).astype(np.float32)
    return ref


_GELU_A = np.float32(math.sqrt(2 / math.pi))


def _gelu(x):  # x * normcdf(x)
    return x * 0.5 * (1 + _erf(x / np.float32(math.sqrt(2))))


def _gelu_grad(x, y, g):  # gelu_grad_kernel.cu: dout * (cdf + x * pdf)
    pdf = np.exp(-0.5 * x * x) * np.float32(1 / math.sqrt(2 * math.pi))
    return g * (0.5 * (1 + _erf(x / np.float32(math.sqrt(2)))) + x * pdf)


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(_GELU_A * (x + 0.044715 * x ** 3)))


def _gelu_tanh_grad(x, y, g):
    cube = x * x * x
    t = np.tanh(_GELU_A * (0.044715 * cube + x))
    return g * 0.5 * (1 + t + (1 - t * t) * (x * _GELU_A + _GELU_A * 0.044715 * 3 * cube))


def _silu_grad(x, y, g):
    t = 1 / (1 + np.exp(-x))
    return g * (t * (1 + x * (1 - t)))


# ----------------------------------------------------------------- Paddle CPU calls
def _ops() -> Dict[str, Tuple[Callable, Callable, str]]:
    """name -> (paddle op on a [1, n] tensor, CUDA reference, kind: 'row' or 'elementwise'); Paddle's
    functions are looked up at call time, so that a rehearsal's wrapped ones are used."""
    import paddle
    import paddle.nn.functional as F  # noqa: N812

    def ce(x):
        label = paddle.zeros([x.shape[0], 1], dtype="int64")
        return F.cross_entropy(x, label, reduction="none")

    def ln(x):
        return F.layer_norm(x, x.shape[-1:])

    def keep(name):  # looked up at call time: a rehearsal wraps Paddle's functions
        return lambda x: getattr(paddle, name)(x, axis=-1, keepdim=True)

    return {
        "softmax": (lambda x: F.softmax(x), gpu_softmax, "row"),
        "log_softmax": (lambda x: F.log_softmax(x), gpu_log_softmax, "row"),
        "cross_entropy (hard label at the non-finite entry)": (ce, gpu_cross_entropy, "row"),
        "layer_norm": (ln, gpu_layer_norm, "row"),
        "sum": (keep("sum"), _reduce(lambda x: x.sum(-1, keepdims=True),
                                          lambda x, y, g: np.broadcast_to(g[..., :1], x.shape)), "row"),
        "mean": (keep("mean"), _reduce(lambda x: x.mean(-1, keepdims=True),
                                            lambda x, y, g: np.broadcast_to(g[..., :1] / x.shape[-1], x.shape)),
                 "row"),
        "max": (keep("max"), _reduce(lambda x: np.max(x, -1, keepdims=True), _shared_grad), "row"),
        "min": (keep("min"), _reduce(lambda x: np.min(x, -1, keepdims=True), _shared_grad), "row"),
        "prod": (keep("prod"), _reduce(lambda x: np.prod(x, -1, keepdims=True),
                                            lambda x, y, g: g[..., :1] * y / x), "row"),
        "logsumexp": (keep("logsumexp"), gpu_logsumexp, "row"),
        "cumsum": (lambda x: paddle.cumsum(x, axis=-1),
                   _reduce(lambda x: np.cumsum(x, -1), lambda x, y, g: np.cumsum(g[..., ::-1], -1)[..., ::-1]),
                   "row"),
        "relu": (lambda x: F.relu(x), _unary(lambda x: np.where(x > 0, x, 0), lambda x, y, g: np.where(y > 0, g, 0)),
                 "elementwise"),
        "gelu": (lambda x: F.gelu(x), _unary(_gelu, _gelu_grad), "elementwise"),
        "gelu (tanh)": (lambda x: F.gelu(x, approximate=True), _unary(_gelu_tanh, _gelu_tanh_grad), "elementwise"),
        "sigmoid": (lambda x: F.sigmoid(x), _unary(lambda x: 1 / (1 + np.exp(-x)), lambda x, y, g: g * y * (1 - y)),
                    "elementwise"),
        "tanh": (lambda x: paddle.tanh(x), _unary(np.tanh, lambda x, y, g: g * (1 - y * y)), "elementwise"),
        "silu": (lambda x: F.silu(x), _unary(lambda x: x / (1 + np.exp(-x)), _silu_grad), "elementwise"),
        "exp": (lambda x: paddle.exp(x), _unary(np.exp, lambda x, y, g: g * y), "elementwise"),
        "log": (lambda x: paddle.log(x), _unary(np.log, lambda x, y, g: g / x), "elementwise"),
        "sqrt": (lambda x: paddle.sqrt(x), _unary(np.sqrt, lambda x, y, g: g * 0.5 / y), "elementwise"),
        "square": (lambda x: paddle.square(x), _unary(np.square, lambda x, y, g: g * 2 * x), "elementwise"),
    }


def cpu_run(op: Callable, x: np.ndarray, g: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    import paddle

    t = paddle.to_tensor(x[None])
    t.stop_gradient = False
    y = op(t)
    gy = paddle.to_tensor(np.ascontiguousarray(np.broadcast_to(g[None][..., :y.shape[-1]], y.shape)))
    (dx,) = paddle.grad(y, t, gy)
    return y.numpy()[0], dx.numpy()[0]


def same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    if a.shape != b.shape or not np.array_equal(np.isnan(a), np.isnan(b)):
        return False
    if not np.array_equal(np.where(np.isinf(a), a, 0), np.where(np.isinf(b), b, 0)):
        return False
    if np.any((b == 0) & (a != 0) & (np.abs(a) < 1e-30)):  # a tiny value where CUDA gives 0
        return False
    fin = np.isfinite(a)
    return bool(np.allclose(a[fin], b[fin], rtol=1e-4, atol=2e-5))  # float32 summation order


def describe(v: np.ndarray) -> str:
    v = np.asarray(v, np.float32).ravel()
    if v.size and np.isnan(v).all():
        return "NaN"
    if v.size > 1 and np.isfinite(v).all() and np.all(v == v[0]):
        return f"uniform {v[0]:.4g}"
    if v.size == 1:
        return f"{v[0]:.4g}"
    tiny = (v != 0) & (np.abs(v) < 1e-30)
    if tiny.any():
        return f"{v[tiny][0]:.3g} (not 0) at {_where(tiny)}"
    parts = []
    for label, mask in (("NaN", np.isnan(v)), ("+inf", v == inf), ("-inf", v == -inf)):
        if mask.any():
            parts.append(f"{label} at {_where(mask)}")
    first = v[0]
    if np.isfinite(first) and not parts:
        return "finite"
    if np.isfinite(first):
        parts.append(f"[0]={first:.4g}")
    return ", ".join(parts) + ("" if np.isnan(v).all() else ", rest finite" if np.isfinite(v).any() else "")


def _where(mask: np.ndarray) -> str:
    idx = np.flatnonzero(mask)
    if idx.size == mask.size:
        return "all"
    return "[0]" if idx.tolist() == [0] else f"{idx.size} of {mask.size}"


def lengths_text(bad: List[int], tested: List[int]) -> str:
    if not bad:
        return ""
    if bad == tested:
        return "every n"
    if bad == [n for n in tested if n >= bad[0]]:
        return f"n >= {bad[0]}"
    eights = [n for n in tested if n % 8 == 0]
    if bad == eights:
        return "n % 8 == 0"
    if bad == [n for n in tested if n % 8]:
        return "n % 8 != 0"
    runs, start = [], bad[0]
    for prev, cur in zip(bad, bad[1:] + [None]):
        if cur != prev + 1:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    text = ", ".join(runs)
    return text if len(text) < 60 else f"{len(bad)} of {len(tested)} lengths, e.g. {', '.join(map(str, bad[:4]))}"


def parse_lengths(text: str) -> List[int]:
    out: List[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return sorted(set(out))


def measure(lengths: List[int], rehearsal: bool) -> Iterable[Tuple[str, str, str, str, str, str]]:
    """(op, case, direction, lengths where CPU != CUDA, CPU there, CUDA there) per difference."""
    import paddle_amp_ext as amp

    for name, (op, ref, _kind) in _ops().items():
        for case in CASES + GRAD_CASES:
            results: Dict[str, List[int]] = {"forward": [], "backward": []}
            example: Dict[str, Tuple[str, str]] = {}
            for n in lengths:
                x = row(n, case) if case in CASES else row(n, "finite")
                g = upstream(n, case if case in GRAD_CASES else None)
                scope = amp.rehearse() if rehearsal else contextlib.nullcontext()
                with scope:
                    got = cpu_run(op, x, g)
                want = ref(x[None], g[None])
                for direction, a, b in (("forward", got[0], want[0]), ("backward", got[1], want[1])):
                    if b is None or (case in GRAD_CASES and direction == "forward"):
                        continue
                    b = b[0]
                    if not same(a, b):
                        results[direction].append(n)
                        example.setdefault(direction, (f"{describe(a)} (n={n})", describe(b)))
            for direction, bad in results.items():
                if bad:
                    yield (name, case, direction, lengths_text(bad, lengths), *example[direction])


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="1-64,96,127,128,129,255,256,257,511,512,513,1000,1023,1024,1025,"
                                             "2047,2048", help="row lengths, e.g. 1-2048 (default: a sample)")
    parser.add_argument("--rehearsal", action="store_true", help="run the ops inside paddle_amp_ext.rehearse()")
    args = parser.parse_args(argv)
    import paddle

    lengths = parse_lengths(args.lengths)
    print(f"Paddle {paddle.__version__}, numpy {np.__version__}, row lengths {args.lengths}"
          + (", inside rehearse()" if args.rehearsal else ""))
    print()
    print("| op | input | direction | lengths where CPU != CUDA | CPU returns | CUDA returns (from the source) |")
    print("|---|---|---|---|---|---|")
    count = 0
    for entry in measure(lengths, args.rehearsal):
        print("| " + " | ".join(entry) + " |")
        count += 1
    print()
    print(f"{count} differences")
    return 0


if __name__ == "__main__":
    sys.exit(main())
