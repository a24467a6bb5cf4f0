"""`python -m paddle_amp_ext.run` tried as a hostile user would: fork children, threads
that outlive the script's body, the script's own guard, the start-up `python script.py` makes,
a bad config op imported in a thread, `--json` with a rebound or closed stdout, DataLoader
workers, a removed import watch, `-m`, folders and `/dev/null`. Each in a fresh interpreter with
a hard timeout."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import textwrap

import paddle
import pytest
from helpers import SCALER_STEPS

import paddle_amp_ext as amp
from paddle_amp_ext.guard import guard_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
RUN = [sys.executable, "-m", "paddle_amp_ext.run"]
PREFIX = "python -m paddle_amp_ext.run"

STEP = SCALER_STEPS + 'print("BUILT", type(scaler).__module__, flush=True)\n'


def _run(tmp_path, script, *flags, timeout=240, name="train.py", command=RUN):
    (tmp_path / name).write_text(textwrap.dedent(script))
    return subprocess.run([*command, *flags, name], capture_output=True, text=True, timeout=timeout, cwd=tmp_path,
                          env=ENV)


def _summary(proc):
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


# --------------------------------------------------------------------------- fork children
@pytest.mark.slow
def test_a_fork_child_is_routed_counted_as_forked_and_keeps_its_records(tmp_path):
    script = "import multiprocessing\nimport paddle\n\ndef train():\n" + textwrap.indent(STEP, "    ") + textwrap.dedent("""
        if __name__ == "__main__":
            child = multiprocessing.get_context("fork").Process(target=train)
            child.start()
            child.join()
            print("JOINED", child.exitcode, flush=True)
        """)
    proc = _run(tmp_path, script, "--json", "--logdir", "runs")
    summary = _summary(proc)
    assert "BUILT paddle_amp_ext.scaler" in proc.stdout.splitlines(), "the fork child inherits the routing"
    assert "JOINED 0" in proc.stdout.splitlines()
    assert (summary["child_processes"], summary["forked_child_processes"], summary["unrouted_child_processes"],
            summary["scalers"]) == (1, 1, 0, [])
    assert "warning" not in proc.stderr, proc.stderr[-3000:]
    (record,) = glob.glob(str(tmp_path / "runs" / "*" / "vdlrecords.*"))
    LogReader = pytest.importorskip("visualdl").LogReader  # noqa: N806
    losses = LogReader(file_path=record).get_data("scalar", "amp/loss")
    assert [point.id for point in losses] == [0, 1], "the child's hook was closed as multiprocessing ended it"


# --------------------------------------------------------------------------- threads outliving the body
@pytest.mark.slow
def test_a_thread_that_outlives_the_scripts_body_is_routed_and_counted(tmp_path):
    script = "import threading\nimport time\nimport paddle\n\ndef train():\n    time.sleep(1.0)\n" + \
        textwrap.indent(STEP, "    ") + "\nthreading.Thread(target=train).start()\nprint('BODY DONE', flush=True)\n"
    proc = _run(tmp_path, script, "--json", "--no-log")
    summary = _summary(proc)
    lines = proc.stdout.splitlines()
    assert lines.index("BODY DONE") < lines.index("BUILT paddle_amp_ext.scaler")
    assert [(s["steps"], s["skipped"]) for s in summary["scalers"]] == [(2, 0)]


# --------------------------------------------------------------------------- the script's own guard
NAN_STEPS = """
import paddle
import paddle_amp_ext as amp

model = paddle.nn.Linear(2, 2)
opt = paddle.optimizer.SGD(parameters=model.parameters())
guard = amp.guard_optimizer(opt, max_consecutive_skips=2, on_collapse="raise")
for step in range(4):
    loss = (model(paddle.ones([1, 2])) * float("nan")).sum()
    loss.backward()
    try:
        opt.step()
    except amp.AmpOverflowError:
        print("RAISED AT", step, guard.skipped_steps, flush=True)
        break
    opt.clear_grad()
