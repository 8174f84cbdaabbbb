"""The one exception type the simulator raises for input it cannot use."""

from __future__ import annotations


class ScenarioError(ValueError):
    """Bad simulator input. The message names the offending field and what would be valid."""
