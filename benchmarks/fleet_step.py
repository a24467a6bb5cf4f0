"""Collectives per step and step time: this package's guarded, clipped step vs Paddle's own path.

Runs itself under ``paddle.distributed.launch --nproc_per_node 2`` on the CPU (gloo), once per
config: fleet's hybrid configs (``dp``: fleet's data parallel; ``sharding``: sharding stage 1;
``mp``: tensor parallel with the first layer's parameters marked ``is_distributed``) and
auto-parallel (``ap_dp``: replicated parameters, ``Shard(0)`` data; ``ap_mp``: the first Linear
column-sharded, the second row-sharded on 3.x; both with ``dist.shard_optimizer``, no default
process group; ``ap_autodp``, 3.x only: ``dist.enable_auto_dp()``, replicated parameters, each
rank its own dense batch, as PaddleFormers' auto-parallel Trainer runs). Variants, interleaved in one run (both ranks run the same sequence, so
collectives pair up):

- ``paddle``: Paddle's own path: the optimizer built with ``ClipGradByGlobalNorm(1.0)`` (fleet
  turns it into ``HybridParallelClipGrad``), ``optimizer.step()``, no non-finite guard;
- ``ours``: ``GradScaler(enable=False)`` (loss scaling off as on every CPU: the skip_nonfinite
  guard, its flag agreed over the ranks) and ``scaler.step(optimizer, grad_clip=1.0)``;
- ``ours_own_clip``: the same scaler with the optimizer's own fleet clip (norm recorded);
- fleet configs only, collectives counted, not timed (loss scaling on a CPU runs only inside the
  rehearsal, whose cost would swamp the step): ``paddle_scaled``, Paddle's ``GradScaler``
  (switched on by hand) through ``fleet.distributed_scaler`` with the optimizer's clip, and
  ``ours_scaled``, the package's scaler inside ``fp16_emulation`` through
  ``fleet.distributed_scaler`` with ``step(grad_clip=1.0)``;
- ``ap_autodp`` only, counted, not timed: ``paddle_scaled``, Paddle's ``GradScaler`` (switched on
  by hand) through ``dist.shard_scaler``, with the optimizer's clip; ``ours_scaled``, the package's
  scaler inside ``fp16_emulation`` with ``step(grad_clip=1.0)``; ``ours_guard``,
  ``guard_optimizer`` on a plain loop with the optimizer's clip (the bf16 Trainer's path).

Collectives are counted for one step of each variant by wrapping ``paddle.distributed``'s
all_reduce/reduce/broadcast/all_gather (fleet's, and any of ours), plus, for the auto-parallel
configs, the communicating reshards Paddle's SPMD rules run in C++ (``AllReduce``/``AllGather``...
"in Resharding", counted from Paddle's own VLOG lines in a separate launch: the log slows the
step, so it is not timed).

    python benchmarks/fleet_step.py                 # all three configs, prints a table
    python benchmarks/fleet_step.py --configs sharding --repeats 40
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
COLLECTIVES = ("all_reduce", "reduce", "broadcast", "all_gather")
RESHARD_VLOG = "p_to_r_reshard_function=4,s_to_r_reshard_function=4,p_to_s_reshard_function=4,s_to_s_reshard_function=4"
MARK = "@@fleet_step"
#: the reshard steps that communicate (``Split``/``Concat``... are local)
COMMUNICATING = r"Call `(AllReduce|AllGather|ReduceScatter|Broadcast|AllToAll|Send|Recv|SendRecv|Reduce)` in Resharding"


def worker(config: str, out: str, steps: int, repeats: int, width: int) -> None:
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "dist_scripts"))
    import fleet_common as fc  # the protobuf shim Paddle 2.6 needs, the barrier gloo needs
    import paddle
    import paddle.distributed as dist
    from _timing import interleaved
    from paddle.distributed import fleet

    import paddle_amp_ext as amp

    auto = config.startswith("ap_")
    auto_dp = config == "ap_autodp"
    if auto_dp:
        dist.enable_auto_dp()
    if not auto:
        fc.init(**{config: 2})
    rank = dist.get_rank()
    mesh = dist.ProcessMesh([0, 1], dim_names=["x"]) if auto else None
    counts = {"n": 0}
    for name in COLLECTIVES:
        original = getattr(paddle.distributed, name)

        def counted(*args, _original=original, **kwargs):
            counts["n"] += 1
            return _original(*args, **kwargs)

        setattr(paddle.distributed, name, counted)
    if auto_dp:
        paddle.seed(rank)
    x = paddle.randn([64, width])  # under auto-dp: this rank's own dense batch
    if auto and not auto_dp:
        x = dist.shard_tensor(x, mesh, [dist.Shard(0) if config == "ap_dp" else dist.Replicate()])

    def shard_mp(name, layer, mesh):
        if name == "0":
            layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(1)])
            layer.bias = dist.shard_tensor(layer.bias, mesh, [dist.Shard(0)])
        elif name == "2" and hasattr(dist, "shard_scaler"):  # 2.6.2's SPMD refuses the row-sharded weight
            layer.weight = dist.shard_tensor(layer.weight, mesh, [dist.Shard(0)])

    def build(optimizer_clip):
        paddle.seed(0)
        model = paddle.nn.Sequential(paddle.nn.Linear(width, width), paddle.nn.ReLU(), paddle.nn.Linear(width, 1))
        if auto:
            model = dist.shard_layer(model, mesh, shard_mp if config == "ap_mp" else None)
            opt = paddle.optimizer.SGD(learning_rate=1e-4, parameters=model.parameters(), grad_clip=optimizer_clip)
            return model, dist.shard_optimizer(opt)
        if config == "mp":
            for p in model[0].parameters():
                p.is_distributed = True
        opt = paddle.optimizer.SGD(learning_rate=1e-4, parameters=model.parameters(), grad_clip=optimizer_clip)
        wrapped = model if config == "mp" else fleet.distributed_model(model)
        return wrapped, fleet.distributed_optimizer(opt)

    def paddle_step():
        model, opt = build(paddle.nn.ClipGradByGlobalNorm(1.0))

        def step():
            model(x).pow(2).mean().backward()
            opt.step()
            opt.clear_grad()
        return step

    def ours_step(own_clip: bool):
        model, opt = build(paddle.nn.ClipGradByGlobalNorm(1.0) if own_clip else None)
        scaler = amp.GradScaler(enable=False)

        def step():
            scaler.scale(model(x).pow(2).mean()).backward()
            scaler.step(opt, grad_clip=None if own_clip else 1.0)
            scaler.update()
            opt.clear_grad()
        return step

    def paddle_scaler_on():
        """Paddle's GradScaler, switched on by hand (it is off on a CPU)."""
        from paddle_amp_ext import _compat

        scaler = paddle.amp.GradScaler(init_loss_scaling=1024.0)
        _compat.init_scaler_state(scaler, 1024.0)
        scaler._enable = True
        scaler._incr_ratio, scaler._decr_ratio = 2.0, 0.5
        scaler._incr_every_n_steps, scaler._decr_every_n_nan_or_inf = 2000, 1
        return scaler

    def paddle_scaled_step(wrap):
        """Paddle's loss-scaled path: its GradScaler through ``wrap`` (fleet.distributed_scaler,
        dist.shard_scaler), step() and update() (switched on by hand: Paddle's scaler is off on a CPU)."""
        model, opt = build(paddle.nn.ClipGradByGlobalNorm(1.0))
        scaler = wrap(paddle_scaler_on())

        def step():
            (model(x).pow(2).mean() * 1024.0).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
        return step

    def ours_scaled_step(wrap):
        """The package's scaler with loss scaling on (inside fp16_emulation, as on a CPU it must
        be) through ``wrap`` (fleet.distributed_scaler, or none), step(grad_clip=1.0)."""
        model, opt = build(None)
        scaler = wrap(amp.GradScaler(init_loss_scaling=1024.0))

        def step():
            with amp.fp16_emulation(model, custom_black_list=["matmul"]):
                scaler.scale(model(x).pow(2).mean()).backward()
                scaler.step(opt, grad_clip=1.0)
                scaler.update()
            opt.clear_grad()
        return step

    def guard_step():
        model, opt = build(paddle.nn.ClipGradByGlobalNorm(1.0))
        amp.guard_optimizer(opt)

        def step():
            model(x).pow(2).mean().backward()
            opt.step()
            opt.clear_grad()
        return step

    variants = {"paddle": paddle_step(), "ours": ours_step(False), "ours_own_clip": ours_step(True)}
    if auto_dp:
        counted_only = {"paddle_scaled": paddle_scaled_step(dist.shard_scaler),
                        "ours_scaled": ours_scaled_step(lambda scaler: scaler), "ours_guard": guard_step()}
    else:
        counted_only = {} if auto else {"paddle_scaled": paddle_scaled_step(fleet.distributed_scaler),
                                        "ours_scaled": ours_scaled_step(fleet.distributed_scaler)}
    per_step = {}
    for name, fn in {**variants, **counted_only}.items():
        fn()  # warm
        before = counts["n"]
        print(f"{MARK} begin {name}", file=sys.stderr, flush=True)
        fn()
        print(f"{MARK} end {name}", file=sys.stderr, flush=True)
        per_step[name] = counts["n"] - before
    samples: dict = {}
    if repeats:
        interleaved(variants, steps=steps, repeats=repeats, warmup=5, samples=samples)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"collectives": per_step, "samples": samples}, f)
    if auto:  # 3.3.1's eager auto-parallel teardown at exit once aborted ("corrupted size vs. prev_size")
        sys.stdout.flush()  # and then hung in Paddle's signal handler: leave without it
        sys.stderr.flush()
        os._exit(0)


