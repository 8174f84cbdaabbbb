"""``torchrelay run``'s checks of what it was given, before anything starts: durations and
ports, the health poll's interval, ``--transparent``'s needs and the state store's reach. Each
refusal is one line and a non-zero exit (``SystemExit``)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from torchrelay.config import JobConfig
from torchrelay.control.store import StoreError, StoreSpec, open_backend
from torchrelay.health.poller import DEFAULT_INTERVAL as DEFAULT_HEALTH_POLL
from torchrelay.transparent.criu import CriuUnavailable, find_criu
from torchrelay.transparent.launch import refusal


def check_transparent(config: JobConfig, resume: bool) -> None:
    """``--transparent`` with options it cannot honour, or without a working CRIU (a crash
    could not be cured): one line, exit status 2."""
    reason = refusal(config, resume)
    if reason is None:
        try:
            find_criu()
        except CriuUnavailable as exc:
            reason = str(exc)
    if reason is not None:
        print(f"torchrelay run: {reason}", file=sys.stderr)
        raise SystemExit(2)


def health_poll(seconds: float | None) -> float:
    """``--health-poll``: on by default where NVIDIA's driver is (its device node exists)."""
    if seconds is None:
        return DEFAULT_HEALTH_POLL if Path("/dev/nvidiactl").exists() else 0.0
    if not (math.isfinite(seconds) and seconds >= 0):
        raise SystemExit(f"torchrelay run: --health-poll must be seconds >= 0, not {seconds}")
    return seconds


def check_durations(args: argparse.Namespace) -> None:
    """Timeouts are finite and positive, ``--max-restarts`` not negative, ``--metrics-port`` a
    port or 0; else one line."""
    for flag in ("spare_timeout", "halt_timeout", "hang_floor", "node_timeout"):
        value = getattr(args, flag)
        if not (math.isfinite(value) and value > 0):
            option = "--" + flag.replace("_", "-")
            raise SystemExit(
                f"torchrelay run: {option} must be a number of seconds > 0, not {value}"
            )
    if not 0 <= args.metrics_port <= 65535:
        raise SystemExit(
            f"torchrelay run: --metrics-port must be in 1..65535 (0: no metrics), not "
            f"{args.metrics_port}"
        )
    if args.drain_stragglers < 0:
        raise SystemExit(
            f"torchrelay run: --drain-stragglers must be >= 0, not {args.drain_stragglers}"
        )
    if args.max_restarts < 0:
        raise SystemExit(f"torchrelay run: --max-restarts must be >= 0, not {args.max_restarts}")


def check_state_store(spec: StoreSpec) -> None:
    """Reach the state store once, before anything starts; else one line and exit."""
    try:
        with open_backend(spec) as backend:
            backend.check()
    except StoreError as exc:
        raise SystemExit(
            f"torchrelay run: --state {spec}: {exc} (start etcd there, or use --state memory)"
        ) from None