"""


@pytest.mark.slow
def test_the_scripts_own_guard_settings_win_under_run(tmp_path):
    plain = subprocess.run([sys.executable, "-c", textwrap.dedent(NAN_STEPS)], capture_output=True, text=True,
                           timeout=240, cwd=tmp_path, env=ENV)
    assert plain.returncode == 0 and "RAISED AT 1 2" in plain.stdout.splitlines(), plain.stderr[-3000:]
    proc = _run(tmp_path, NAN_STEPS, "--json", "--no-log")
    summary = _summary(proc)
    assert "RAISED AT 1 2" in proc.stdout.splitlines()
    (counted,) = summary["guards"]  # the routing's hooks stayed on the guard the script took over
    assert counted["steps"] == counted["skipped"] >= 1


def _optimizer():
    return paddle.optimizer.SGD(parameters=paddle.nn.Linear(2, 2).parameters())


def test_the_routings_guard_takes_the_explicit_settings_and_keeps_its_hooks():
    seen = []
    with amp.routed(on_guard=lambda guard: guard.add_hook(seen.append)) as routing:
        opt = _optimizer()
        silent = guard_of(opt)
        extra = []
        guard = amp.guard_optimizer(opt, [extra.append], max_consecutive_skips=3, on_collapse="raise")
        assert guard is silent and routing.guards == [guard]
        assert guard.hooks == (seen.append, extra.append)
        assert amp.guard_optimizer(opt, max_consecutive_skips=3, on_collapse="raise") is guard
        with pytest.raises(ValueError, match=r"already guarded with max_consecutive_skips=3, on_collapse='raise'; "
                                             r"received max_consecutive_skips=None, on_collapse='warn'"):
            amp.guard_optimizer(opt)
    guard.remove()


@pytest.mark.parametrize("settings, message", [
    ({"max_consecutive_skips": 0}, r"max_consecutive_skips must be >= 1 or None. Received: max_consecutive_skips=0"),
    ({"on_collapse": "explode"}, r"on_collapse must be one of"),
    ({"max_consecutive_skips": 2.5}, r"max_consecutive_skips"),
])
def test_bad_explicit_settings_leave_the_routings_guard_as_it_was(settings, message):
    with amp.routed():
        opt = _optimizer()
        with pytest.raises((ValueError, TypeError), match=message):
            amp.guard_optimizer(opt, **settings)
        silent = guard_of(opt)
        assert silent._settings == (None, "warn") and silent._defer, "unchanged by the refused call"
        assert amp.guard_optimizer(opt, max_consecutive_skips=1) is silent
    silent.remove()


def test_without_routing_a_second_guard_with_other_settings_is_still_refused():
    opt = _optimizer()
    with amp.guard_optimizer(opt, max_consecutive_skips=2):
        with pytest.raises(ValueError, match="already guarded with max_consecutive_skips=2"):
            amp.guard_optimizer(opt, max_consecutive_skips=5, on_collapse="raise")


# --------------------------------------------------------------------------- python script.py's start-up
PROBE = """
import sys
main = sys.modules["__main__"]
loader = main.__loader__
print("PROBE", repr((__file__, sys.argv, sys.path, __package__, __spec__ is None, type(loader).__name__,
                     getattr(loader, "path", None), sorted(vars(main)))))
