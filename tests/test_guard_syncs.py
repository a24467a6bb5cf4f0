"""benchmarks/guard_syncs.py's counts, as assertions: what a guarded step reads back from the device."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from guard_syncs import measure  # noqa: E402


@pytest.mark.parametrize("kind", ["AdamW", "Adam(multi_tensor)", "Momentum"])
def test_a_guarded_step_reads_one_value_back_however_it_is_guarded(kind):
    plain = measure(kind, "plain", 2)
    assert plain["reads_per_step"] == [0, 0] and not plain["weights_finite"], "the control: the NaN is applied"
    for variant in ("found_inf", "guard", "scaler"):
        row = measure(kind, variant, 2)
        assert row["reads_per_step"] == [1, 1], (variant, "Paddle's found_inf is read on the host too")
        assert row["last_step_skipped"] is True and row["weights_finite"], variant


def test_the_count_sees_a_read():
    import paddle
    from guard_syncs import counting

    x = paddle.ones([2])
    with counting() as counts:
        bool(x.sum())
        x.numpy()
        float(x.sum())
    assert counts["reads"] == 3
