"""fp32 vs AMP throughput and peak memory for a ResNet-50-like and a BERT-like model (CUDA GPU).

    python benchmarks/amp_speedup.py        # on a CPU: says it needs a CUDA GPU and exits 0
"""

from __future__ import annotations

import argparse
import sys
import time

import paddle

import paddle_amp_ext as amp


def resnet50_like():
    model = paddle.vision.models.resnet50(pretrained=False, num_classes=1000)
    return model, lambda b: (paddle.randn([b, 3, 224, 224]), paddle.randint(0, 1000, [b, 1]))


def bert_like(layers: int = 12, width: int = 768, seq: int = 128):
    class Bert(paddle.nn.Layer):
        def __init__(self):
            super().__init__()
            self.embed = paddle.nn.Embedding(30522, width)
            layer = paddle.nn.TransformerEncoderLayer(width, 12, 4 * width, dropout=0.1)
            self.encoder = paddle.nn.TransformerEncoder(layer, layers)
            self.head = paddle.nn.Linear(width, 2)

        def forward(self, ids):
            return self.head(self.encoder(self.embed(ids))[:, 0])

    return Bert(), lambda b: (paddle.randint(0, 30522, [b, seq]), paddle.randint(0, 2, [b, 1]))


def measure(build, batch: int, steps: int, dtype: str | None) -> tuple[float, float]:
    paddle.seed(0)
    model, data = build()
    opt = paddle.optimizer.AdamW(learning_rate=1e-4, parameters=model.parameters())
    scaler = amp.GradScaler(enable=dtype == "float16", init_loss_scaling=2**14)
    x, y = data(batch)
    paddle.device.cuda.synchronize()
    paddle.device.cuda.reset_max_memory_allocated()

    def step():
        with amp.auto_cast(enable=dtype is not None, dtype=dtype or "float16"):
            loss = paddle.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.clear_grad()

    for _ in range(3):
        step()
    paddle.device.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    paddle.device.cuda.synchronize()
    elapsed = time.perf_counter() - start
    return batch * steps / elapsed, paddle.device.cuda.max_memory_allocated() / 2**30


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    if not amp.probe():
        print("amp_speedup needs a CUDA GPU: none is visible here (nothing measured).")
        return 0
    decision = amp.device.current_decision("auto")
    if not decision.enabled:
        print(f"AMP is off on this GPU, nothing to compare: {decision.reason}")
        return 0
    print(f"GPU: {amp.probe()[0].name}; AMP dtype {decision.dtype}")
    for name, build, batch in (("ResNet-50-like", resnet50_like, 64), ("BERT-like", bert_like, 32)):
        fp32_speed, fp32_mem = measure(build, batch, args.steps, None)
        amp_speed, amp_mem = measure(build, batch, args.steps, decision.dtype)
        print(f"{name}: throughput x{amp_speed / fp32_speed:.2f} ({amp_speed:.1f} vs {fp32_speed:.1f} samples/s), "
              f"peak memory x{amp_mem / fp32_mem:.2f} ({amp_mem:.2f} vs {fp32_mem:.2f} GiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
