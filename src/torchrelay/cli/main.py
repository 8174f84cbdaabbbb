"""Entry point of the ``torchrelay`` command."""

from __future__ import annotations

import argparse

from torchrelay.cli import demo, operator, report, run
from torchrelay.simulate import cli as simulate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torchrelay",
        description="Distributed PyTorch training that survives failures without rollback.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    run.add_parser(subparsers)
    report.add_parser(subparsers)
    demo.add_parser(subparsers)
    operator.add_parsers(subparsers)
    simulate.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    raise SystemExit(main())
