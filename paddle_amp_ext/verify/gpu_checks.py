"""The device side of ``check --verify``: runs Paddle on the current device and returns raw numbers.

:class:`DeviceRunner` is the seam: :mod:`.pipeline` asks it for numbers and judges them with
:mod:`.comparisons` and :mod:`.verdict`, so tests give the pipeline a runner that returns recorded
numbers. Written for a CUDA GPU; most of it also runs on a CPU (where ``auto_cast`` does nothing),
which is how the CPU tests exercise it. Every method syncs the device to the host.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

import numpy
import paddle

from .._compat import probes
from .._compat.scaler import paddle_scaler_view
from ..autocast import auto_cast, decorate, effective_op_lists
from ..rehearsal import fp16_emulation
from ..scaler import GradScaler
from .comparisons import parse_op_stats
from .models import ModelCase, facts, first_float
from .verdict import Measurement, ModelFacts

#: The unscale check's tensors: finite, +inf, NaN, -inf (each in a tensor of its own) and finite.
UNSCALE_VALUES = ([1.0, -2.0, 65504.0, 6.0e-5], [3.0, float("inf")], [float("nan"), 0.5],
                  [float("-inf"), 1.0], [8.0, -0.25])


@dataclass(frozen=True)
class OverflowOutcome:
    """A real overflow through the scaler: what the step and update did."""

    skipped: bool
    found_inf: bool
    scale_before: float
    scale_after: float
    weights_unchanged: bool


@dataclass(frozen=True)
class UnscaleOutcome:
    inputs: Tuple[numpy.ndarray, ...]
    kernel: Tuple[numpy.ndarray, ...]
    kernel_found: bool
    emulated: Tuple[numpy.ndarray, ...]
    emulated_found: bool
    place: str


def _numpy(t: paddle.Tensor) -> numpy.ndarray:
    return t.astype("float32").numpy() if t.dtype in (paddle.float16, paddle.bfloat16) else t.numpy()


def _sync() -> None:
    if paddle.device.is_compiled_with_cuda() and paddle.device.cuda.device_count():
        paddle.device.cuda.synchronize()


@contextlib.contextmanager
def on_cpu() -> Iterator[None]:
    """Create tensors on the CPU in the block, then go back to the device in use before.

    Paddle's device is process-wide: another thread creating tensors meanwhile gets the CPU too.
    """
    before = paddle.device.get_device()
    paddle.set_device("cpu")
    try:
        yield
    finally:
        paddle.set_device(before)


def _loss(layer: paddle.nn.Layer, inputs: Tuple[paddle.Tensor, ...]) -> paddle.Tensor:
    return first_float(layer(*inputs)).astype("float32").mean()


class DeviceRunner:
    """Runs each check's device part on the current device (``paddle.device.get_device()``).

    One at a time: the op statistics are a process-wide Paddle flag, and the rehearsal switches
    the process to the CPU while it runs. Every method syncs the device to the host.
    """

    def op_stats(self, case: ModelCase, dtype: str, level: str
                 ) -> Tuple[Dict[str, Tuple[int, int, int, int]], frozenset, frozenset]:
        """The op-dtype counts of one forward under ``auto_cast(level, dtype)`` (after ``decorate``
        at O2), with the white and black lists in force."""
        layer, inputs = case.build()
        if level == "O2":
            layer = decorate(layer, level="O2", dtype=dtype)
        with probes.op_stats() as counted:
            with auto_cast(level=level, dtype=dtype):
                layer(*inputs)
        white, black = effective_op_lists(dtype, level)
        return parse_op_stats(counted), white, black

    def overflow(self, scale: float = 2.0**16) -> OverflowOutcome:
        """A Linear whose float16 output overflows (256 inputs of 300 times weights of 1: 76800 >
        65504), one step and update of the package's GradScaler."""
        layer = paddle.nn.Linear(256, 8)
        layer.weight.set_value(paddle.ones([256, 8]))
        optimizer = paddle.optimizer.SGD(learning_rate=0.1, parameters=layer.parameters())
        scaler = GradScaler(init_loss_scaling=scale, decr_ratio=0.5, decr_every_n_nan_or_inf=1)
        before = [p.numpy().copy() for p in layer.parameters()]
        with auto_cast(dtype="float16"):
            loss = layer(paddle.full([4, 256], 300.0)).astype("float32").mean()
        scale_before = scaler.loss_scale
        scaler.scale(loss).backward()
        result = scaler.step(optimizer)
        scaler.update()
        cached = paddle_scaler_view(scaler)[1]  # the found_inf Paddle programs read after step()
        found = bool(numpy.asarray(cached.numpy() if isinstance(cached, paddle.Tensor) else cached).any())
        unchanged = all(numpy.array_equal(b, p.numpy()) for b, p in zip(before, layer.parameters()))
        return OverflowOutcome(skipped=bool(result.skipped), found_inf=found, scale_before=scale_before,
                               scale_after=scaler.loss_scale, weights_unchanged=unchanged)

    def unscale(self, dtype: str, scale: float = 4.0) -> UnscaleOutcome:
        """Paddle's kernel and the package's emulation of the CUDA one on copies of the same tensors.

        Raises:
            RuntimeError: the kernel has no ``dtype`` version on this place.
        """
        from .._compat.cuda_unscale import unscale_as_cuda

        def tensors() -> List[paddle.Tensor]:
            return [paddle.to_tensor(v, dtype="float32").astype(dtype) for v in UNSCALE_VALUES]

        factor = paddle.to_tensor([scale], dtype="float32")
        kernel = tensors()
        kernel_found = probes.check_finite_and_unscale(kernel, factor)
        emulated = tensors()
        emulated_found = unscale_as_cuda(emulated, factor)
        return UnscaleOutcome(inputs=tuple(_numpy(t) for t in tensors()), kernel=tuple(_numpy(t) for t in kernel),
                              kernel_found=bool(kernel_found.numpy().any()),
                              emulated=tuple(_numpy(t) for t in emulated),
                              emulated_found=bool(emulated_found.numpy().any()),
                              place=str(kernel[0].place))

    def rehearsal(self, case: ModelCase, dtype: str) -> Tuple[numpy.ndarray, numpy.ndarray]:
        """The forward under ``auto_cast(dtype)`` here and under ``fp16_emulation`` on the CPU,
        same weights and inputs; both outputs as float32 arrays."""
        layer, inputs = case.build()
        layer.eval()
        with paddle.no_grad(), auto_cast(dtype=dtype):
            here = _numpy(first_float(layer(*inputs)))
        state = {k: v.numpy() for k, v in layer.state_dict().items()}
        arrays = [t.numpy() for t in inputs]
        with on_cpu():
            twin, _ = case.build()
            twin.set_state_dict(state)
            twin.eval()
            with paddle.no_grad(), fp16_emulation(twin, dtype):
                rehearsed = _numpy(first_float(twin(*[paddle.to_tensor(a) for a in arrays])))
        return here, rehearsed

    def throughput(self, case: ModelCase, configs: Sequence[str], repeats: int = 5, steps: int = 10,
                   warmup: int = 3) -> Tuple[List[Measurement], ModelFacts]:
        """Steps/s of ``configs`` (``"fp32"``, ``"O1-float16"``, ...) in ``repeats`` interleaved
        rounds of ``steps`` training steps, after ``warmup`` steps each, with peak memory and the
        host's share of fp32's step."""
        runs, peaks, host, model_facts = {}, {}, {}, None
        for config in configs:
            baseline = _reset_peak()
            step, layer, inputs = _trainer(case, config)
            model_facts = model_facts or facts(layer, inputs)
            for _ in range(warmup):
                step()
            _sync()
            peaks[config] = _peak(baseline)
            host[config] = _host_fraction(layer, inputs, config, steps)
            runs[config] = step
        samples: Dict[str, List[float]] = {c: [] for c in configs}
        for _ in range(repeats):
            for config in configs:
                start = time.perf_counter()
                for _ in range(steps):
                    runs[config]()
                _sync()
                samples[config].append(steps / (time.perf_counter() - start))
        measured = [Measurement(c, tuple(samples[c]), peaks[c], host[c]) for c in configs]
        return measured, model_facts


