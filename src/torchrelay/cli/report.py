"""``torchrelay report RUN_DIR``: what happened in a run."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from torchrelay.ledger import LedgerError
from torchrelay.report.summary import render_text, summarize


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("report", help="summarise a run's failures and recoveries")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--html",
        type=Path,
        metavar="OUT",
        help="also write a self-contained HTML page (plots, failure table, projected cost)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the report; a missing, unreadable or malformed ledger is one line and exit 1."""
    try:
        summary = summarize(args.run_dir)
        text = json.dumps(summary, indent=2) if args.json else render_text(summary)
        if args.html is not None:
            _write_html(args.run_dir, args.html)
    except (FileNotFoundError, LedgerError) as exc:
        raise SystemExit(f"torchrelay report: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as exc:
        # Lines that parse as events but lack the fields a torchrelay ledger writes.
        raise SystemExit(
            f"torchrelay report: {args.run_dir / 'ledger.jsonl'} has a malformed event "
            f"({type(exc).__name__}: {exc}); is it a torchrelay ledger?"
        ) from None
    print(text)
    if args.html is not None:  # on stderr: stdout stays the report (JSON with --json)
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


def _write_html(run_dir: Path, out: Path) -> None:
    """Write the HTML page; matplotlib (in the page's modules) loads only here."""
    from torchrelay.report.html import write_report

    try:
        write_report(run_dir, out)
    except OSError as exc:
        raise SystemExit(f"torchrelay report: cannot write {out}: {exc.strerror}") from None
