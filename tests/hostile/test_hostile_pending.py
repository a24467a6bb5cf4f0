"""A hook's waiting steps (``visualdl.steps.PendingSteps``) and the batched device read
(``writer.read_means``) against hostile input: events that are no StepEvents, skipped steps
across flushes, a flush racing the training thread, a hook dropped with steps waiting, a
handler installed in the middle of a run, and values of mixed shapes, dtypes, empty and
non-finite. Every record is read back with VisualDL's own LogReader."""

from __future__ import annotations

import gc
import glob
import math
import os
import signal
import threading
import time
import weakref

import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext.events import StepEvent, StepResult
from paddle_amp_ext.visualdl import shutdown, writer
from paddle_amp_ext.visualdl.steps import PendingSteps

pytest.importorskip("visualdl")
from visualdl import LogReader  # noqa: E402


def event(step, loss=None, skipped=False, lr=0.5, norm=None):
    return StepEvent(step, loss, StepResult(skipped, 1024.0, norm), lr, 1024.0)


def read(directory, tag):
    (path,) = glob.glob(os.path.join(str(directory), "vdlrecords.*"))
    return [(d.id, d.value) for d in LogReader(file_path=path).get_data("scalar", tag)]


# ---------------------------------------------------------------- read_means
def test_values_of_one_shape_and_dtype_are_read_in_one_stack(monkeypatch):
    calls = []
    real = paddle.stack
    monkeypatch.setattr(paddle, "stack", lambda values, *a, **k: calls.append(len(values)) or real(values, *a, **k))
    values = [paddle.to_tensor(float(i)) for i in range(100)]
    assert writer.read_means(values) == [float(i) for i in range(100)]
    assert calls == [100], "one stack, one read"


def test_mixed_shapes_and_dtypes_are_read_per_group_in_order(monkeypatch):
    values = [paddle.to_tensor(1.5), paddle.to_tensor([2.5]), paddle.to_tensor([1.0, 3.0]),
              paddle.to_tensor(4.0).astype("bfloat16"), paddle.to_tensor(-0.25).astype("float16"),
              paddle.to_tensor(6.5), paddle.to_tensor([7.5])]
    calls = []
    real = paddle.stack
    monkeypatch.setattr(paddle, "stack", lambda vs, *a, **k: calls.append(len(vs)) or real(vs, *a, **k))
    assert writer.read_means(values) == [1.5, 2.5, 2.0, 4.0, -0.25, 6.5, 7.5]
    assert calls[0] == 7, "one try for all first (Paddle refuses it)"
    assert sorted(calls[1:]) == [1, 1, 1, 2, 2], "then one stack per shape and dtype"


def test_non_finite_and_single_values():
    nan, inf = float("nan"), float("inf")
    means = writer.read_means([paddle.to_tensor(inf), paddle.to_tensor(-inf), paddle.to_tensor(nan)])
    assert means[:2] == [inf, -inf] and math.isnan(means[2])
    assert writer.read_means([paddle.to_tensor(3.0e38)]) == [pytest.approx(3.0e38, rel=1e-7)]


def test_an_empty_loss_among_scalar_ones_is_recorded_as_nan(tmp_path):
    """Paddle 2.6.2 cannot stack empty tensors: the hook never hands one to the read."""
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=math.inf)
    for step, loss in enumerate([paddle.to_tensor(1.0), paddle.zeros([0]), paddle.to_tensor([2.0, 4.0])]):
        hook.on_step(event(step, loss))
    hook.close()
    (first, empty, mean) = read(tmp_path, "amp/loss")
    assert first == (0, 1.0) and empty[0] == 1 and math.isnan(empty[1]) and mean == (2, 3.0)


# ---------------------------------------------------------------- PendingSteps
class Recorder:
    def __init__(self):
        self.entries = []
        self.closed = False

    def enqueue(self, entries):
        self.entries += entries


def test_pull_hands_every_writer_the_same_rows_in_order_and_counts_skips():
    first, second = Recorder(), Recorder()
    steps = PendingSteps([first, second])
    for step in range(5):
        steps.events.append((event(step, paddle.to_tensor(float(step)), skipped=step in (1, 3)), 1000 + step, None))
    steps.pull()
    steps.events.append((event(5, skipped=True), 1005, [("fp8/l/x/amax", 3.0)]))
    steps.pull()
    assert len(steps) == 0
    assert [e[0] for e in first.entries] == list(range(6))
    assert all(a[2] is b[2] for a, b in zip(first.entries, second.entries)), "one rows list per step: read once"
    skipped = [dict(rows)["amp/skipped_steps"] for _, _, rows in first.entries]
    assert skipped == [0.0, 1.0, 1.0, 2.0, 2.0, 3.0]
    assert dict(first.entries[5][2])["fp8/l/x/amax"] == 3.0 and "amp/loss" not in dict(first.entries[5][2])
    assert [wall for _, wall, _ in first.entries] == [1000 + s for s in range(6)]


