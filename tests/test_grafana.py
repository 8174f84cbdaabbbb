"""docs/grafana/torchrelay.json and docs/observability.md name only metrics the controller
registers, and every metric it registers is on the dashboard and in the docs."""

from __future__ import annotations

import json
import re
from pathlib import Path

from torchrelay.control.metrics import JobMetrics

DOCS = Path(__file__).parent.parent / "docs"
NAME = re.compile(r"\btorchrelay_[a-z_]+")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


def exported() -> dict[str, str]:
    """Every series name the job's registry can expose -> its metric family's name."""
    names = {}
    for family in JobMetrics().registry.collect():
        for suffix in SUFFIXES[family.type]:
            names[family.name + suffix] = family.name
    return names


def expressions() -> list[str]:
    dashboard = json.loads((DOCS / "grafana" / "torchrelay.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    return [t["expr"] for p in panels for t in p["targets"]]


def test_every_dashboard_query_names_registered_metrics_only():
    names = exported()
    used = set()
    for expr in expressions():
        found = NAME.findall(expr)
        assert found, f"no torchrelay metric in {expr!r}"
        unknown = set(found) - names.keys()
        assert not unknown, f"{expr!r} names what the controller does not export: {unknown}"
        assert expr.count("(") == expr.count(")"), expr
        used |= {names[n] for n in found}
    assert used == set(names.values())  # and every metric has a panel


def test_the_quantile_panel_reads_the_histogram():
    quantiles = [e for e in expressions() if e.startswith("histogram_quantile(")]
    assert {e.split(",")[0] for e in quantiles} == {
        "histogram_quantile(0.5",
        "histogram_quantile(0.99",
    }
    assert all("torchrelay_recovery_seconds_bucket" in e and "by (le)" in e for e in quantiles)


def test_the_docs_list_every_metric():
    text = (DOCS / "observability.md").read_text()
    documented = set(NAME.findall(text))
    names = exported()
    known = names.keys() | set(names.values())  # a histogram is documented by its family name
    assert documented <= known, documented - known
    for name, family in names.items():
        shown = family if name.endswith(("_bucket", "_sum", "_count")) else name
        assert shown in documented, f"{shown} is not in docs/observability.md"