"""


def _probe(proc):
    (line,) = [line for line in proc.stdout.splitlines() if line.startswith("PROBE ")]
    return line


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["run", "doctor"])
def test_the_start_up_is_python_scripts_symlinks_and_relative_paths_included(tmp_path, tool):
    (tmp_path / "real").mkdir()
    (tmp_path / "links").mkdir()
    (tmp_path / "real" / "probe.py").write_text(PROBE)
    (tmp_path / "links" / "probe.py").symlink_to(tmp_path / "real" / "probe.py")
    command = [*RUN, "--no-log"] if tool == "run" else [sys.executable, "-m", "paddle_amp_ext.doctor"]
    for path, cwd in (("links/probe.py", tmp_path), ("probe.py", tmp_path / "real"), ("../links/probe.py",
                                                                                      tmp_path / "real")):
        python = subprocess.run([sys.executable, path, "x"], capture_output=True, text=True, timeout=60, cwd=cwd,
                                env=ENV)
        ours = subprocess.run([*command, path, "x"], capture_output=True, text=True, timeout=240, cwd=cwd, env=ENV)
        assert ours.returncode == 0, ours.stderr[-3000:]
        assert _probe(ours) == _probe(python), path
    assert repr(str(tmp_path / "real")) in _probe(python), "the link's target's folder, as CPython's"


# --------------------------------------------------------------------------- a bad op imported in a thread
@pytest.mark.slow
@pytest.mark.parametrize("then", ["import paddle\nprint('AFTER')\n", "print('NEVER IMPORTS')\n"])
def test_a_bad_config_op_met_in_a_thread_exits_2_with_the_configs_message(tmp_path, then):
    (tmp_path / "amp.toml").write_text('custom_white_list = ["softmx"]\n')
    with pytest.raises(ValueError) as plain:
        amp.AmpConfig.from_file(tmp_path / "amp.toml")
    script = "import threading\n\ndef load():\n    import paddle  # noqa: F401\n\n" \
        "worker = threading.Thread(target=load)\nworker.start()\nworker.join()\n" + then
    proc = _run(tmp_path, script, "--no-log", "--config", str(tmp_path / "amp.toml"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"{PREFIX}: error: {plain.value}" in proc.stderr.splitlines()
    assert "AttributeError" not in proc.stderr and "AFTER" not in proc.stdout


# --------------------------------------------------------------------------- --json and the script's stdout
@pytest.mark.slow
def test_json_goes_on_its_own_line_to_the_original_stdout_whatever_the_script_did(tmp_path):
    proc = _run(tmp_path, "print('progress 100%', end='')\n", "--json", "--no-log")
    lines = proc.stdout.splitlines()
    assert lines[0] == "progress 100%" and json.loads(lines[1])["exit_code"] == 0 and len(lines) == 2

    rebound = "import sys\nprint('before')\nsys.stdout = open('out.txt', 'w')\nprint('to the file', end='')\n"
    proc = _run(tmp_path, rebound, "--json", "--no-log")
    assert proc.stdout.splitlines()[0] == "before" and _summary(proc)["script"] == "train.py"
    assert (tmp_path / "out.txt").read_text() == "to the file"

    proc = _run(tmp_path, "import sys\nprint('bye')\nsys.stdout.close()\n", "--json", "--no-log")
    assert proc.stdout.splitlines()[0] == "bye" and _summary(proc)["exit_code"] == 0

    with open(tmp_path / "captured.txt", "w") as out:  # a regular file: its last byte is read back
        (tmp_path / "train.py").write_text("print('no newline', end='')\n")
        done = subprocess.run([*RUN, "--json", "--no-log", "train.py"], stdout=out, stderr=subprocess.PIPE, text=True,
                              timeout=240, cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    first, second = (tmp_path / "captured.txt").read_text().splitlines()
    assert first == "no newline" and json.loads(second)["exit_code"] == 0


FD1_WRITERS = {
    "os.write": "import os\nos.write(1, b'raw bytes')\n",
    "a forked child": "import os, sys\npid = os.fork()\nif pid == 0:\n    sys.stdout.write('from the child')\n"
                      "    sys.stdout.flush()\n    os._exit(0)\nos.waitpid(pid, 0)\n",
    "a stream of its own on fd 1": "import sys\nsys.stdout = open(1, 'w', closefd=False)\n"
                                   "print('own stream', end='')\n",
    "print, then os.write": "import os\nprint('line', flush=True)\nos.write(1, b'tail')\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("script", list(FD1_WRITERS.values()), ids=list(FD1_WRITERS))
def test_json_is_the_last_line_whatever_wrote_to_fd_1_without_a_newline(tmp_path, script):
    proc = _run(tmp_path, script, "--json", "--no-log")
    assert proc.returncode == 0, proc.stderr[-3000:]
    *before, last = proc.stdout.splitlines()
    assert json.loads(last)["exit_code"] == 0 and before and before[-1] in (
        "raw bytes", "from the child", "own stream", "tail")


@pytest.mark.slow
def test_json_after_a_newline_follows_an_empty_line_on_a_pipe_and_none_in_a_file(tmp_path):
    proc = _run(tmp_path, "print('done')\n", "--json", "--no-log")
    first, empty, last = proc.stdout.splitlines()
    assert (first, empty, json.loads(last)["exit_code"]) == ("done", "", 0)
    with open(tmp_path / "captured.txt", "w") as out:
        done = subprocess.run([*RUN, "--json", "--no-log", "train.py"], stdout=out, stderr=subprocess.PIPE, text=True,
                              timeout=240, cwd=tmp_path, env=ENV)
    assert done.returncode == 0, done.stderr[-3000:]
    first, last = (tmp_path / "captured.txt").read_text().splitlines()
    assert first == "done" and json.loads(last)["exit_code"] == 0


# --------------------------------------------------------------------------- DataLoader workers
DATALOADER_EVAL = """
import numpy as np
import paddle


