"""Fp8Stats keeps a bounded window of records: long runs, non-finite values, windows of
0 and 1, wrong types, a reader that falls behind, threads and forks. The whole-run answers are
checked against a reference computed here from every record, as ``main`` computed them."""

from __future__ import annotations

import math
import os
import signal
import threading
import tracemalloc
from dataclasses import asdict

import numpy as np
import pytest
from dashboard_readers import read_visualdl

import paddle_amp_ext as amp
from paddle_amp_ext.dashboards.metrics import FP8_QUANTITIES
from paddle_amp_ext.fp8 import advise_fp8, diagnose
from paddle_amp_ext.fp8.reduction import QUANTITIES
from paddle_amp_ext.fp8.stats import KEEP_STEPS, Fp8Stats

UNBOUNDED = 10**9
LAYERS = ("a", "b/0", "注意力")
ROLES = ("input", "weight", "output_grad")
AMAX = (1.0, 448.0, math.inf, math.nan, 0.0, 1e-30)
SCALES = ((1.0, 2.0), (), (math.nan,), (math.inf, 0.5), (2.0**-20,), (math.nan, 3.0))


def _feed(stats_list, steps, seed=0, twice_every=7, empty_every=11):
    """The same pseudo-random run into every stats: 3 layers x 3 tensors a step, some tensors
    quantized twice in a step, some steps without records, the weight's format changing once,
    NaN and inf amax and scales. Ends every step with next_step()."""
    rng = np.random.default_rng(seed)
    for step in range(steps):
        if empty_every is None or step % empty_every != 5:
            for layer in LAYERS:
                for role in ROLES:
                    for _ in range(2 if (step + len(layer)) % twice_every == 0 else 1):
                        count = int(rng.integers(0, 200))
                        n_sat, n_flush = (int(rng.integers(0, count + 1)) for _ in range(2))
                        amax = AMAX[int(rng.integers(0, len(AMAX)))] * float(rng.random())
                        scales = np.array(SCALES[int(rng.integers(0, len(SCALES)))], np.float32)
                        fmt = "e5m2" if role == "output_grad" or (role == "weight" and step > steps // 2) else "e4m3fn"
                        for stats in stats_list:
                            stats.add_counts(layer, role, fmt, n_sat, n_flush, count, amax, scales)
        for stats in stats_list:
            stats.next_step()


def _top(values, pick=max):
    kept = [v for v in values if not math.isnan(v)]
    return pick(kept) if kept else math.nan


def _reference_summary(records):
    """The summary as main computed it from every record."""
    groups = {}
    for r in records:
        groups.setdefault((r.layer, r.role), []).append(r)
    rows = []
    for (layer, role), recs in groups.items():
        rows.append({"layer": layer, "tensor": role, "format": recs[-1].fmt, "steps": len({r.step for r in recs}),
                     "saturated": _top(r.saturated for r in recs), "flushed": _top(r.flushed for r in recs),
                     "amax": _top(r.amax for r in recs), "scale_min": _top((r.scale_min for r in recs), min),
                     "scale_max": _top(r.scale_max for r in recs)})
    return sorted(rows, key=lambda row: -(row["saturated"] + row["flushed"]))


def _plain(value):
    """NaN as a string so that equal results compare equal."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def test_the_reduction_names_the_registrys_quantities_in_order():
    assert QUANTITIES == FP8_QUANTITIES


def test_a_long_run_keeps_a_bounded_window_and_answers_for_the_whole_run():
    """10,000 steps: the window never holds more than keep_steps + 1 steps, and summary, worst,
    diagnose, advise_fp8 and recorded equal what every record gives."""
    bounded, every = Fp8Stats(keep_steps=3), Fp8Stats(keep_steps=UNBOUNDED)
    most = 0
    for chunk in range(20):
        _feed([bounded, every], 500, seed=chunk)
        most = max(most, len(bounded.records))
        assert {r.step for r in bounded.records} <= set(range(bounded.step - 3, bounded.step + 1))
    assert bounded.step == every.step == 10_000
    assert most <= 4 * 2 * len(LAYERS) * len(ROLES) and len(every.records) > 90_000
    assert bounded.recorded == every.recorded == len(every.records)
    reference = _reference_summary(every.records)
    assert {row["steps"] for row in reference} == {20 * sum(1 for s in range(500) if s % 11 != 5)}  # 11th: none
    amaxes = [r.amax for r in every.records]
    assert any(map(math.isnan, amaxes)) and math.inf in amaxes and 0.0 in amaxes
    assert _plain(bounded.summary()) == _plain(every.summary()) == _plain(reference)
    assert [row["format"] for row in bounded.summary() if row["tensor"] == "weight"] == ["e5m2"] * 3
    assert _plain(bounded.worst()) == _plain(every.worst()) and bounded.worst() is not None
    assert diagnose(bounded) == diagnose(every) and diagnose(bounded, 0.99) == diagnose(every, 0.99)
    assert advise_fp8(bounded) == advise_fp8(every)
    for step in range(bounded.step - 3, bounded.step):
        assert _plain(bounded.scalars(step)) == _plain(every.scalars(step)), step
    assert _plain(bounded.to_dicts()) == _plain([asdict(r) for r in every.records if r.step >= bounded.step - 3])


def test_memory_stays_flat_over_a_long_run_with_and_without_a_reader():
    """tracemalloc over 3,000 steps: what the stats hold after 500 steps is what they hold after
    3,500 (a reader that started and stopped reading pins nothing)."""
    for read in (False, True):
        stats = Fp8Stats(keep_steps=2)
        if read:
            stats.step_start()  # a hook that started watching, then stopped: it never ends a step
        _feed([stats], 500)
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            _feed([stats], 3_000, seed=1)
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 16 * 1024, (read, grown)
        assert stats.recorded > 30_000 and len(stats.records) <= 3 * 2 * len(LAYERS) * len(ROLES)


@pytest.mark.parametrize("keep", [0, 1])
def test_windows_of_zero_and_one_step(keep):
    stats, every = Fp8Stats(keep_steps=keep), Fp8Stats(keep_steps=UNBOUNDED)
    _feed([stats, every], 30)
    assert {r.step for r in stats.records} == ({29} if keep else set())  # step 30 (in progress) has no records
    assert _plain(stats.scalars()) == _plain(every.scalars(29) if keep else {})
    assert _plain(stats.to_dicts()) == _plain([d for d in every.to_dicts() if d["step"] >= 30 - keep])
    assert _plain(stats.summary()) == _plain(_reference_summary(every.records))
    assert diagnose(stats) == diagnose(every) and not diagnose(stats).startswith("No FP8 quantization")
    with pytest.raises(ValueError, match="step 20 left the kept window \\(the steps from 29 on, keep_steps=1\\)"
                                         if keep else "step 20 left the kept window \\(the steps from 30 on"):
        stats.scalars(20)
    assert stats.scalars(10**6) == {}  # a step not reached: no records, as before
    log = []

    class Writer:
        def add_scalar(self, tag, value, step):
            log.append(step)

    with pytest.raises(ValueError, match="step 20 left the kept window"):
        stats.log_to(Writer(), 20)
    assert stats.log_to(Writer()) == (45 if keep else 0) and set(log) <= {29}
    stats.add_counts("a", "input", "e4m3fn", 1, 0, 2, 1.0, np.ones(1, np.float32))
    assert [r.step for r in stats.records][-1] == 30 and stats.scalars()["fp8/a/input/saturated"] == 0.5


def test_the_default_window_keeps_the_last_hundred_steps():
    stats = Fp8Stats()
    assert stats.keep_steps == KEEP_STEPS == 100
    _feed([stats], 150, empty_every=None)
    assert {r.step for r in stats.records} == set(range(50, 150))


@pytest.mark.parametrize("bad, error, match", [
    ("3", TypeError, "keep_steps must be an int >= 0, .* Received: keep_steps='3' \\(of type str\\)"),
    (3.0, TypeError, "Received: keep_steps=3.0 \\(of type float\\)"),
    (True, TypeError, "Received: keep_steps=True \\(of type bool\\)"),
    (None, TypeError, "Received: keep_steps=None"),
    (np.int64(3), TypeError, "of type int64"),
    (-1, ValueError, "keep_steps must be >= 0 \\(0 keeps the step in progress only; default 100\\). "
                     "Received: keep_steps=-1"),
])
def test_keep_steps_refuses_what_is_not_a_count(bad, error, match):
    with pytest.raises(error, match=match):
        Fp8Stats(keep_steps=bad)


@pytest.mark.parametrize("bad", ["1", 1.0, True, [1]])
def test_scalars_refuses_a_step_that_is_not_an_int(bad):
    with pytest.raises(TypeError, match="step must be an int .* Received: step="):
        Fp8Stats().scalars(bad)


def test_non_finite_values_that_left_the_window_reduce_as_before():
    """NaN amax ignored unless all are NaN, inf kept, NaN scales ignored; across the window's edge."""
    stats, every = Fp8Stats(keep_steps=0), Fp8Stats(keep_steps=UNBOUNDED)
    nan, inf = math.nan, math.inf
    for amax, scales in ((nan, (nan,)), (3.0, ()), (nan, (inf, 2.0)), (inf, (0.25,)), (nan, (nan,))):
        for s in (stats, every):
            s.add_counts("x", "input", "e4m3fn", 0, 0, 0, amax, np.array(scales, np.float32))
            s.add_counts("only_nan", "weight", "e4m3fn", 1, 0, 4, nan, np.array([nan], np.float32))
            s.next_step()
    rows = {row["layer"]: row for row in stats.summary()}
    assert rows["x"]["amax"] == inf and rows["x"]["scale_min"] == 0.25 and rows["x"]["scale_max"] == 2.0
    assert math.isnan(rows["only_nan"]["amax"]) and math.isnan(rows["only_nan"]["scale_min"])
    assert rows["only_nan"]["saturated"] == 0.25 and rows["x"]["steps"] == 5 and stats.records == []
    assert _plain(stats.summary()) == _plain(_reference_summary(every.records))


def test_a_reader_that_falls_behind_by_more_than_the_window_loses_no_record():
    """end_step from the position it returned last: records that left the window meanwhile (the
    program called next_step() itself) are in the tags, reduced, as an unbounded stats gives them."""
    stats, every = Fp8Stats(keep_steps=0), Fp8Stats(keep_steps=UNBOUNDED)
    since, values = [stats.step_start(), every.step_start()], [None, None]
    for lap in range(4):
        _feed([stats, every], 6 + lap, seed=lap)  # 6 to 9 steps ended behind the reader's back
        for i, s in enumerate((stats, every)):
            values[i], since[i] = s.end_step(since[i])
        assert values[0] and _plain(values[0]) == _plain(values[1]), lap
        assert since[0] == stats.recorded == every.recorded
    assert stats.records == [] and stats.step == every.step


def test_a_second_reader_behind_the_window_gets_the_window_and_a_warning(caplog):
    stats = Fp8Stats(keep_steps=0)
    _feed([stats], 3, empty_every=None)
    stats.add_counts("a", "input", "e4m3fn", 1, 0, 4, 1.0, np.ones(1, np.float32))
    values, end = stats.end_step(0)  # position 0 left the window long ago: no reader read from it
    assert end == stats.recorded == 3 * 9 + 1 and set(values) == {f"fp8/a/input/{q}" for q in FP8_QUANTITIES}
    assert "left the window (keep_steps=0)" in caplog.text
    for bad, error in ((True, TypeError), (-1, ValueError), (end + 1, ValueError)):
        with pytest.raises(error, match="since must be"):
            stats.end_step(bad)


def test_a_hook_with_a_window_of_zero_writes_every_record(tmp_path):
    """The hook takes records by position across the window's edge: a program that ends the stats'
    step itself 3 times a scaler step writes what an unbounded stats writes."""
    written = {}
    for keep in (0, UNBOUNDED):
        stats = Fp8Stats(keep_steps=keep)
        with amp.VisualDLHook(str(tmp_path), run_name=f"r{keep}") as hook:
            hook.watch_fp8(stats)
            for step in range(4):
                for micro in range(3):
                    stats.add_counts("0", "input", "e4m3fn", micro, 0, 10, float(step * 10 + micro),
                                     np.array([1.0 + micro], np.float32))
                    stats.next_step()
                hook.on_step(amp.StepEvent(step, None, amp.StepResult(False, 1.0), None, 1.0))
        written[keep] = {tag: points for tag, points in read_visualdl(hook.logdir).items() if tag.startswith("fp8/")}
    assert written[0] == written[UNBOUNDED]
    assert written[0]["fp8/0/input/amax"] == [(0, 2.0), (1, 12.0), (2, 22.0), (3, 32.0)]
    assert written[0]["fp8/0/input/scale_min"] == [(s, 1.0) for s in range(4)]


def test_threads_adding_while_readers_summarize_and_end_steps():
    """4 threads add and end steps while a reader summarizes and another takes steps: no error, the
    count is exact, and the final summary is the whole run's (values known in advance)."""
    stats, adders, per_thread = Fp8Stats(keep_steps=2), 4, 3_000
    errors, done = [], threading.Event()

    def add(t):
        try:
            for i in range(per_thread):
                stats.add_counts(f"l{t}", ROLES[i % 3], "e4m3fn", i % 101, 0, 100, float(i), np.ones(1, np.float32))
                if i % 10 == 0:
                    stats.next_step()
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def read():
        last, since, seen = 0, stats.step_start(), 0
        try:
            while not done.is_set():
                rows = stats.summary()
                assert stats.recorded >= last
                last = stats.recorded
                assert all(row["saturated"] <= 1.0 for row in rows)
                since = stats.end_step(since)[1]
                stats.to_dicts()
                seen += 1
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(t,)) for t in range(adders)]
    reader = threading.Thread(target=read)
    reader.start()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.set()
    reader.join()
    assert errors == []
    assert stats.recorded == adders * per_thread and len(stats.records) < adders * per_thread
    rows = {(row["layer"], row["tensor"]): row for row in stats.summary()}
    assert len(rows) == adders * 3
    for (_, role), row in rows.items():
        values = [i for i in range(per_thread) if ROLES[i % 3] == role]
        assert row["saturated"] == max(i % 101 for i in values) / 100 and row["amax"] == float(max(values))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform")