def _launch(config: str, steps: int, repeats: int, width: int, vlog: bool = False) -> tuple:
    """(the worker's result, rank 0's log)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        env = {k: v for k, v in os.environ.items() if k != "CUDA_VISIBLE_DEVICES"}
        env["PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"] = "python"
        env["PYTHONPATH"] = os.pathsep.join([HERE, os.path.join(HERE, ".."), env.get("PYTHONPATH", "")])
        if vlog:
            env["GLOG_vmodule"] = RESHARD_VLOG
        cmd = [sys.executable, "-m", "paddle.distributed.launch", "--nproc_per_node", "2", "--log_dir",
               os.path.join(tmp, "log"), os.path.abspath(__file__), "--worker", config, out, str(steps),
               str(repeats), str(width)]
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)  # one process group: a hang kills the workers too
        try:
            code = proc.wait(timeout=600)
        except subprocess.TimeoutExpired:
            sys.path.insert(0, os.path.join(HERE, "..", "tests"))
            from distributed import kill_tree  # the launcher's group and its workers' own sessions

            kill_tree(proc.pid)
            proc.wait()
            raise
        # 3.3.1, ap_autodp with Paddle's reshard VLOG on: the launcher dies by SIGABRT after the
        # workers wrote their result and left (os._exit); the log it was run for is complete
        if code != 0 and not (vlog and config == "ap_autodp" and os.path.exists(out)):
            raise subprocess.CalledProcessError(code, cmd)
        with open(out) as f, open(os.path.join(tmp, "log", "workerlog.0"), errors="replace") as log:
            return json.load(f), log.read()


def reshard_collectives(log: str) -> dict:
    """Per variant, the communicating reshards (``Call `AllReduce` in Resharding``...) between its markers."""
    counts: dict = {}
    name = None
    for line in log.splitlines():
        if line.startswith(MARK):
            _, edge, variant = line.split()
            name = variant if edge == "begin" else None
            counts.setdefault(variant, 0)
        elif name is not None and re.search(COMMUNICATING, line):
            counts[name] += 1
    return counts


def run(config: str, steps: int, repeats: int, width: int) -> dict:
    result, _ = _launch(config, steps, repeats, width)
    if config.startswith("ap_"):  # Paddle's reshards, from its own log, in a launch of its own
        _, log = _launch(config, 1, 0, width, vlog=True)
        for name, n in reshard_collectives(log).items():
            result["collectives"][name] += n
    return result


def _has_auto_dp() -> bool:
    import paddle.distributed as dist

    return hasattr(dist, "enable_auto_dp")


def quartiles(values: list) -> tuple:
    q = statistics.quantiles(values, n=4)
    return q[0], q[2]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--configs", nargs="+", default=["dp", "sharding", "mp", "ap_dp", "ap_mp", "ap_autodp"])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--worker", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        config, out, steps, repeats, width = args.worker
        worker(config, out, int(steps), int(repeats), int(width))
        return 0
    print(f"fleet step, 2 processes (gloo, CPU), MLP {args.width}x{args.width}, batch 64, "
          f"{args.repeats} interleaved repeats of {args.steps} steps")
    print("config    collectives/step (paddle, ours, ours_own_clip; loss-scaled: paddle, ours)   ms/step paddle   "
          "ours/paddle median [IQR]   ours_own_clip/paddle median [IQR]")
    for config in args.configs:
        if config == "ap_autodp" and not _has_auto_dp():
            print(f"{config:<9} skipped: this Paddle has no dist.enable_auto_dp (2.6.2)")
            continue
        result = run(config, args.steps, args.repeats, args.width)
        s, c = result["samples"], result["collectives"]
        ratios = {k: [a / b for a, b in zip(s[k], s["paddle"])] for k in ("ours", "ours_own_clip")}
        cells = []
        for k in ("ours", "ours_own_clip"):
            lo, hi = quartiles(ratios[k])
            cells.append(f"{statistics.median(ratios[k]):.3f} [{lo:.3f}, {hi:.3f}]")
        scaled = f"; {c['paddle_scaled']}, {c['ours_scaled']}" if "paddle_scaled" in c else ""
        scaled += f"; guard {c['ours_guard']}" if "ours_guard" in c else ""
        print(f"{config:<9} {c['paddle']}, {c['ours']}, {c['ours_own_clip']}{scaled:<52} "
              f"{1e3 * statistics.median(s['paddle']):>8.2f}       {cells[0]:<26} {cells[1]}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