@pytest.mark.parametrize("bad", [
    StepEvent(0, None, None, 0.5, 1.0),                       # result missing
    StepEvent(0, None, StepResult(False, "big"), 0.5, 1.0),  # a scale that is no number
    object(),                                                 # no event at all
])
def test_an_event_whose_rows_cannot_be_built_is_left_out_warned_once(bad, caplog_amp):
    out = Recorder()
    steps = PendingSteps([out])
    steps.events.extend([(event(0), 1, None), (bad, 2, None), (bad, 3, None), (event(1), 4, None)])
    steps.pull()
    assert [e[0] for e in out.entries] == [0, 1], "the good steps around it are kept"
    assert caplog_amp.text.count("cannot be recorded") == 1
    assert len(steps) == 0


def test_a_forked_childs_copy_drops_the_parents_waiting_steps():
    steps = PendingSteps([Recorder()])
    steps.events.append((event(0), 1, None))
    steps.forked()
    assert len(steps) == 0


# ---------------------------------------------------------------- through the hook
def test_skipped_steps_count_across_inline_and_explicit_flushes(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=4, flush_secs=math.inf)
    for step in range(11):
        hook.on_step(event(step, paddle.to_tensor(float(step)), skipped=step % 3 == 0))
        if step == 5:
            hook.flush()
    hook.close()
    assert read(tmp_path, "amp/skipped_steps") == [(s, float(s // 3 + 1)) for s in range(11)]
    assert read(tmp_path, "amp/loss") == [(s, float(s)) for s in range(11)]


def test_a_flush_racing_the_training_thread_writes_every_step_once_in_order(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=math.inf)
    done = threading.Event()

    def flusher():
        while not done.is_set():
            hook.flush()

    thread = threading.Thread(target=flusher)
    thread.start()
    try:
        for step in range(3000):
            hook.on_step(event(step, paddle.to_tensor(float(step)), skipped=step % 7 == 0))
    finally:
        done.set()
        thread.join(timeout=60)
    hook.close()
    assert read(tmp_path, "amp/loss") == [(s, float(s)) for s in range(3000)]
    assert read(tmp_path, "amp/skipped_steps")[-1] == (2999, float(len(range(0, 3000, 7))))


def test_a_hook_dropped_with_steps_waiting_is_collected_and_its_steps_written(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=math.inf)
    for step in range(9):
        hook.on_step(event(step, paddle.to_tensor(float(step))))
    gone = weakref.ref(hook)
    del hook
    gc.collect()
    assert gone() is None, "the waiting steps hold no reference to the hook"
    assert read(tmp_path, "amp/loss") == [(s, float(s)) for s in range(9)]


def test_a_bad_step_is_refused_at_the_step_and_nothing_waits(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=math.inf)
    for bad, error in ((-1, ValueError), (1.0, TypeError), (True, TypeError), (2**63, ValueError)):
        with pytest.raises(error, match="StepEvent.step must be an int"):
            hook.on_step(event(bad))
    assert hook._out.pending == 0
    hook.on_step(event(0, paddle.to_tensor(1.0)))
    assert hook._out.pending == 1
    hook.close()
    assert read(tmp_path, "amp/loss") == [(0, 1.0)]


def test_steps_after_close_are_not_kept(tmp_path):
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=math.inf)
    hook.on_step(event(0, paddle.to_tensor(1.0)))
    hook.close()
    for step in range(1, 100):
        hook.on_step(event(step, paddle.to_tensor(1.0)))
    assert hook._out.pending == 0
    assert read(tmp_path, "amp/loss") == [(0, 1.0)]


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="signals: main thread")
def test_a_handler_installed_mid_run_is_put_behind_ours_after_the_next_flush(tmp_path):
    """The hook's signal handler goes back in front at the first step after each flush (at most
    ``flush_secs`` or ``flush_every`` steps after the script's handler was installed)."""
    before = signal.getsignal(signal.SIGINT)
    hook = amp.VisualDLHook(tmp_path, run_name="", flush_every=10**6, flush_secs=0.2)
    try:
        hook.on_step(event(0, paddle.to_tensor(0.0)))
        assert signal.getsignal(signal.SIGINT) is shutdown._on_signal

        def script_handler(signum, frame):
            pass

        signal.signal(signal.SIGINT, script_handler)
        hook.on_step(event(1, paddle.to_tensor(1.0)))
        deadline = time.monotonic() + 10
        while hook._out.pending and time.monotonic() < deadline:  # the background flusher writes them
            time.sleep(0.02)
        hook.on_step(event(2, paddle.to_tensor(2.0)))
        assert signal.getsignal(signal.SIGINT) is shutdown._on_signal, "ours in front again"
        os.kill(os.getpid(), signal.SIGINT)  # ours flushes, then the script's runs (no KeyboardInterrupt)
        time.sleep(0.1)
        assert read(tmp_path, "amp/loss") == [(0, 0.0), (1, 1.0), (2, 2.0)]
    finally:
        hook.close()
        signal.signal(signal.SIGINT, before)
