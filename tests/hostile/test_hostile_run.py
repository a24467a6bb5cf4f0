"""`python -m paddle_amp_ext.run` as a hostile user runs it: import order, forks, threads, spawned
children, os.chdir, conflicting flags, fp32_layers with a preprocessing layer, routings undone
out of order (issues 30 and 31)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading

import paddle
import pytest
from helpers import SCALER_STEPS as STEP

import paddle_amp_ext as amp
from paddle_amp_ext.cli import run
from paddle_amp_ext.keep import is_kept_fp32
from paddle_amp_ext.run import _deferred
from paddle_amp_ext.run._importwatch import when_imported

ORIGINAL_CALL = paddle.nn.Layer.__call__
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}



def _run(tmp_path, script, *flags, timeout=240, python=(sys.executable,)):
    (tmp_path / "train.py").write_text(script)
    return subprocess.run([*python, "-m", "paddle_amp_ext.run", *flags, "train.py"], capture_output=True, text=True,
                          timeout=timeout, cwd=tmp_path, env=ENV)


def _summary(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------- import order (issue 30)
@pytest.mark.slow
@pytest.mark.parametrize("first", ["paddle", "paddle_amp_ext"])
def test_the_scripts_first_line_runs_before_paddle_is_imported(tmp_path, first):
    proc = _run(tmp_path, textwrap.dedent(f"""
        import sys
        print("LOADED", sorted(m for m in sys.modules if m == "paddle" or m.startswith("paddle.")))
        import {first}
        import paddle
        import paddle_amp_ext as amp
        from paddle_amp_ext import *  # noqa: F403
        print("ROUTED", paddle.amp.GradScaler.__module__, amp.GradScaler.__module__, GradScaler.__module__)
        """) + STEP, "--no-log", "--json")
    summary = _summary(proc)
    assert "LOADED []" in proc.stdout.splitlines()
    assert "ROUTED paddle_amp_ext.scaler paddle_amp_ext.scaler paddle_amp_ext.scaler" in proc.stdout.splitlines()
    assert [(s["steps"], s["skipped"]) for s in summary["scalers"]] == [(2, 0)]


@pytest.mark.slow
def test_the_console_script_leaves_the_import_order_alone_too(tmp_path):
    launcher = os.path.join(os.path.dirname(sys.executable), "paddle-amp-run")
    if not os.path.exists(launcher):
        pytest.skip(f"no console script at {launcher} (the package is not installed in this interpreter)")
    (tmp_path / "train.py").write_text("import sys\nprint('LOADED', 'paddle' in sys.modules)\nimport paddle\n" + STEP)
    proc = subprocess.run([launcher, "--no-log", "--json", "train.py"], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, env=ENV)
    assert "LOADED False" in proc.stdout.splitlines()
    assert [(s["steps"], s["skipped"]) for s in _summary(proc)["scalers"]] == [(2, 0)]


PNG_SCRIPT = """
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from PIL import Image

print("PIL_BEFORE_PADDLE", "paddle" not in sys.modules)
paths = []
for i in range(4):
    paths.append(f"{i}.png")
    Image.fromarray((np.arange(32 * 32 * 3) % 251).astype("uint8").reshape(32, 32, 3)).save(paths[-1])

import paddle  # noqa: E402


class Pngs(paddle.io.Dataset):
    def __len__(self):
        return len(paths)

    def __getitem__(self, i):
        return np.asarray(Image.open(paths[i]).convert("RGB"), dtype="float32")


with ThreadPoolExecutor(2) as pool:  # decoded in worker threads
    sums = list(pool.map(lambda i: float(Pngs()[i].sum()), range(4)))
