"""A user's PaddleFormers 1.2.0 auto-parallel training script that knows nothing of paddle_amp_ext.

Run by tests/clients/test_paddleformers_run.py under ``paddle.distributed.launch --nproc_per_node 2``
and ``python -m paddle_amp_ext.run [--emulate float16]`` in PaddleFormers' venv:
``Trainer(enable_auto_parallel=True)`` (which turns on ``dist.enable_auto_dp()``) with a tiny LLaMA,
no gradient clip (``max_grad_norm=0``: no global-norm reduction the skip could ride on), an inf
written into rank 1's own gradient addend before step 3's optimizer step.

argv: OUT_DIR DTYPE. Writes OUT_DIR/rank{N}.json: the steps, the learning rate after each, whether
the weights are finite and a hash of them, the Trainer's scaler and error.
"""

import hashlib
import json
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist
import paddleformers.trainer.trainer as pf_trainer
from paddleformers.trainer import Trainer, TrainerCallback, TrainingArguments
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM

OUT, DTYPE = sys.argv[1], sys.argv[2]
# A CPU: FSDP's tensor fusion asserts off gpu/npu/xpu (3.3.1) and gloo has no reduce_scatter, so
# the parameters stay replicated (auto-dp alone), as tests/dist_scripts/paddleformers_autodp.py does.
pf_trainer.fully_shard = lambda model, **kwargs: model
POISON_STEP = 3


class Ids(paddle.io.Dataset):
    def __init__(self, n=32):
        self.ids = np.random.default_rng(0).integers(1, 90, size=(n, 12)).astype("int64")

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class PoisonRank1(TrainerCallback):
    """inf in rank 1's own addend of the first gradient before step 3's optimizer step."""

    def __init__(self, model):
        self.model, self.poisoned = model, []

    def on_optimizer_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 != POISON_STEP or dist.get_rank() != 1:
            return
        param = next(p for p in self.model.parameters()
                     if getattr(p, "main_grad", None) is not None or p.grad is not None)
        grad = param.main_grad if getattr(param, "main_grad", None) is not None else param._grad_ivar()
        with paddle.no_grad():
            (grad._local_value() if grad.is_dist() else grad).fill_(float("inf"))
        self.poisoned.append(str(grad.placements) if grad.is_dist() else "dense")


class Seen(TrainerCallback):
    def __init__(self):
        self.steps, self.lrs = [], []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)
        self.lrs.append(float(kwargs["optimizer"].get_lr()))


paddle.seed(0)
config = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32, fuse_rms_norm=False,
                     use_single_model_implementation=True)
model = LlamaForCausalLM(config)
rank = dist.get_rank()
args = TrainingArguments(output_dir=os.path.join(OUT, f"out{rank}"), fp16=DTYPE == "float16", bf16=DTYPE == "bfloat16",
                         fp16_opt_level="O1", scale_loss=2.0**10, max_grad_norm=0.0, per_device_train_batch_size=2,
                         max_steps=5, learning_rate=1e-2, logging_steps=1, save_steps=1000, seed=0, disable_tqdm=True,
                         dataloader_drop_last=True, device="cpu", enable_auto_parallel=True, use_intermediate_api=True,
                         sharding="", report_to=[], save_checkpoint_format="", load_checkpoint_format="",
                         save_to_hf=False)
poison, seen = PoisonRank1(model), Seen()
trainer = Trainer(model=model, args=args, train_dataset=Ids(), callbacks=[poison, seen])
error = None
try:
    trainer.train()
except (ValueError, RuntimeError) as exc:  # PaddleFormers' LossNan, gloo's timeout
    error = f"{type(exc).__name__}: {exc}"[:300]
params = [np.asarray((p._local_value() if p.is_dist() else p).astype("float32").numpy()) for p in model.parameters()]
scaler = trainer.scaler
record = {
    "error": error, "poisoned": poison.poisoned, "steps": seen.steps, "lrs": seen.lrs,
    "finite": all(bool(np.isfinite(p).all()) for p in params),
    "digest": hashlib.sha256(b"".join(np.ascontiguousarray(p).tobytes() for p in params)).hexdigest(),
    "auto_dp": bool(paddle.distributed.auto_parallel.auto_dp_utils.in_auto_dp_mode()),
    "scaler": None if scaler is None else type(scaler).__module__,
    "scale": float(scaler.loss_scale) if hasattr(scaler, "loss_scale") else None,
}
with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
