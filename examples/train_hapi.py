"""paddle.Model.fit with amp_configs and the VisualDL callback.

    python examples/train_hapi.py --epochs 2
"""

import argparse

import paddle
from paddle.io import TensorDataset

import paddle_amp_ext as amp

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=2)
parser.add_argument("--samples", type=int, default=512)
parser.add_argument("--logdir", default="runs/hapi")
args = parser.parse_args()

paddle.seed(0)
x = paddle.randn([args.samples, 16])
y = x[:, :4].argmax(axis=1).unsqueeze(1)
net = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 4))
model = paddle.Model(net)
optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=net.parameters())
decision = amp.device.current_decision("auto")
amp_configs = {"level": "O1", "dtype": decision.dtype} if decision.enabled else None
model.prepare(optimizer, paddle.nn.CrossEntropyLoss(), paddle.metric.Accuracy(), amp_configs=amp_configs)
print(f"AMP: {decision.dtype} ({decision.reason})")
model.fit(TensorDataset([x, y]), batch_size=64, epochs=args.epochs, verbose=1,
          callbacks=[amp.VisualDLCallback(args.logdir, flush_every=4)])
print(f"logged to {args.logdir}")
