"""Op lists as the suites write them: every op Paddle defines for any backend is valid, also on a CPU.

A CPU wheel registers no GPU-only op (``sync_batch_norm``, ``fused_gemm_epilogue``, ...); the
lists below are the ones the suites' trainers and configs use (PaddleSeg 2.8.0 hard-codes its
lists in ``paddleseg/core/train.py``).
"""

from __future__ import annotations

import json
import logging

import paddle
import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import AmpConfig, _compat, oplists
from paddle_amp_ext.check import main

SUITE_LISTS = {
    "PaddleSeg 2.8.0 train": ({"elementwise_add", "batch_norm", "sync_batch_norm"}, {"bilinear_interp_v2"}),
    "PaddleClas engine": (set(), {"flatten_contiguous_range", "greater_than"}),
    "PaddleDetection ppyoloe configs": (set(), {"reduce_mean"}),
    "PaddleNLP/PaddleFormers llm configs": (
        {"lookup_table", "lookup_table_v2", "flash_attn", "matmul", "matmul_v2", "fused_gemm_epilogue"},
        {"reduce_sum", "softmax_with_cross_entropy", "c_softmax_with_cross_entropy", "elementwise_div",
         "sin", "cos", "c_embedding"},
    ),
}

#: Ops a CPU wheel has no kernel for (kernels for GPUs or XPUs only, or fused ops).
ELSEWHERE = ["sync_batch_norm", "fused_gemm_epilogue", "fused_attention", "fused_feedforward",
             "fused_bn_add_activation", "fused_batch_norm_act", "fused_multi_transformer", "resnet_unit"]
#: XPU-only and fused ops a CPU wheel does register (as op definitions without a CPU kernel).
REGISTERED_ELSEWHERE = ["conv2d_xpu", "fc_xpu", "fused_multi_transformer_xpu", "fused_conv2d_add_act",
                        "fused_bias_dropout_residual_layer_norm", "fused_rotary_position_embedding"]

cpu_build = pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="a CPU wheel's registry is the subject")


@pytest.mark.parametrize("suite", sorted(SUITE_LISTS))
def test_the_suites_lists_are_accepted_and_reach_the_tracer(suite):
    white, black = SUITE_LISTS[suite]
    with amp.auto_cast(custom_white_list=white, custom_black_list=black):
        tracer_white, tracer_black = _compat.tracer_op_lists()
    assert set(oplists.expand(white)) <= tracer_white
    assert set(oplists.expand(black)) <= tracer_black


@pytest.mark.parametrize("name", ELSEWHERE + REGISTERED_ELSEWHERE)
def test_gpu_xpu_and_fused_ops_are_valid_names(name):
    oplists.validate([name], [])
    oplists.validate([], [name])
    assert name in _compat.ops_paddle_defines()


@cpu_build
@pytest.mark.parametrize("name", ["sync_batch_norm", "fused_gemm_epilogue", "fused_attention"])
def test_an_op_without_a_kernel_here_is_noted_once_at_info(name, caplog_amp):
    assert name not in _compat.ops_this_build_registers(), "the CPU registry lacks it (the reason for the note)"
    for _ in range(2):
        with amp.auto_cast(custom_white_list=[name, "elementwise_add"]):
            assert name in _compat.tracer_op_lists()[0], "handed to Paddle as written"
    notes = [r for r in caplog_amp.records if "no kernel in this build" in r.getMessage()]
    assert [r.levelno for r in notes] == [logging.INFO]
    assert notes[0].getMessage() == (
        f"custom_white_list entry {name!r} is a Paddle op with no kernel in this build (Paddle defines it "
        "for other backends: GPU-only, XPU-only or fused); it is kept and takes effect where the op runs.")


def test_registered_ops_and_aliases_get_no_kernel_note():
    resolved = oplists.resolve(["elementwise_add", "matmul", "conv2d_xpu"], ["reduce_mean"])
    assert resolved.elsewhere == ()


@cpu_build
def test_the_note_names_the_list_of_each_entry():
    resolved = oplists.resolve(["sync_batch_norm"], ["fused_attention"])
    assert [s.split(" entry ")[0] for s in resolved.elsewhere] == ["custom_white_list", "custom_black_list"]
    assert {"sync_batch_norm"} == resolved.white and {"fused_attention"} == resolved.black


@pytest.mark.parametrize(
    "typo, hint",
    [("sync_batchnorm", "sync_batch_norm"), ("fused_gemm_epilog", "fused_gemm_epilogue"),
     ("fused_attenton", "fused_attention"), ("softmx", "softmax"), ("bilinear_interp_v3", "bilinear_interp_v2")],
)
def test_a_typo_of_any_op_still_fails_with_the_suggestion(typo, hint):
    with pytest.raises(ValueError, match=rf"^Unknown op '{typo}' in custom_white_list\. Did you mean '{hint}'"):
        amp.auto_cast(custom_white_list=["elementwise_add", typo])


def test_a_gpu_only_op_in_both_lists_is_still_an_overlap():
    with pytest.raises(ValueError, match=r"both custom_white_list and custom_black_list: \['sync_batch_norm'\]"):
        amp.auto_cast(custom_white_list=["sync_batch_norm"], custom_black_list=["sync_batch_norm"])


def test_a_config_with_the_suites_lists_validates():
    config = AmpConfig(custom_white_list=["sync_batch_norm", "batch_norm"], custom_black_list=["bilinear_interp_v2"])
    assert "sync_batch_norm" in config.custom_white_list
    with pytest.raises(ValueError, match=r"Unknown op 'sync_bn' in custom_white_list\. Did you mean"):
        AmpConfig(custom_white_list=["sync_bn"])


def test_list_ops_shows_a_gpu_only_op_of_the_config(tmp_path, capsys):
    cfg = tmp_path / "amp.json"
    cfg.write_text(json.dumps({"custom_white_list": ["elementwise_add", "batch_norm", "sync_batch_norm"]}))
    assert main(["--list-ops", "--json", "--config", str(cfg)]) == 0
    ops = json.loads(capsys.readouterr().out)
    assert {"elementwise_add", "batch_norm", "sync_batch_norm"} <= set(ops["white"])
    assert "sync_batch_norm" not in ops["black"]


def test_what_paddle_defines_contains_what_this_build_registers():
    defined = _compat.ops_paddle_defines()
    registered = _compat.ops_this_build_registers() | _compat.ops_in_default_amp_lists()
    assert registered <= defined
    assert _compat.CUDA_ONLY_FLUID_OPS <= defined
    assert len(defined - registered) >= 5, sorted(defined - registered)
