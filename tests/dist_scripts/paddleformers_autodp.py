"""Run under `paddle.distributed.launch --nproc_per_node 2` with PaddleFormers' venv: its
``Trainer(enable_auto_parallel=True)`` (auto-dp: the Trainer calls ``dist.enable_auto_dp()``) with a
tiny LLaMA, paddle_amp_ext routed in with ``AmpCallback``, an inf injected into rank 1's own gradient
(its addend, labelled ``Replicate``) before the optimizer step of step 3.

argv: OUT_DIR DTYPE [bare] (``float16``: loss scaling on, under ``fp16_emulation``; ``bfloat16``:
no scaler, the Trainer calls ``optimizer.step()``, guarded; ``bare``: the control, PaddleFormers
and Paddle alone, no routing, no callback). Writes OUT_DIR/rank{N}.json: the skips counted, the
scale, whether the weights are finite, a hash of them (the same on both ranks), the Trainer's error.

What a CPU needs (PaddleFormers 1.2.0 on Paddle 3.3.1): ``use_intermediate_api=True`` with
``use_single_model_implementation=True`` (the basic API leaves the parameters dense, and FSDP then
fails on them) and ``sharding=""`` (the default ``stage1`` reshards the gradients to ``Shard(0)``
before Paddle's auto-dp relabel, which asserts they are ``Replicate``); FSDP skipped (below).
"""

import hashlib
import json
import logging
import os
import sys

import numpy as np
import paddle
import paddle.distributed as dist

import paddle_amp_ext as amp

BARE = len(sys.argv) > 3 and sys.argv[3] == "bare"  # the control: PaddleFormers and Paddle alone
if not BARE:
    amp.route()  # before paddleformers.trainer binds paddle.amp.auto_cast and builds its GradScaler
from paddleformers.trainer import Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from paddleformers.transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from trainer_callbacks import TokenIds  # noqa: E402

from paddle_amp_ext.integrations.paddleformers import AmpCallback  # noqa: E402

OUT, DTYPE = sys.argv[1], sys.argv[2]
# The Trainer's auto-parallel path always calls fully_shard (FSDP). Its default, tensor fusion, runs
# on gpu/npu/xpu only (3.3.1: tensor_fusion_helper asserts on a CPU, and gloo has no reduce_scatter);
# without the fusion, Paddle's own auto-dp relabel asserts on the Shard(0) gradients ("the partial
# axis of grad should be Replicate"). On a CPU the parameters stay replicated: auto-dp alone.
import paddleformers.trainer.trainer as pf_trainer  # noqa: E402

pf_trainer.fully_shard = lambda model, **kwargs: model
POISON_STEP = 3
logging.getLogger("paddle_amp_ext").setLevel(logging.WARNING)
rank = dist.get_rank()


class PoisonRank1(TrainerCallback):
    """inf in rank 1's own addend of one gradient (``main_grad`` where set), before step 3's
    optimizer step; rank 0's gradients stay finite."""

    def __init__(self, model):
        self.model, self.poisoned = model, []

    def on_optimizer_begin(self, args, state, control, **kwargs):
        if state.global_step + 1 != POISON_STEP or rank != 1:
            return
        param = next(p for p in self.model.parameters()
                     if getattr(p, "main_grad", None) is not None or p.grad is not None)
        where = "main_grad" if getattr(param, "main_grad", None) is not None else "grad"
        grad = param.main_grad if where == "main_grad" else param._grad_ivar()
        local = grad._local_value() if grad.is_dist() else grad
        with paddle.no_grad():
            local.fill_(float("inf"))  # shares the DistTensor's storage
        self.poisoned.append([where, bool(grad.is_dist()), str(grad.placements) if grad.is_dist() else "dense"])


class Seen(TrainerCallback):
    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


paddle.seed(0)
config = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                     num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32, fuse_rms_norm=False,
                     use_single_model_implementation=True)
model = LlamaForCausalLM(config)
args = TrainingArguments(output_dir=os.path.join(OUT, f"out{rank}"), fp16=DTYPE == "float16",
                         bf16=DTYPE == "bfloat16", fp16_opt_level="O1", scale_loss=2.0**10,
                         per_device_train_batch_size=2, max_steps=5, learning_rate=1e-2, logging_steps=1,
                         save_steps=1000, seed=0, disable_tqdm=True, dataloader_drop_last=True, device="cpu",
                         enable_auto_parallel=True, use_intermediate_api=True, sharding="", report_to=[], save_checkpoint_format="",
                         load_checkpoint_format="", save_to_hf=False)
poison, seen, callback = PoisonRank1(model), Seen(), AmpCallback()
callbacks = [poison, seen] + ([] if BARE else [callback])
trainer = Trainer(model=model, args=args, train_dataset=TokenIds(), callbacks=callbacks)
error = None
try:
    if BARE:
        trainer.train()
    else:
        with amp.fp16_emulation(model, dtype=DTYPE):
            trainer.train()
except ValueError as exc:  # the control: "LossNan" once the inf reached the weights
    error = str(exc)
params = [np.asarray((p._local_value() if p.is_dist() else p).astype("float32").numpy()) for p in model.parameters()]
digest = hashlib.sha256(b"".join(np.ascontiguousarray(p).tobytes() for p in params)).hexdigest()
scaler = trainer.scaler
record = {
    "error": error, "poisoned": poison.poisoned, "steps": seen.steps, "finite": all(bool(np.isfinite(p).all()) for p in params),
    "digest": digest, "auto_dp": bool(paddle.distributed.auto_parallel.auto_dp_utils.in_auto_dp_mode()),
    "scaler": type(scaler).__module__ if scaler is not None else None,
    "scale": float(scaler.loss_scale) if isinstance(scaler, amp.GradScaler) else None,
    "skipped": None if BARE else scaler.skipped_steps if isinstance(scaler, amp.GradScaler) and scaler.is_enable()
    else callback.optimizer_guard.skipped_steps,
}
with open(os.path.join(OUT, f"rank{rank}.json"), "w") as f:
    json.dump(record, f)
print(f"rank {rank}: {record}", flush=True)
