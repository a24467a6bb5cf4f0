"""Run in two launchers (4 ranks): data-parallel training with a VisualDL hook on rank 0 while one
rank of the other launcher hangs at a step and is SIGKILLed (tests/hostile/test_hostile_records_fleet.py).

    python visualdl_dying_job.py OUT VICTIM HANG_AT

Every rank writes the number of its last finished step (update() returned) to
OUT/progress/rankR and its pid to OUT/pids/rankR. Rank VICTIM, after finishing step HANG_AT,
sleeps before its next backward (a rank stuck in a data loader or a hung device): the others
wait in that step's all-reduce, and die when the test SIGKILLs the victim (gloo's error under
paddle.DataParallel: SIGABRT from C++, no Python runs). Default hook settings: flush_every=50
(never reached here after the first 50 steps), flush_secs=1.
"""

import os
import sys
import time

import fleet_common as fc  # the protobuf fix for 2.6.2 first; its model and batches
import paddle
import paddle.distributed as dist

import paddle_amp_ext as amp

out, victim, hang_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
dist.init_parallel_env()  # one gloo group (fleet's many group creations race on a loaded machine)
rank = dist.get_rank()
for name, value in (("pids", os.getpid()),):
    os.makedirs(os.path.join(out, name), exist_ok=True)
    with open(os.path.join(out, name, f"rank{rank}"), "w") as f:
        f.write(str(value))
os.makedirs(os.path.join(out, "progress"), exist_ok=True)
progress = os.open(os.path.join(out, "progress", f"rank{rank}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
model = paddle.DataParallel(fc.mlp())
opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
hook = amp.VisualDLHook(os.path.join(out, "runs"), run_name="job")  # rank 0 only
scaler = amp.GradScaler(init_loss_scaling=1024, hooks=[hook])
for step in range(100_000):
    if rank == victim and step == hang_at + 1:
        time.sleep(600)  # the others wait in this step's all-reduce; the test kills this rank
    loss = paddle.nn.functional.mse_loss(model(fc.batch(step, rank)), paddle.zeros([8, 1]))
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()
    os.pwrite(progress, f"{step:010d}".encode(), 0)
