"""The demo: an fp16 rehearsal on any machine, with the loss scaler doing its job in plain sight.

The loss is multiplied by 1e-6, so small that fp16 flushes most gradients to zero without loss
scaling. Under ``fp16_emulation`` the real Paddle scaler machinery runs (on a CPU too): the scale
grows every few steps until the scaled gradients overflow fp16, then the step is skipped and the
scale backs off. Everything is logged to VisualDL and plotted.

    python examples/demo.py --steps 300 --logdir runs/demo --plot runs/demo/loss_scale.png
"""

import argparse
import glob
import logging
import os

import numpy as np
import paddle
from tqdm import tqdm

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards import backends

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--logdir", default="runs/demo")
parser.add_argument("--plot", default=None, help="PNG of the loss scale read back from the VisualDL logs")
parser.add_argument("--run-name", default=None, help="the run's directory under --logdir (default: a timestamped one)")
parser.add_argument("--report-to", default="visualdl", help="dashboards, comma-separated: visualdl, tensorboard, ...")
args = parser.parse_args()
LOSS_FACTOR = 1e-6


def make_model():
    paddle.seed(0)
    return paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 32),
                                paddle.nn.ReLU(), paddle.nn.Linear(32, 1))


def batch(step):
    rng = np.random.default_rng(step)
    x = rng.standard_normal((64, 16)).astype("float32")
    y = (np.sin(x[:, :1] * 2) + x[:, 1:2] * 0.5).astype("float32")
    return paddle.to_tensor(x), paddle.to_tensor(y)


def underflow(model, scale):
    """Fraction of gradient elements non-zero in float32 that fp16 storage zeroes at `scale`."""
    x, y = batch(0)

    def grads(emulate):
        if emulate:
            with amp.fp16_emulation(model):
                (paddle.nn.functional.mse_loss(model(x), y) * LOSS_FACTOR * scale).backward()
        else:
            (paddle.nn.functional.mse_loss(model(x), y) * LOSS_FACTOR).backward()
        out = np.concatenate([p.grad.numpy().ravel() for p in model.parameters()])
        model.clear_gradients()
        return out

    live = grads(False) != 0
    return float(((grads(True) == 0) & live).sum() / live.sum())


decision = amp.device.current_decision("auto")
print(f"Gate: {decision.dtype} - {decision.reason}")
logging.getLogger("paddle_amp_ext").setLevel(logging.WARNING)  # overflows are in the plot and VisualDL
print("Training under fp16 emulation (real GradScaler machinery, fp16 rounding of activations and grads)")

model = make_model()
optimizer = paddle.optimizer.Adam(learning_rate=3e-3, parameters=model.parameters())
report_to = list(dict.fromkeys(["visualdl", *args.report_to.split(",")]))  # --plot reads the VisualDL records
hook = amp.VisualDLHook(args.logdir, flush_every=25, run_name=args.run_name, report_to=report_to)
scales, losses = [], []
with hook, amp.fp16_emulation(model):
    scaler = amp.GradScaler(init_loss_scaling=2.0**30, incr_every_n_steps=10, max_loss_scaling=2.0**48,
                            hooks=[hook])
    for step in tqdm(range(args.steps), desc="demo", mininterval=0.5):
        x, y = batch(step)
        with amp.auto_cast(dtype="auto"):
            loss = paddle.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss * LOSS_FACTOR).backward()
        result = scaler.step(optimizer, grad_clip=1e-4)
        scaler.update()
        optimizer.clear_grad()
        scales.append(result.loss_scale)
        if step % 25 == 0 or step == args.steps - 1:
            losses.append(loss.item())

without, with_scale = underflow(make_model(), 1.0), underflow(make_model(), scaler.loss_scale)
print("\nSummary")
print(f"  steps               {args.steps}")
print(f"  skipped steps       {scaler.skipped_steps} (gradients overflowed fp16; the scale backed off)")
print(f"  loss scale          start 2^30, range 2^{np.log2(min(scales)):.0f}..2^{np.log2(max(scales)):.0f}, "
      f"final 2^{np.log2(scaler.loss_scale):.0f}")
print(f"  loss (unscaled)     {losses[0]:.4f} -> {losses[-1]:.4f}")
print(f"  zero gradients      {without:.1%} without loss scaling, {with_scale:.1%} at the final scale")
print(f"  VisualDL logs       {hook.logdir}")

if args.plot:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from visualdl import LogReader

    reader = LogReader(file_path=sorted(glob.glob(os.path.join(hook.logdir, "vdlrecords.*")))[-1])
    series = {tag: reader.get_data("scalar", tag) for tag in ("amp/log2_loss_scale", "amp/skipped_steps", "amp/loss")}
    steps = [d.id for d in series["amp/log2_loss_scale"]]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    top.semilogy(steps, [2.0 ** d.value for d in series["amp/log2_loss_scale"]], base=2, label="loss scale")
    counts = [d.value for d in series["amp/skipped_steps"]]
    skipped = [d.id for d, before in zip(series["amp/skipped_steps"], [0.0] + counts) if d.value > before]
    top.scatter(skipped, [scales[s] for s in skipped], color="red", zorder=3, s=14, label="skipped (overflow)")
    top.set_ylabel("loss scale")
    top.legend(loc="lower right")
    top.set_title("Dynamic loss scaling under fp16 emulation (read back from VisualDL)")
    bottom.plot([d.id for d in series["amp/loss"]], [d.value / LOSS_FACTOR for d in series["amp/loss"]])
    bottom.set_ylabel("loss")
    bottom.set_xlabel("step")
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(args.plot)), exist_ok=True)
    fig.savefig(args.plot, dpi=100)
    print(f"  plot                {args.plot}")
print("\nSee it:")
for name in report_to:
    print(f"  {name:<18}  {backends.view_command(name, args.logdir, hook.logdir)}")
print("  (VisualDL: then open http://127.0.0.1:8040)")
