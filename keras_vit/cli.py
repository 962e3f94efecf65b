"""The `keras-vit` command. Each subcommand lives in keras_vit/commands/<name>.py and provides
`add_parser(subparsers)` (which sets `func` on its parser)."""

import argparse
import importlib
import os
import sys

#: Subcommand modules under keras_vit.commands, in the order `keras-vit --help` lists them.
COMMANDS = ["explain", "finetune", "evaluate", "fewshot", "presets", "convert", "export"]


def build_parser():
    parser = argparse.ArgumentParser(prog="keras-vit", description="Vision Transformers for Keras 3.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"keras_vit.commands.{name}").add_parser(subparsers)
    return parser


def main(argv=None):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
