"""Both engines across cluster sizes, for the ETTR-versus-size plot."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from torchrelay.simulate.analytic import ClosedForm, Model, closed_form
from torchrelay.simulate.montecarlo import MonteCarlo, monte_carlo
from torchrelay.simulate.params import Scenario

DEFAULT_SIZES = tuple(2**k for k in range(8, 18))  # 256 .. 131,072 GPUs
# Monte Carlo is costlier; a few sizes are enough to show it tracks the closed form.
DEFAULT_MC_SIZES = (1024, 4096, 16384, 65536)


@dataclass(frozen=True)
class SweepPoint:
    """One cluster size: both closed forms, and the Monte Carlo where it was run."""

    gpus: int
    exact: ClosedForm
    first_order: ClosedForm
    monte_carlo: MonteCarlo | None


def sweep(
    scenario: Scenario, sizes: Iterable[int], mc_sizes: Iterable[int] = ()
) -> list[SweepPoint]:
    """``scenario`` re-evaluated at each size (MTTF from its calibration, spares re-sized if
    auto); the Monte Carlo runs at sizes also in ``mc_sizes`` when replications > 0."""
    with_mc = set(mc_sizes) if scenario.simulation.replications else set()
    points = []
    for gpus in sorted(set(sizes)):
        sized = scenario.at_size(gpus)
        points.append(
            SweepPoint(
                gpus=gpus,
                exact=closed_form(sized, Model.EXACT),
                first_order=closed_form(sized, Model.FIRST_ORDER),
                monte_carlo=monte_carlo(sized) if gpus in with_mc else None,
            )
        )
    return points
