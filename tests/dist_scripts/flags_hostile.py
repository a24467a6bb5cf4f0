"""Run under `python -m paddle.distributed.launch --nproc_per_node 2`: odd found_inf flags on rank 1.

Rank 0 passes a clean flag, rank 1 a flag a hostile caller might pass (a float NaN, 0.5, a float
tensor holding NaN, an int tensor); every rank must read the agreed flag as found.
argv: OUT_DIR. Writes OUT_DIR/rank{N}.json.
"""

import json
import sys

import paddle

from paddle_amp_ext.distributed import agree_found_inf, host_bool


def main(out_dir: str) -> None:
    paddle.distributed.init_parallel_env()
    rank = paddle.distributed.get_rank()
    nan = float("nan")
    cases = [  # (rank 0's flag, rank 1's flag)
        (0.0, nan),
        (0, 0.5),
        (paddle.to_tensor([False]), paddle.to_tensor([nan])),
        (paddle.to_tensor(0.0), paddle.to_tensor([3], dtype="int64")),
        (False, paddle.to_tensor([False])),
    ]
    agreed = [host_bool(agree_found_inf(case[rank])) for case in cases]
    with open(f"{out_dir}/rank{rank}.json", "w") as handle:
        json.dump({"agreed": agreed}, handle)


if __name__ == "__main__":
    main(sys.argv[1])