def _amp(config: str) -> Tuple[bool, str, str]:
    if config == "fp32":
        return False, "O1", "float16"
    level, dtype = config.split("-")
    return True, level, dtype


def _trainer(case: ModelCase, config: str):
    layer, inputs = case.build()
    enable, level, dtype = _amp(config)
    optimizer = paddle.optimizer.Adam(learning_rate=1e-4, parameters=layer.parameters())
    if enable and level == "O2":
        layer, optimizer = decorate(layer, optimizer, level="O2", dtype=dtype)
    scaler = GradScaler(enable=enable and dtype == "float16")

    def step() -> None:
        with auto_cast(enable=enable, level=level, dtype=dtype):
            loss = _loss(layer, inputs)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.clear_grad()

    return step, layer, inputs


def _host_fraction(layer: paddle.nn.Layer, inputs: Tuple[paddle.Tensor, ...], config: str, steps: int) -> float:
    """Time to issue ``steps`` forward+backward passes / time until the device has run them (no
    host read in the loop, so the host can run ahead of a busy device)."""
    enable, level, dtype = _amp(config)
    _sync()
    start = time.perf_counter()
    for _ in range(steps):
        with auto_cast(enable=enable, level=level, dtype=dtype):
            loss = _loss(layer, inputs)
        loss.backward()
    issued = time.perf_counter() - start
    _sync()
    total = time.perf_counter() - start
    layer.clear_gradients()
    return issued / total


def _reset_peak() -> Optional[int]:
    """Reset the device's peak-memory counter; the memory allocated now (None on a CPU or where
    Paddle has no reset, as 2.6)."""
    cuda = paddle.device.cuda
    if not (paddle.device.is_compiled_with_cuda() and cuda.device_count()) or \
            not hasattr(cuda, "reset_max_memory_allocated"):
        return None
    cuda.reset_max_memory_allocated()
    return int(cuda.memory_allocated())


def _peak(baseline: Optional[int]) -> Optional[int]:
    if baseline is None:
        return None
    return int(paddle.device.cuda.max_memory_allocated()) - baseline
