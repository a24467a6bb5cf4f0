"""``python train.py -c configs/tiny_o2.yml [-o Section.key=value ...]``: the suites' ``tools/train.py`` shape."""

import argparse
import os
import sys

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from engine import Engine  # noqa: E402


def override(config, assignment):
    """``-o AMP.level=O1``: set one nested key, the value parsed as YAML."""
    path, _, value = assignment.partition("=")
    *parents, key = path.split(".")
    for part in parents:
        config = config[part]
    config[key] = yaml.safe_load(value)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-c", "--config", required=True)
    parser.add_argument("-o", "--override", action="append", default=[])
    args = parser.parse_args()
    with open(args.config) as f:
        config = yaml.safe_load(f)
    for assignment in args.override:
        override(config, assignment)
    engine = Engine(config)
    history = engine.train()
    engine.report(history, engine.eval())


if __name__ == "__main__":
    main()
