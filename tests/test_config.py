"""AmpConfig: frozen, validated once, round-trips through dict, JSON and TOML."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path

import pytest

import paddle_amp_ext as amp
from paddle_amp_ext import AmpConfig, configfile


def full_config() -> AmpConfig:
    return AmpConfig(
        enable=True, dtype="bfloat16", level="O2", custom_white_list=["matmul"],
        custom_black_list=["softmax", "layer_norm"], fp32_layers=["head"],
        init_loss_scaling=2.0**14, incr_ratio=3.0, decr_ratio=0.25, incr_every_n_steps=100,
        decr_every_n_nan_or_inf=2, use_dynamic_loss_scaling=True, min_loss_scaling=2.0,
        max_loss_scaling=2.0**20, hysteresis="cumulative", max_consecutive_skips=7, on_collapse="raise",
    )


def test_dict_round_trip_is_exact():
    cfg = full_config()
    data = cfg.to_dict()
    assert data["custom_black_list"] == ["softmax", "layer_norm"]
    assert AmpConfig.from_dict(data) == cfg
    assert AmpConfig.from_dict(data).to_dict() == data


def test_json_and_toml_files_round_trip(tmp_path):
    cfg = full_config()
    (tmp_path / "amp.json").write_text(cfg.to_json())
    (tmp_path / "amp.toml").write_text(cfg.to_toml())
    assert AmpConfig.from_file(tmp_path / "amp.json") == cfg
    assert AmpConfig.from_file(tmp_path / "amp.toml") == cfg
    (tmp_path / "table.toml").write_text("[amp]\ndtype = 'auto'\ncustom_black_list = ['softmax']\n")
    assert AmpConfig.from_file(tmp_path / "table.toml") == AmpConfig(dtype="auto", custom_black_list=["softmax"])


def test_frozen_and_normalized():
    cfg = AmpConfig(dtype="FLOAT16", level="o2", custom_white_list=["matmul"])
    assert (cfg.dtype, cfg.level, cfg.custom_white_list) == ("float16", "O2", ("matmul",))
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.dtype = "bfloat16"
    assert cfg.replace(dtype="auto").dtype == "auto"


@pytest.mark.parametrize(
    "kwargs, error, message",
    [
        (dict(dtype="fp16"), ValueError, r"dtype must be one of .*Received: dtype='fp16' \(of type str\)"),
        (dict(dtype="bfloat61"), ValueError, r"Did you mean 'bfloat16'\?"),
        (dict(level="O3"), ValueError, r"level must be one of \('O1', 'O2'\)"),
        (dict(init_loss_scaling=0), ValueError, r"init_loss_scaling must be > 0"),
        (dict(init_loss_scaling=-8.0), ValueError, r"init_loss_scaling must be > 0"),
        (dict(incr_ratio=1.0), ValueError, r"incr_ratio must be > 1.0"),
        (dict(decr_ratio=1.5), ValueError, r"decr_ratio must be in \(0, 1\)"),
        (dict(incr_every_n_steps=0), ValueError, r"incr_every_n_steps must be >= 1"),
        (dict(incr_every_n_steps=2.5), TypeError, r"incr_every_n_steps must be an int"),
        (dict(min_loss_scaling=8.0, max_loss_scaling=4.0), ValueError, r"must not exceed max_loss_scaling"),
        (dict(max_consecutive_skips=0), ValueError, r"max_consecutive_skips must be >= 1 or None"),
        (dict(enable="yes"), TypeError, r"enable must be True or False"),
        (dict(custom_white_list="softmax"), TypeError, r"custom_white_list must be an iterable of op names"),
        (dict(custom_black_list=[1]), TypeError, r"custom_black_list must contain only str"),
        (dict(custom_white_list=["softmx"]), ValueError, r"Unknown op 'softmx' in custom_white_list\. Did you mean 'softmax'"),
        (dict(custom_white_list=["softmax"], custom_black_list=["softmax"]), ValueError, r"both .*\['softmax'\]"),
        (dict(hysteresis="sometimes"), ValueError, r"hysteresis must be one of"),
        (dict(on_collapse="ignore"), ValueError, r"on_collapse must be one of"),
    ],
)
def test_bad_values_are_named(kwargs, error, message):
    with pytest.raises(error, match=message):
        AmpConfig(**kwargs)


def test_unknown_key_suggests_the_real_one():
    with pytest.raises(ValueError, match=r"Unknown AmpConfig key 'init_loss_scale'\. Did you mean 'init_loss_scaling'\?"):
        AmpConfig.from_dict({"init_loss_scale": 1024})


def test_bad_files_name_the_file(tmp_path):
    bad_toml = tmp_path / "bad.toml"
    bad_toml.write_text("dtype = \n")
    with pytest.raises(ValueError, match=r"bad\.toml.* is not valid toml"):
        AmpConfig.from_file(bad_toml)
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{dtype: 1}")
    with pytest.raises(ValueError, match=r"bad\.json.* is not valid json"):
        AmpConfig.from_file(bad_json)
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({"custom_black_list": ["layernorm"]}))
    with pytest.raises(ValueError, match=r"typo\.json.*Unknown op 'layernorm'.*'layer_norm'"):
        AmpConfig.from_file(typo)
    yaml = tmp_path / "amp.yaml"
    yaml.write_text("dtype: auto")
    with pytest.raises(ValueError, match=r"use \.toml or \.json"):
        AmpConfig.from_file(yaml)
    with pytest.raises(FileNotFoundError):
        AmpConfig.from_file(tmp_path / "missing.toml")


def test_config_drives_auto_cast_and_scaler():
    cfg = AmpConfig(init_loss_scaling=2.0**10, incr_every_n_steps=5, custom_black_list=["matmul"])
    scaler = amp.GradScaler(config=cfg)
    assert isinstance(scaler, amp.GradScaler)
    assert scaler.get_incr_every_n_steps() == 5
    assert scaler.state_dict()["scale"][0] == 1024.0
    from paddle_amp_ext import _compat

    with amp.auto_cast(config=cfg):
        white, black = _compat.tracer_op_lists()
    assert {"matmul", "matmul_v2"} <= black
    assert "matmul_v2" not in white
    with pytest.raises(TypeError, match=r"Pass either config= or \['dtype'\]"):
        amp.auto_cast(config=cfg, dtype="bfloat16")


@pytest.mark.parametrize("kind", ["/dev/zero", "a link to /dev/zero", "a named pipe", "a directory"])
def test_from_file_refuses_what_is_not_a_regular_file_before_reading(tmp_path, kind):
    """/dev/zero read whole was a MemoryError; a named pipe would block in open()."""
    path = {"/dev/zero": Path("/dev/zero"), "a directory": tmp_path}.get(kind, tmp_path / "zero.toml")
    if kind == "a link to /dev/zero":
        path.symlink_to("/dev/zero")
    if kind == "a named pipe":
        os.mkfifo(path)
    what = {"a directory": "a directory", "a named pipe": "a named pipe"}.get(kind, "a character device")
    with pytest.raises(ValueError, match=rf"^Config file '{re.escape(str(path))}' is {what}, not a regular file: "
                                         r"give the path of a \.toml or \.json file\.$"):
        AmpConfig.from_file(path)


def test_from_file_refuses_a_file_over_one_mib_naming_its_size_and_the_limit(tmp_path):
    huge = tmp_path / "huge.toml"
    with open(huge, "wb") as handle:
        handle.truncate(2 << 30)  # sparse: 2 GiB that read whole was a MemoryError
    with pytest.raises(ValueError, match=rf"^Config file '{re.escape(str(huge))}' is 2\.0 GiB \(2147483648 bytes\); "
                                         r"a config file may be at most 1\.0 MiB \(1048576 bytes\): is this the "
                                         r"right file\?$"):
        AmpConfig.from_file(huge)
    limit = tmp_path / "limit.toml"
    limit.write_bytes(b"dtype = 'bfloat16'\n" + b"#" * (configfile.MAX_BYTES - 20) + b"\n")
    assert limit.stat().st_size == configfile.MAX_BYTES
    assert AmpConfig.from_file(limit).dtype == "bfloat16", "exactly the limit is read"
