"""Entry point of the ``torchrelay`` command.

Only the standard library and light modules load here: each subcommand's handler imports what
it needs (torch for ``run`` and ``demo``, grpc for ``status`` and ``chaos``), so ``--help``
and the operator commands answer at once.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from torchrelay.cli import demo, health, operator, report, run
from torchrelay.cli import elastic as elastic_cli
from torchrelay.cli import pool as pool_cli
from torchrelay.simulate import cli as simulate

EXIT_BROKEN_PIPE = 141
"""What a shell reports for a tool killed by SIGPIPE (128 + 13), e.g. ``report | head -1``."""


class OneLineParser(argparse.ArgumentParser):
    """Bad arguments get one line (what is wrong and where to look), not the usage block."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="torchrelay",
        description="Distributed PyTorch training that survives failures without rollback.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True)
    run.add_parser(subparsers)
    report.add_parser(subparsers)
    demo.add_parser(subparsers)
    operator.add_parsers(subparsers)
    health.add_parsers(subparsers)
    elastic_cli.add_parsers(subparsers)
    pool_cli.add_parsers(subparsers)
    simulate.add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except BrokenPipeError:
        # The reader went away (`torchrelay report RUN | head -1`): stop quietly, as Unix
        # tools do. Point stdout at /dev/null so the interpreter's final flush cannot fail too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


if __name__ == "__main__":
    raise SystemExit(main())
