"""A process that dies while its VisualDL records are being written (tests/hostile/test_hostile_writer.py).

    python records_child.py WHAT LOGDIR [N]

WHAT:
- "idle": log N steps (flush_every far away, flush_secs 0.5), print "logged", sleep: the parent
  SIGKILLs it (no Python runs, as for an OOM kill or a scheduler's kill -9).
- "abort": the same, then ``os.abort()`` after 1.5 s (SIGABRT from C, as gloo's error under
  paddle.DataParallel: no Python runs).
- "busy": log steps forever, printing "step N" after each; the parent SIGKILLs it.
- "hung_device": as "idle", but every device read in the background flusher blocks forever
  (a GPU stream stuck behind a hung collective): the host rows must be written anyway.
- "interrupt_in_flush": a KeyboardInterrupt raised by a handler of the script's (installed
  after the last step, so not wrapped) while one flush of N steps is being encoded;
  "interrupt_in_flush_ours": the same SIGINT with our handler in place (Python's default after it).
- "sigint_ocr_before" / "sigint_ocr_after" / "sigint_default": train with the real scaler,
  printing "step N"; the parent sends SIGINT. ocr_*: a PaddleOCR-style handler that SIGKILLs
  its process group, installed before or after the hook is made; default: Python's
  KeyboardInterrupt (caught: prints "interrupted at N" and exits 130).
- "chains_back" / "ignored": after the hook, the script installs a SIGINT handler that calls
  the one it replaced (ours), or SIG_IGN; logs N steps and sends itself SIGINT.
"""

import os
import signal
import sys
import threading
import time

import paddle

import paddle_amp_ext as amp
from paddle_amp_ext.events import StepEvent, StepResult

WHAT, LOGDIR = sys.argv[1], sys.argv[2]
N = int(sys.argv[3]) if len(sys.argv) > 3 else 0


def ocr_handler(signum, frame):  # what PaddleOCR's tools/program.py does on SIGINT/SIGTERM (our own code)
    print("ocr handler", flush=True)
    os.killpg(os.getpgid(0), signal.SIGKILL)


def event(step):
    return StepEvent(step, paddle.to_tensor(float(step)), StepResult(False, 1024.0), 0.5, 1024.0)


if WHAT.startswith("sigint"):
    if WHAT == "sigint_ocr_before":
        signal.signal(signal.SIGINT, ocr_handler)
    model = paddle.nn.Linear(4, 1)
    opt = paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())
    scaler = amp.GradScaler(init_loss_scaling=1024, hooks=[amp.VisualDLHook(LOGDIR, flush_every=50,
                                                                            flush_secs=1000.0)])
    if WHAT == "sigint_ocr_after":
        signal.signal(signal.SIGINT, ocr_handler)
    step = -1
    try:
        for step in range(100_000):
            scaler.scale(model(paddle.ones([2, 4])).mean()).backward()
            scaler.step(opt)
            scaler.update()
            opt.clear_grad()
            print("step", step, flush=True)
    except KeyboardInterrupt:
        print("interrupted at", step, flush=True)
        sys.exit(130)
    sys.exit(0)

if WHAT in ("chains_back", "ignored"):  # a handler installed after the hook, wrapped at the next step
    hook = amp.VisualDLHook(LOGDIR, run_name="", flush_every=10**6, flush_secs=1000.0)
    if WHAT == "chains_back":
        previous = signal.getsignal(signal.SIGINT)  # ours

        def calls_previous(signum, frame):
            print("script handler", flush=True)
            previous(signum, frame)  # as well-behaved handlers do: reaches Python's, never ours again

        signal.signal(signal.SIGINT, calls_previous)
    else:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    for step in range(N):
        hook.on_step(event(step))
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        print("still running", flush=True)
    except KeyboardInterrupt:
        print("KeyboardInterrupt", flush=True)
    print("written", hook._out.pending == 0, flush=True)
    sys.exit(0)
hook = amp.VisualDLHook(LOGDIR, run_name="", flush_every=10**6, flush_secs=0.5)
if WHAT == "hung_device":
    hang = threading.Event()

    def never_answers(entries):
        hang.wait()  # the flusher holds here, as on a device read behind a hung collective

    hook._out._encode_stacked = never_answers
if WHAT.startswith("interrupt_in_flush"):
    hook = amp.VisualDLHook(LOGDIR, run_name="x", flush_every=10**6, flush_secs=1000.0)
    encoder = hook._out._encoder
    encode = encoder.step
    fired = []

    def interrupt_while_encoding(step, walltime_ms, values):
        if step == N // 2 and not fired:
            fired.append(step)
            os.kill(os.getpid(), signal.SIGINT)  # handled at the next bytecode: inside this flush
        return encode(step, walltime_ms, values)

    encoder.step = interrupt_while_encoding
if WHAT == "busy":
    for step in range(10**9):
        hook.on_step(event(step))
        print("step", step, flush=True)
for step in range(N):
    hook.on_step(event(step))
if WHAT.startswith("interrupt_in_flush"):
    def raising(signum, frame):  # the script's own, installed after the last step: ours never wrapped it
        raise KeyboardInterrupt

    if WHAT == "interrupt_in_flush":  # else ours (Python's KeyboardInterrupt after the flush)
        signal.signal(signal.SIGINT, raising)
    try:
        hook.flush()
    except KeyboardInterrupt:
        print("interrupted", len(hook._out._queue), flush=True)
    sys.exit(0)  # no close(): the exit writes what the interrupted flush left
print("logged", flush=True)
if WHAT == "abort":
    time.sleep(1.5)
    os.abort()
time.sleep(120)
print("not killed", flush=True)
