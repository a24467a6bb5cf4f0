"""A training script in one of the shapes users write, never calling close().

    python shapes.py SHAPE MODE LOGDIR
MODE "hook": amp.GradScaler(hooks=[amp.VisualDLHook(LOGDIR)]); MODE "run": paddle.amp.GradScaler,
as an unmodified script under `python -m paddle_amp_ext.run --logdir LOGDIR`. STEPS[SHAPE] says
how many steps each scaler trains (tests/test_visualdl_lifetime.py counts the points).
"""

import sys
import threading

import paddle

STEPS = {"module": [73], "main": [73], "sys_exit": [73], "exception": [73], "several": [10, 20, 30],
         "loop": [7, 8, 9, 10], "thread": [73]}


def make_scaler(mode: str, logdir: str):
    if mode == "run":
        return paddle.amp.GradScaler(init_loss_scaling=1024)
    import paddle_amp_ext as amp

    return amp.GradScaler(init_loss_scaling=1024, hooks=[amp.VisualDLHook(logdir)])


def make_model():
    model = paddle.nn.Linear(4, 1)
    return model, paddle.optimizer.SGD(learning_rate=0.01, parameters=model.parameters())


def one_step(model, opt, scaler) -> None:
    with paddle.amp.auto_cast():
        loss = model(paddle.ones([2, 4])).mean()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    opt.clear_grad()


def train(steps: int, mode: str, logdir: str, fail_at=None) -> None:
    model, opt = make_model()
    scaler = make_scaler(mode, logdir)
    for step in range(steps):
        one_step(model, opt, scaler)
        if step == fail_at:
            raise RuntimeError(f"the script failed after step {step}")


def main(shape: str, mode: str, logdir: str) -> int:
    steps = STEPS[shape]
    if shape in ("main", "sys_exit"):
        train(steps[0], mode, logdir)
    elif shape == "exception":
        train(steps[0], mode, logdir, fail_at=steps[0] - 1)
    elif shape == "several":  # alive together, trained in turn
        runs = [(*make_model(), make_scaler(mode, logdir)) for _ in steps]
        for n, (model, opt, scaler) in zip(steps, runs):
            for _ in range(n):
                one_step(model, opt, scaler)
    elif shape == "loop":  # each new scaler drops the one before
        for n in steps:
            model, opt = make_model()
            scaler = make_scaler(mode, logdir)
            for _ in range(n):
                one_step(model, opt, scaler)
    elif shape == "thread":
        worker = threading.Thread(target=train, args=(steps[0], mode, logdir))
        worker.start()
        worker.join()
    return 3 if shape == "sys_exit" else 0


if __name__ == "__main__":  # the training below runs at module level: its scaler is a global
    SHAPE, MODE, LOGDIR = sys.argv[1:4]
    if SHAPE == "module":
        model, opt = make_model()
        scaler = make_scaler(MODE, LOGDIR)
        for _ in range(STEPS["module"][0]):
            one_step(model, opt, scaler)
    elif SHAPE == "sys_exit":
        sys.exit(main(SHAPE, MODE, LOGDIR))
    else:
        main(SHAPE, MODE, LOGDIR)
