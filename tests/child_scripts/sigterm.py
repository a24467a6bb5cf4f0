"""Training that a SIGTERM ends (tests/test_visualdl_lifetime.py).

    python sigterm.py MODE WHEN LOGDIR
MODE "hook": amp.GradScaler with a VisualDLHook (flush_every=50); "none": the same loop with no
hook (the control: how the process ends without us); "run": paddle.amp.GradScaler, for
`python -m paddle_amp_ext.run`. WHEN "idle": 120 steps, "ready" on stdout, then a sleep the
signal interrupts; "training": "step N" after every step until the signal; "in_flush": the
process sends itself SIGTERM while the hook encodes step 60 (in the middle of a flush); "user_handler": a
Python SIGTERM handler (installed before the hook) that prints and exits 7.
"""

import os
import signal
import sys
import time

import paddle

MODE, WHEN, LOGDIR = sys.argv[1:4]

if WHEN == "user_handler":
    def on_term(signum, frame):
        print("user handler", flush=True)
        sys.exit(7)

    signal.signal(signal.SIGTERM, on_term)

model = paddle.nn.Linear(4, 1)
opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
if MODE == "run":
    scaler = paddle.amp.GradScaler(init_loss_scaling=1024)
else:
    import paddle_amp_ext as amp

    hooks = [amp.VisualDLHook(LOGDIR, flush_every=50)] if MODE == "hook" else []
    scaler = amp.GradScaler(init_loss_scaling=1024, hooks=hooks)
    if WHEN == "in_flush":
        encoder = hooks[0]._out._encoder
        encode = encoder.step

        def term_while_encoding(step, walltime_ms, values):
            if step == 60:  # the second flush (steps 50-99) has taken its batch and not written it yet
                os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode: inside this flush
            return encode(step, walltime_ms, values)

        encoder.step = term_while_encoding


def one_step():
    loss = model(paddle.ones([2, 4])).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()


if WHEN in ("idle", "user_handler"):
    for _ in range(120):
        one_step()
    print("ready", flush=True)
    time.sleep(120)
    print("not ended by the signal", flush=True)
elif WHEN == "training":
    for step in range(100_000):
        one_step()
        print("step", step, flush=True)
elif WHEN == "in_flush":
    for _ in range(120):
        one_step()
    print("not ended by the signal", flush=True)
