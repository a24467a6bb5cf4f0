"""``VisualDLCallback``: the hook's tags for ``paddle.Model.fit`` (hapi)."""

from __future__ import annotations

from typing import Any, List, Optional

import paddle

from .. import _compat
from ..dashboards import metrics
from ..scaler import GradScaler
from .hook import NotCopyable, add_step, close_all, open_writers
from .steps import Row, scale_rows


class VisualDLCallback(NotCopyable, paddle.callbacks.Callback):
    """hapi callback: the same tags as :class:`VisualDLHook` for ``paddle.Model.fit(..., amp_configs=...)``.

    The loss comes from hapi's logs (already on the host); the loss scale and the skip count of
    hapi's own GradScaler stay on the device until a flush. To train hapi with this package's
    scaler (the guard, collapse detection, ``amp/grad_norm`` from the second batch on), run
    ``fit`` inside :func:`paddle_amp_ext.routed`: hapi builds its scaler as
    ``paddle.amp.GradScaler(**amp_configs)``. The records are flushed at the end of each
    ``fit`` (a second ``fit`` goes on in the same run) and closed when the callback is
    garbage-collected, at exit or by :meth:`close`.

    Args:
        logdir: the folder the callback writes its own run directory in, as for :class:`VisualDLHook`.
        flush_every: write after this many steps at the latest.
        flush_secs: write what waits after this many seconds at the latest (a background thread,
            also when no further step comes; see :class:`VisualDLHook`).
        all_ranks: log on every rank (``RUN/rankN``), not only rank 0.
        run_name: the run directory's name (``''`` for ``logdir`` itself); default a new
            timestamped one.
        report_to: the dashboards, as for :class:`VisualDLHook` (default ``"visualdl"``).

    Example:
        >>> model.fit(data, epochs=1, callbacks=[VisualDLCallback("runs/hapi")])  # doctest: +SKIP
    """

    def __init__(self, logdir: str = "runs", *, flush_every: int = 200, flush_secs: float = 1.0,
                 all_ranks: bool = False, run_name: Optional[str] = None, report_to: Any = "visualdl") -> None:
        super().__init__()
        self.logdir: Optional[str] = None
        self._outs = open_writers(self, logdir, all_ranks, run_name, flush_every, flush_secs, report_to=report_to)
        self._out = self._outs[0] if self._outs else None
        self._step = 0
        self._skips: Any = None  # skipped steps so far, for Paddle's own scaler (a device value)

    def on_train_batch_begin(self, step: int, logs: Optional[dict] = None) -> None:
        """hapi's hook before a batch: ask this package's scaler, once built, to record the norm.

        Args:
            step: hapi's batch index.
            logs: hapi's logs (unused).
        """
        scaler = _compat.hapi_scaler(self.model)
        if isinstance(scaler, GradScaler):  # hapi builds it during the first batch
            scaler.record_grad_norm = True

    def on_train_batch_end(self, step: int, logs: Optional[dict] = None) -> None:
        """hapi's hook after a batch: log its loss, the loss scale and the skip count (no host read).

        Args:
            step: hapi's batch index.
            logs: hapi's logs, holding ``loss``.
        """
        if self._out is None or self._out.closed:
            return
        rows: List[Row] = []
        loss = (logs or {}).get("loss")
        if loss is not None:
            first = loss[0] if isinstance(loss, (list, tuple)) else loss
            rows.append((metrics.LOSS.name, float(getattr(first, "item", lambda: first)())))
        scaler = _compat.hapi_scaler(self.model)
        if isinstance(scaler, GradScaler) and scaler.last_result is not None:
            result = scaler.last_result
            rows += scale_rows(result.loss_scale)
            rows.append((metrics.SKIPPED_STEPS.name, float(scaler.skipped_steps)))
            if result.grad_norm is not None:
                rows.append((metrics.GRAD_NORM.name, result.grad_norm))
        elif scaler is not None and scaler.is_enable():  # Paddle's own scaler: device values, no sync
            rows += self._paddle_scaler_rows(scaler)
        else:
            rows += scale_rows(1.0)
            rows.append((metrics.SKIPPED_STEPS.name, 0.0))
        optimizer = getattr(self.model, "_optimizer", None)
        if optimizer is not None:
            rows.append((metrics.LR.name, float(optimizer.get_lr())))
        add_step(self._outs, self._step, rows)
        self._step += 1

    def _paddle_scaler_rows(self, scaler: Any) -> List[Row]:
        """Rows from ``paddle.amp.GradScaler``'s device state: copies, as Paddle updates it in place."""
        rows: List[Row] = []
        scale, found = _compat.paddle_scaler_view(scaler)
        if scale is not None:
            rows += [(metrics.LOSS_SCALE.name, scale.clone()), (metrics.LOG2_LOSS_SCALE.name, paddle.log2(scale))]
        if found is not None:
            flag = found.astype("float32") if isinstance(found, paddle.Tensor) else float(bool(found))
            self._skips = flag if self._skips is None else self._skips + flag
            rows.append((metrics.SKIPPED_STEPS.name, self._skips))
        return rows

    def on_train_end(self, logs: Optional[dict] = None) -> None:
        """hapi's hook after ``fit``: write what is buffered (one device-to-host read).

        Args:
            logs: hapi's logs (unused).
        """
        for out in self._outs:
            out.flush()

    def close(self) -> None:
        """Flush and close the records; later batches are not logged. Idempotent."""
        close_all(self._outs)
