"""paddle.Model.fit (hapi) with AMP: the gate picks the dtype, hapi gets only the keys it accepts,
and inside paddle_amp_ext.routed() the GradScaler hapi builds is this package's.

    python examples/train_hapi.py --epochs 2                      # dtype from the gate (float32 on a CPU)
    python examples/train_hapi.py --dtype float16 --rehearse      # AMP on, rehearsed on a CPU
"""

import argparse
import contextlib

import paddle
from paddle.io import TensorDataset

import paddle_amp_ext as amp

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=512)
parser.add_argument("--logdir", default="runs/hapi")
parser.add_argument("--dtype", default="auto", choices=("auto", "float16", "bfloat16"))
parser.add_argument("--rehearse", action="store_true", help="rehearse the dtype's numerics on any device")
args = parser.parse_args()

paddle.seed(0)
x = paddle.randn([args.samples, 16])
y = x[:, :4].argmax(axis=1).unsqueeze(1)
net = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 4))
model = paddle.Model(net)
optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=net.parameters())

decision = amp.device.current_decision(args.dtype)
dtype = decision.dtype if decision.enabled else (args.dtype if args.rehearse and args.dtype != "auto" else None)
config = amp.AmpConfig(dtype=dtype, init_loss_scaling=2.0**12) if dtype else None
model.prepare(optimizer, paddle.nn.CrossEntropyLoss(), paddle.metric.Accuracy(),
              amp_configs=amp.hapi_amp_configs(config, enabled=config is not None))  # hapi has no dtype key
print(f"AMP: {dtype or 'off'} ({decision.reason})")
callback = amp.VisualDLCallback(args.logdir, flush_every=4)
with contextlib.ExitStack() as stack:
    routing = stack.enter_context(amp.routed(config))  # hapi's paddle.amp.GradScaler(...) is ours here
    if args.rehearse and dtype:
        stack.enter_context(amp.fp16_emulation(net, dtype=dtype))
    model.fit(TensorDataset([x, y]), batch_size=64, epochs=args.epochs, verbose=1, callbacks=[callback])
for scaler in routing.scalers:
    print(f"scaler: {type(scaler).__module__}.{type(scaler).__name__} loss scaling on={scaler.is_enable()} "
          f"steps={scaler.state_dict()['steps']} skipped={scaler.skipped_steps}")
print(f"logged to {callback.logdir}")