class Data(paddle.io.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full([4], i, dtype="float32")


model = paddle.nn.Linear(4, 1)
model.eval()
with paddle.no_grad():
    total = sum(float(model(x).sum()) for x in paddle.io.DataLoader(Data(), batch_size=2, num_workers=2))
print("EVALUATED", np.isfinite(total), flush=True)
"""


@pytest.mark.slow
def test_an_evaluation_script_with_dataloader_workers_gets_no_warning(tmp_path):
    proc = _run(tmp_path, DATALOADER_EVAL, "--no-log", "--json", timeout=300)
    summary = _summary(proc)
    assert "EVALUATED True" in proc.stdout.splitlines()
    assert (summary["child_processes"], summary["forked_child_processes"], summary["unrouted_child_processes"]) == \
        (2, 0, 0), "DataLoader workers: neither routed training nor unrouted"
    assert "warning" not in proc.stderr, proc.stderr[-3000:]


# --------------------------------------------------------------------------- the import watch removed
@pytest.mark.slow
def test_a_script_that_removes_the_import_watch_is_told_the_routing_never_started(tmp_path):
    script = "import sys\nsys.meta_path[:] = [f for f in sys.meta_path if 'importwatch' not in type(f).__module__]\n" \
        "import paddle\n" + STEP
    proc = _run(tmp_path, script, "--no-log")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "BUILT paddle.amp.grad_scaler" in proc.stdout.splitlines()
    assert (f"{PREFIX}: warning: the routing never started: the script imported paddle with run's import watch gone "
            "from sys.meta_path") in proc.stderr


# --------------------------------------------------------------------------- unclear messages
@pytest.mark.slow
def test_dash_m_runs_a_module_as_python_does(tmp_path):
    (tmp_path / "data.json").write_text('{"b": 1, "a": [1, 2]}')
    proc = subprocess.run([*RUN, "--no-log", "--json", "-m", "json.tool", "--sort-keys", "--compact", "data.json"],
                          capture_output=True, text=True, timeout=240, cwd=tmp_path, env=ENV)
    assert proc.stdout.splitlines()[0] == '{"a":[1,2],"b":1}'
    assert _summary(proc)["script"] == "-m json.tool"
    (tmp_path / "mymod.py").write_text(PROBE)
    python = subprocess.run([sys.executable, "-m", "mymod", "y"], capture_output=True, text=True, timeout=60,
                            cwd=tmp_path, env=ENV)
    ours = subprocess.run([*RUN, "--no-log", "-m", "mymod", "y"], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, env=ENV)
    assert _probe(ours) == _probe(python)
    missing = subprocess.run([*RUN, "-mnosuchmodule_xyz"], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                             env=ENV)
    assert missing.returncode == 2 and missing.stderr == (
        f"{PREFIX}: error: No module named 'nosuchmodule_xyz' (for -m nosuchmodule_xyz): check the name and "
        "sys.path.\n")
    bare = subprocess.run([*RUN, "--no-log", "-m"], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=ENV)
    assert bare.returncode == 2 and bare.stderr == f"{PREFIX}: error: -m needs a module name, as python's: -m MODULE " \
        "[args...]\n"


@pytest.mark.slow
def test_a_folder_with_main_runs_and_one_without_is_named(tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__main__.py").write_text(PROBE)
    python = subprocess.run([sys.executable, "app", "z"], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                            env=ENV)
    ours = subprocess.run([*RUN, "--no-log", "app", "z"], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                          env=ENV)
    assert ours.returncode == 0 and _probe(ours) == _probe(python)
    (tmp_path / "empty").mkdir()
    proc = subprocess.run([*RUN, "empty"], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=ENV)
    assert proc.returncode == 2 and proc.stderr == (
        f"{PREFIX}: error: 'empty' is a folder without a __main__.py: nothing to run (python runs a folder's "
        "__main__.py; pass the script inside it).\n")


@pytest.mark.slow
def test_dev_null_runs_as_an_empty_script_as_python_does(tmp_path):
    assert subprocess.run([sys.executable, os.devnull], timeout=60).returncode == 0
    proc = subprocess.run([*RUN, "--no-log", "--json", os.devnull], capture_output=True, text=True, timeout=240,
                          cwd=tmp_path, env=ENV)
    assert _summary(proc)["script"] == os.devnull and _summary(proc)["scalers"] == []
    missing = subprocess.run([*RUN, "nowhere.py"], capture_output=True, text=True, timeout=240, cwd=tmp_path,
                             env=ENV)
    assert missing.returncode == 2 and missing.stderr == f"{PREFIX}: error: No such script: 'nowhere.py'\n"


def test_a_failed_import_watch_fails_every_later_import_of_the_module(tmp_path, monkeypatch):
    from paddle_amp_ext.run._importwatch import when_imported

    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "watched_c.py").write_text("VALUE = 9\n")

    class Stop(BaseException):
        pass

    def stop(module):
        raise Stop(f"refused {module.VALUE}")

    errors = []

    def in_thread():
        try:
            import watched_c  # noqa: F401
        except Stop as exc:
            errors.append(str(exc))

    import threading

    with when_imported("watched_c", stop):
        worker = threading.Thread(target=in_thread)
        worker.start()
        worker.join(60)
        with pytest.raises(Stop, match="refused 9"):
            import watched_c  # noqa: F401
    assert errors == ["refused 9"] and "watched_c" not in sys.modules
    import watched_c  # noqa: F401,F811  # the watch has ended: a plain import
    assert watched_c.VALUE == 9


# --------------------------------------------------------------------------- the subpackage
def test_the_run_subpackage_serves_the_routing_names_and_refuses_others():
    import paddle_amp_ext.integrations as integrations
    import paddle_amp_ext.run as run_package
    from paddle_amp_ext.run import routing

    assert (run_package.route, run_package.routed, run_package.unroute) == (amp.route, amp.routed, amp.unroute)
    assert run_package.Routing is integrations.Routing is routing.Routing
    assert run_package.active_routing is integrations.active_routing is routing.active_routing
    assert sorted(run_package.__all__) == ["Routing", "active_routing", "route", "routed", "unroute"]
    with pytest.raises(AttributeError, match="module 'paddle_amp_ext.run' has no attribute 'ScalerSummary'"):
        run_package.ScalerSummary  # noqa: B018  # plumbing stays private


@pytest.mark.slow
def test_python_dash_m_paddle_amp_ext_run_still_runs_the_command(tmp_path):
    proc = subprocess.run([*RUN, "--help"], capture_output=True, text=True, timeout=240, cwd=tmp_path, env=ENV)
    assert proc.returncode == 0 and proc.stdout.startswith(
        "usage: python -m paddle_amp_ext.run [options] SCRIPT [ARGS...] | -m MODULE [ARGS...]"), proc.stderr[-3000:]
