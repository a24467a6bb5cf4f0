"""After AMP training, export with paddle.jit.save: the exported parameters are float32.

    python examples/export_fp32.py --out exported/model
"""

import argparse

import numpy as np
import paddle
from paddle.static import InputSpec

import paddle_amp_ext as amp

parser = argparse.ArgumentParser()
parser.add_argument("--out", default="exported/model")
parser.add_argument("--steps", type=int, default=20)
args = parser.parse_args()

paddle.seed(0)
model = paddle.nn.Sequential(paddle.nn.Linear(16, 32), paddle.nn.ReLU(), paddle.nn.Linear(32, 4))
optimizer = paddle.optimizer.Adam(learning_rate=1e-3, parameters=model.parameters())
scaler = amp.GradScaler(init_loss_scaling=2**12)
with amp.fp16_emulation(model):  # on a GPU, auto_cast does the real thing; the export is the same
    for _ in range(args.steps):
        x = paddle.randn([32, 16])
        with amp.auto_cast(dtype="auto"):
            loss = model(x).pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer, grad_clip=1.0)
        scaler.update()
        optimizer.clear_grad()

model.eval()
static = paddle.jit.to_static(model, input_spec=[InputSpec([None, 16], "float32", name="x")])
paddle.jit.save(static, args.out)
loaded = paddle.jit.load(args.out)
dtypes = sorted({str(p.dtype) for p in loaded.parameters()})
probe = paddle.randn([3, 16])
same = np.allclose(loaded(probe).numpy(), model(probe).numpy(), rtol=1e-5, atol=1e-6)
print(f"exported to {args.out}; parameter dtypes: {dtypes}; matches the trained model: {same}")
if dtypes != ["paddle.float32"] or not same:
    raise SystemExit("export check failed")
