"""Device-to-host reads per optimizer step: plain, guarded through Paddle's ``found_inf``, guarded with a host read.

Counts the Python-level reads of a tensor's value that a step makes (``Tensor.__bool__``,
``numpy``, ``item``, ``tolist``, ``__float__``, ``__int__``; nested reads count once), with the
methods patched for the count. On a GPU each such read is a device-to-host copy and a stream
sync; on this CPU the same code runs, so the count is the same (the time is not).

Variants, for ``AdamW``, ``Adam(use_multi_tensor=True)`` and ``Momentum``:

- ``plain``: ``optimizer.step()``.
- ``found_inf``: the finiteness flag computed on the device (one fused norm per gradient) and
  handed to the optimizer with ``optimizer._set_auxiliary_var("found_inf", flag)``, as fleet's
  scaler does; the skip is then read back from the auxiliary variable, which Paddle replaces
  by a host bool once it has read it.
- ``guard``: ``paddle_amp_ext.guard_optimizer(optimizer)`` (the flag read on the host).
- ``scaler``: ``GradScaler().step(optimizer)`` with loss scaling off (its non-finite guard), on an
  optimizer a routing guarded as it was built (the guard defers: no second read).

Where the reads come from in dygraph (read in Paddle 2.6.2 and 3.3.1):
``Optimizer._create_optimization_pass`` evaluates ``if found_inf:`` on the auxiliary variable
(one read), and so does the multi-tensor path of ``Adam``/``AdamW``/``Momentum``; the dygraph
``_C_ops.adam_``/``adamw_`` calls pass ``None`` as ``skip_update`` (3.3.1 passes the flag only in
a PIR program); and the CUDA ``adamw`` kernel copies ``SkipUpdate`` to the host
(``TensorToVector``) before deciding. So no optimizer skips on the device without a read.

    python benchmarks/guard_syncs.py [--steps 3]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from typing import Any, Callable, Dict, Iterator

READS = ("__bool__", "numpy", "item", "tolist", "__float__", "__int__")


@contextlib.contextmanager
def counting() -> Iterator[Dict[str, int]]:
    """Count the outermost tensor value reads while inside (patches ``paddle.Tensor``'s methods)."""
    import paddle

    counts = {"reads": 0}
    depth = [0]
    saved = {name: getattr(paddle.Tensor, name) for name in READS if hasattr(paddle.Tensor, name)}

    def wrap(name: str, original: Callable) -> Callable:
        def read(self: Any, *args: Any, **kwargs: Any) -> Any:
            if depth[0] == 0:
                counts["reads"] += 1
            depth[0] += 1
            try:
                return original(self, *args, **kwargs)
            finally:
                depth[0] -= 1

        read.__name__ = name
        return read

    for name, original in saved.items():
        setattr(paddle.Tensor, name, wrap(name, original))
    try:
        yield counts
    finally:
        for name, original in saved.items():
            setattr(paddle.Tensor, name, original)


def _optimizer(kind: str, params: Any) -> Any:
    import paddle

    if kind == "AdamW":
        return paddle.optimizer.AdamW(learning_rate=1e-3, parameters=params)
    if kind == "Adam(multi_tensor)":
        return paddle.optimizer.Adam(learning_rate=1e-3, parameters=params, use_multi_tensor=True)
    return paddle.optimizer.Momentum(learning_rate=1e-3, parameters=params)


def measure(kind: str, variant: str, steps: int) -> Dict[str, Any]:
    import paddle

    import paddle_amp_ext as amp
    from paddle_amp_ext.clip import global_norm
    from paddle_amp_ext.gradients import applied_grads, grads_of

    paddle.seed(0)
    model = paddle.nn.Sequential(paddle.nn.Linear(8, 16), paddle.nn.ReLU(), paddle.nn.Linear(16, 1))
    routing = amp.route() if variant == "scaler" else None
    try:
        opt = _optimizer(kind, model.parameters())
        guard = amp.guard_optimizer(opt) if variant == "guard" else None
        scaler = amp.GradScaler() if variant == "scaler" else None
        x = paddle.randn([4, 8])
        skipped = []
        per_step = []
        for step in range(steps + 1):  # the first step builds the accumulators: not counted
            loss = model(x).mean() * (float("nan") if step == steps else 1.0)  # the last one is non-finite
            loss.backward()
            with counting() as counts:
                if variant == "plain":
                    opt.step()
                elif variant == "found_inf":
                    norm = global_norm(grads_of(applied_grads(opt)))
                    opt._set_auxiliary_var("found_inf", paddle.logical_not(paddle.isfinite(norm)))
                    opt.step()
                    skipped.append(opt._get_auxiliary_var("found_inf") is True)  # a host bool by now
                elif variant == "guard":
                    opt.step()
                    skipped.append(guard.last_step_skipped)
                else:
                    skipped.append(scaler.step(opt).skipped)
                    scaler.update()
            opt.clear_grad()
            if step:
                per_step.append(counts["reads"])
        weights_finite = bool(paddle.isfinite(model[0].weight).all())
    finally:
        if routing is not None:
            routing.undo()
    return {"optimizer": kind, "variant": variant, "reads_per_step": per_step,
            "last_step_skipped": skipped[-1] if skipped else None, "weights_finite": weights_finite}


def main(argv: Any = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="counted steps per variant (the last has a NaN)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    import logging

    import paddle

    logging.getLogger("paddle_amp_ext").setLevel(logging.ERROR)
    rows = [measure(kind, variant, args.steps) for kind in ("AdamW", "Adam(multi_tensor)", "Momentum")
            for variant in ("plain", "found_inf", "guard", "scaler")]
    if args.json:
        print(json.dumps({"paddle": paddle.__version__, "rows": rows}))
        return 0
    print(f"Paddle {paddle.__version__}: tensor reads per step (finite steps..., the NaN step last)")
    print(f"{'optimizer':<20}{'variant':<11}{'reads/step':<16}{'NaN step skipped':<18}weights finite")
    for row in rows:
        print(f"{row['optimizer']:<20}{row['variant']:<11}{str(row['reads_per_step']):<16}"
              f"{str(row['last_step_skipped']):<18}{row['weights_finite']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