def test_a_forked_child_records_although_a_thread_held_the_lock_at_the_fork():
    stats = Fp8Stats(keep_steps=0)
    holding, release = threading.Event(), threading.Event()

    def hold():
        with stats._lock:  # a thread of the parent in the middle of add_counts at the fork
            holding.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    holding.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: exit 0 once it recorded, killed by the alarm if the lock is stuck
        signal.alarm(5)
        stats.add_counts("c", "input", "e4m3fn", 1, 0, 2, 1.0, np.ones(1, np.float32))
        stats.next_step()
        os._exit(0 if stats.recorded == 1 and stats.summary()[0]["saturated"] == 0.5 else 1)
    release.set()
    thread.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    stats.add_counts("p", "input", "e4m3fn", 0, 0, 2, 1.0, np.ones(1, np.float32))
    assert stats.recorded == 1  # the parent's own lock still works


def test_a_scale_range_from_the_kernel_makes_the_record_the_scales_would():
    scales = np.array([[2.0**-3, 256.0], [0.0, 2.0**127]], np.float32)
    computed, given = Fp8Stats(), Fp8Stats()
    computed.add_counts("a", "input", "e4m3fn", 1, 2, 8, 3.5, scales)
    given.add_counts("a", "input", "e4m3fn", 1, 2, 8, 3.5, scales, scale_range=(np.float32(0.0), 2.0**127))
    assert computed.records == given.records
    assert (given.records[0].scale_min, given.records[0].scale_max) == (0.0, 2.0**127)
    assert type(given.records[0].scale_min) is float  # a host float, as the dashboards write it
