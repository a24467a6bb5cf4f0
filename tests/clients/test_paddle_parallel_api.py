"""A real client: the dynamic part of Paddle's own auto-parallel test
``test/auto_parallel/hybrid_strategy/parallel_api.py`` (a 2-layer LLaMA, ``parallelize_model``,
``paddle.amp.decorate``, ``dist.shard_scaler(GradScaler)``) on 2 CPU ranks under
``python -m paddle_amp_ext.run --emulate float16``, its fp16 configurations (data parallel 2).

Needs Paddle's test files, not part of any wheel; the test skips unless given the folder:
    PADDLE_AMP_EXT_PADDLE_HYBRID_STRATEGY_DIR=/path/to/Paddle/test/auto_parallel/hybrid_strategy
(checked with the folder's files as of PaddlePaddle/Paddle 0ab6998c on Paddle 3.3.1).
Before the rehearsal stopped rounding in place a tensor a backward node saved, every configuration
failed at step 1: silu's output, read by its backward, was rounded in place ("(PermissionDenied)
... modified by an inplace operation").
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import paddle
import pytest
from distributed import launch

HERE = Path(__file__).parent
RUN_MODULE = HERE.parent / "dist_scripts" / "run_module.py"
VARIABLE = "PADDLE_AMP_EXT_PADDLE_HYBRID_STRATEGY_DIR"
# What Paddle's runner (test_parallel_api_with_llama_1d.py) passes, on the CPU: dp 2, 2 micro-steps.
BASE = {"dtype": "float32", "seed": "2023", "dp": "2", "mp": "1", "pp": "1", "acc_step": "2", "amp": "true",
        "sharding_stage": "0", "test_share_embedding": "1", "test_position_embedding": "1"}


@pytest.mark.slow
@pytest.mark.parametrize("level, master_grad", [("O1", "false"), ("O2", "false"), ("O2", "true")])
def test_parallel_api_fp16_trains_under_the_rehearsal(tmp_path, monkeypatch, level, master_grad):
    if int(paddle.__version__.split(".")[0]) < 3 and paddle.__version__ != "0.0.0":
        pytest.skip(f"parallel_api.py needs Paddle 3's auto-parallel intermediate API (this is {paddle.__version__})")
    folder = os.environ.get(VARIABLE)
    if not folder:
        pytest.skip(f"{VARIABLE} is not set (Paddle's test/auto_parallel/hybrid_strategy folder)")
    if not (Path(folder) / "parallel_api.py").is_file():
        pytest.skip(f"{VARIABLE}={folder!r} has no parallel_api.py")
    for key, value in {**BASE, "amp_dtype": "float16", "amp_level": level, "amp_master_grad": master_grad}.items():
        monkeypatch.setenv(key, value)
    launch(RUN_MODULE, "--json", "--no-log", "--emulate", "float16", str(HERE / "paddle_parallel_api_dynamic.py"),
           folder, log_dir=tmp_path / "log", timeout=300)
    for rank in (0, 1):
        log = (tmp_path / "log" / f"workerlog.{rank}").read_text()
        summary = json.loads([line for line in log.splitlines() if line.startswith('{"script"')][-1])
        assert summary["exit_code"] == 0
        (scaler,) = summary["scalers"]
        assert scaler["steps"] == 2, "3 steps of 2 micro-steps: the loop stops after its second optimizer step"
        assert "step: 2  loss:" in log
