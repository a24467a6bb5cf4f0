"""`python -m paddle_amp_ext.check --list-ops`: the effective lists after custom lists."""

from __future__ import annotations

import json

from paddle_amp_ext import _compat
from paddle_amp_ext.check import main


def _lists(text: str) -> dict:
    out = {}
    for line in text.splitlines():
        for kind in ("white", "black"):
            if line.startswith(kind + " ("):
                out[kind] = set(line.split(": ", 1)[1].split(", "))
    return out


def test_list_ops_defaults(capsys):
    assert main(["--list-ops"]) == 0
    lists = _lists(capsys.readouterr().out)
    white, black = _compat.default_op_lists("float16", "O1")
    assert lists == {"white": set(white), "black": set(black)}


def test_list_ops_with_config_file(tmp_path, capsys):
    cfg = tmp_path / "amp.json"
    cfg.write_text(json.dumps({"custom_white_list": ["softmax"], "custom_black_list": ["matmul"]}))
    assert main(["--list-ops", "--config", str(cfg)]) == 0
    lists = _lists(capsys.readouterr().out)
    assert "softmax" in lists["white"] and "softmax" not in lists["black"]
    assert {"matmul", "matmul_v2"} <= lists["black"]


def test_list_ops_bad_config_is_a_usage_error(tmp_path, capsys):
    cfg = tmp_path / "amp.toml"
    cfg.write_text("custom_white_list = ['softmx']\n")
    assert main(["--list-ops", "--config", str(cfg)]) == 2
    assert "Did you mean 'softmax'" in capsys.readouterr().err


def test_list_ops_bf16_o2(capsys):
    assert main(["--list-ops", "--dtype", "bfloat16", "--level", "O2"]) == 0
    lists = _lists(capsys.readouterr().out)
    white, black = _compat.default_op_lists("bfloat16", "O2")
    assert lists["black"] == set(black)
