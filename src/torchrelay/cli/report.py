"""``torchrelay report RUN_DIR``: what happened in a run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from torchrelay.report.summary import render_text, summarize


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="summarise a run's failures and recoveries")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        summary = summarize(args.run_dir)
    except FileNotFoundError as exc:
        raise SystemExit(f"torchrelay report: {exc}") from None
    print(json.dumps(summary, indent=2) if args.json else render_text(summary))
    return 0