batches = [b.shape for b in paddle.io.DataLoader(Pngs(), batch_size=2, use_buffer_reader=True)]
print("DECODED", len(set(sums)) == 1 and sums[0] > 0, [list(s) for s in batches])
"""


@pytest.mark.slow
def test_pngs_decode_in_dataloader_threads_with_the_scripts_import_order(tmp_path):
    # Paddle 2.6.2 loaded before PIL broke this decoding (zlib) where it was measured; the script
    # imports PIL first, and so must run under run (the hard timeout: the failure was a hang).
    proc = _run(tmp_path, PNG_SCRIPT, "--no-log", "--json", timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert "PIL_BEFORE_PADDLE True" in lines
    assert "DECODED True [[2, 32, 32, 3], [2, 32, 32, 3]]" in lines


@pytest.mark.slow
def test_a_bad_op_in_the_config_stops_the_script_at_its_first_paddle_import(tmp_path):
    (tmp_path / "amp.toml").write_text('custom_white_list = ["softmx"]\n')
    with pytest.raises(ValueError) as plain:
        amp.AmpConfig.from_file(tmp_path / "amp.toml")
    proc = _run(tmp_path, "print('BEFORE')\nimport paddle\nprint('AFTER')\n", "--no-log", "--config",
                str(tmp_path / "amp.toml"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["BEFORE"]
    assert f"python -m paddle_amp_ext.run: error: {plain.value}" in proc.stderr.splitlines()


@pytest.mark.slow
def test_everything_else_in_the_config_is_refused_before_the_script_starts_without_paddle(tmp_path):
    (tmp_path / "amp.toml").write_text('dtype = "float8"\ncustom_white_list = ["softmax"]\n')
    proc = _run(tmp_path, "print('BEFORE')\n", "--no-log", "--config", "amp.toml", python=(sys.executable, "-X",
                                                                                            "importtime"))
    assert proc.returncode == 2 and proc.stdout == ""
    assert "python -m paddle_amp_ext.run: error: Config file 'amp.toml': dtype must be one of" in proc.stderr
    imported = [line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time")]
    assert "paddle_amp_ext.cli.run" in imported and "paddle" not in imported


def test_the_run_command_line_is_recognised_with_interpreter_options():
    named = _deferred._module_of
    assert named(["python", "-m", "paddle_amp_ext.run", "x.py"]) == "paddle_amp_ext.run"
    assert named(["python", "-X", "importtime", "-W", "ignore", "-m", "paddle_amp_ext.run"]) == "paddle_amp_ext.run"
    assert named(["python", "-mpaddle_amp_ext.run"]) == "paddle_amp_ext.run"
    assert named(["python", "-u", "script.py", "-m", "paddle_amp_ext.run"]) is None
    assert named(["python", "-m"]) is None and named(["python"]) is None


def test_the_import_watch_calls_back_once_after_the_module_ran_and_its_errors_reach_the_import(tmp_path,
                                                                                               monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "watched_a.py").write_text("VALUE = 7\n")
    (tmp_path / "watched_b.py").write_text("VALUE = 8\n")
    seen = []
    with when_imported("watched_a", lambda module: seen.append(module.VALUE)):
        import watched_a  # noqa: F401
        del sys.modules["watched_a"]
        import watched_a  # noqa: F401,F811  # a second load: no second call
    assert seen == [7] and type(watched_a.__loader__).__name__ == "SourceFileLoader"
    with when_imported("watched_a", lambda module: seen.append("again")):  # loaded: at once
        pass
    assert seen == [7, "again"]

    class Stop(BaseException):
        pass

    def stop(module):
        raise Stop(module.VALUE)

    with when_imported("watched_b", stop):
        with pytest.raises(Stop, match="8"):
            import watched_b  # noqa: F401
    assert "watched_b" not in sys.modules
    assert not [f for f in sys.meta_path if type(f).__name__ == "_Finder"], "the watch leaves sys.meta_path"


# --------------------------------------------------------------------------- processes and threads (issue 31)
@pytest.mark.slow
def test_a_forked_child_prints_no_second_summary(tmp_path):
    fork = 'pid = os.fork()\nif pid:\n    os.waitpid(pid, 0)\nprint("END", "parent" if pid else "child", flush=True)\n'
    proc = _run(tmp_path, "import os\nimport paddle\n" + STEP + fork, "--json", "--logdir", "runs")
    summary = _summary(proc)
    assert sorted(line for line in proc.stdout.splitlines() if line.startswith("END")) == ["END child", "END parent"]
    assert sum(line.startswith("{") for line in proc.stdout.splitlines()) == 1
    assert [(s["steps"], s["skipped"]) for s in summary["scalers"]] == [(2, 0)]


def test_scalers_built_in_threads_are_routed_and_counted(tmp_path, capfd):
    (tmp_path / "train.py").write_text("import threading\nimport paddle\n\ndef train():\n" +
                                       textwrap.indent(STEP, "    ") +
                                       "\nworkers = [threading.Thread(target=train) for _ in range(2)]\n"
                                       "[w.start() for w in workers]\n[w.join() for w in workers]\n")
    assert run.main(["--no-log", "--json", str(tmp_path / "train.py")]) == 0
    summary = json.loads(capfd.readouterr().out.strip().splitlines()[-1])  # on fd 1: the original stdout
    assert [(s["steps"], s["skipped"]) for s in summary["scalers"]] == [(2, 0), (2, 0)]
    assert summary["child_processes"] == 0


@pytest.mark.slow
def test_a_spawned_child_that_builds_the_scaler_is_named_in_a_warning(tmp_path):
    main = textwrap.dedent("""
        if __name__ == "__main__":
            child = multiprocessing.get_context("spawn").Process(target=train)
            child.start()
            child.join()
            print("JOINED", child.exitcode, flush=True)
        """)
    train = "def train():\n" + textwrap.indent(STEP, "    ") + \
        '    print("CHILD", paddle.amp.GradScaler.__module__, flush=True)\n'
    proc = _run(tmp_path, "import multiprocessing\nimport paddle\n\n" + train + main, "--no-log")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "CHILD paddle.amp.grad_scaler" in proc.stdout and "JOINED 0" in proc.stdout
    assert "  The script built no paddle.amp.GradScaler." in proc.stderr.splitlines()
    assert ("python -m paddle_amp_ext.run: warning: the script started 1 child process(es) with the spawn or "
            "forkserver start method and built no GradScaler in this one: a spawned child is a new interpreter, not "
            "routed (fork children are)") in proc.stderr


@pytest.mark.slow
def test_a_script_that_changes_directory_keeps_its_records_under_the_logdir(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    proc = _run(tmp_path, "import os\nimport paddle\nos.chdir('elsewhere')\n" + STEP, "--json", "--logdir", "runs")
    (scaler,) = _summary(proc)["scalers"]
    assert os.path.dirname(scaler["logdir"]) == str(tmp_path / "runs")
    assert list((tmp_path / "runs").glob("*/vdlrecords.*")) and not (tmp_path / "elsewhere" / "runs").exists()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "auto"])
def test_emulate_and_a_config_dtype_that_disagree_are_a_usage_error(tmp_path, capsys, dtype):
    (tmp_path / "amp.toml").write_text(f'dtype = "{dtype}"\n')
    (tmp_path / "train.py").write_text("print('RAN')\n")
    code = run.main(["--no-log", "--emulate", "float16", "--config", str(tmp_path / "amp.toml"),
                     str(tmp_path / "train.py")])
    out = capsys.readouterr()
    if dtype != "bfloat16":  # the same dtype, or "auto": the choice --emulate makes
        assert code == 0 and "RAN" in out.out
        return
    assert code == 2 and out.out == ""
    assert out.err == (f"python -m paddle_amp_ext.run: error: --emulate float16 conflicts with dtype = 'bfloat16' in "
                       f"the config {str(tmp_path / 'amp.toml')!r}: rehearse the dtype the config trains in (--emulate "
                       "bfloat16), or change the config's dtype.\n")


# --------------------------------------------------------------------------- fp32_layers (issue 31)
def _net():
    return paddle.nn.Sequential(paddle.nn.Linear(2, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 2))


def _kept(model):
    return [name for name, sub in model.named_sublayers() if is_kept_fp32(sub)]


def test_fp32_layers_pass_a_preprocessing_layer_called_before_the_model(tmp_path, capsys):
    (tmp_path / "amp.toml").write_text('fp32_layers = ["2"]\n')
    (tmp_path / "train.py").write_text(textwrap.dedent("""
        import paddle
        from paddle_amp_ext.keep import is_kept_fp32
        pre = paddle.nn.LayerNorm(2)
        model = paddle.nn.Sequential(paddle.nn.Linear(2, 4), paddle.nn.ReLU(), paddle.nn.Linear(4, 2))
        model(pre(paddle.ones([1, 2])))
        print("KEPT", [n for n, s in model.named_sublayers() if is_kept_fp32(s)], is_kept_fp32(pre))
        """))
    assert run.main(["--no-log", "--config", str(tmp_path / "amp.toml"), str(tmp_path / "train.py")]) == 0
    assert "KEPT ['2'] False" in capsys.readouterr().out.splitlines()
    assert paddle.nn.Layer.__call__ is ORIGINAL_CALL


def test_fp32_layers_no_layer_has_are_a_warning_not_a_crash(caplog):
    model = _net()
    with caplog.at_level(logging.WARNING, logger="paddle_amp_ext"):
        with amp.routed(amp.AmpConfig(fp32_layers=["2", "head"])):
            model(paddle.ones([1, 2]))
        with amp.routed(amp.AmpConfig(fp32_layers=["tail"])):
            pass
    assert _kept(model) == [] and paddle.nn.Layer.__call__ is ORIGINAL_CALL
    assert [r.getMessage() for r in caplog.records if "fp32_layers" in r.getMessage()] == [
        "The AMP config's fp32_layers ['2', 'head'] were kept in float32 in no model: no layer the script called has "
        "them all (the first called layer, Sequential: No sublayer named 'head' (by path or class) in fp32 layers.). "
        "Fix fp32_layers (doctor --advise names sublayers of the script's first model call).",
        "The AMP config's fp32_layers ['tail'] were kept in float32 in no model: no layer the script called has them "
        "all (the script called no layer). Fix fp32_layers (doctor --advise names sublayers of the script's first "
        "model call).",
    ]


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2), (0, 2, 1)])
def test_fp32_layers_routings_undone_in_any_order_restore_layer_call(order):
    routings = [amp.route(amp.AmpConfig(fp32_layers=[name])) for name in ("0", "1", "2")]
    assert paddle.nn.Layer.__call__ is not ORIGINAL_CALL
    model = _net()
    model(paddle.ones([1, 2]))
    assert _kept(model) == ["0", "1", "2"], "each waiting routing keeps its names in the first model"
    for i in order:
        routings[i].undo()
    assert paddle.nn.Layer.__call__ is ORIGINAL_CALL


def test_fp32_layers_under_a_wrapper_put_on_top_stand_aside_and_restore_later():
    routing = amp.route(amp.AmpConfig(fp32_layers=["2"]))
    ours = paddle.nn.Layer.__call__

    def on_top(layer, *args, **kwargs):
        return ours(layer, *args, **kwargs)

    paddle.nn.Layer.__call__ = on_top  # as the doctor would, for its run
    routing.undo()
    assert paddle.nn.Layer.__call__ is on_top, "what wrapped it since is left in place"
    paddle.nn.Layer.__call__ = ours  # the doctor's run ends
    with amp.routed(amp.AmpConfig(fp32_layers=["2"])):
        assert paddle.nn.Layer.__call__ is ours, "the wrapper still in place is used again"
        model = _net()
        model(paddle.ones([1, 2]))
    assert _kept(model) == ["2"] and paddle.nn.Layer.__call__ is ORIGINAL_CALL


def test_fp32_layers_routings_in_threads_restore_layer_call():
    barrier, errors = threading.Barrier(4), []

    def worker(i):
        try:
            routing = amp.route(amp.AmpConfig(fp32_layers=[str(i % 3)]))
            barrier.wait(timeout=30)
            _net()(paddle.ones([1, 2]))
            barrier.wait(timeout=30)
            if i % 2:
                barrier.wait(timeout=30)
                routing.undo()
            else:
                routing.undo()
                barrier.wait(timeout=30)
        except BaseException as exc:  # noqa: BLE001  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    [t.start() for t in threads]
    [t.join(timeout=60) for t in threads]
    assert errors == [] and paddle.nn.Layer.__call__ is ORIGINAL_CALL
