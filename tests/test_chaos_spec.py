"""Parsing --chaos specs, with clear errors for bad ones."""

import pytest

from torchrelay.chaos import ChaosSpecError, parse_chaos, parse_schedule


def test_kill_spec_with_phase():
    event = parse_chaos("kill:rank=2:step=10:phase=backward", 0)
    assert (event.action, event.rank, event.step, event.phase) == ("kill", 2, 10, "backward")


def test_default_phase_is_forward():
    assert parse_chaos("kill:rank=0:step=1", 3).phase == "forward"


@pytest.mark.parametrize(
    "spec,message",
    [
        ("explode:rank=1:step=1", "unknown action"),
        ("kill:rank=1", "required"),
        ("kill:rank=x:step=1", "integers"),
        ("kill:rank=1:step=1:phase=sideways", "phase"),
        ("kill:rank=1:step=1:when=now", "bad field"),
    ],
)
def test_bad_specs_explain_themselves(spec, message):
    with pytest.raises(ChaosSpecError, match=message):
        parse_chaos(spec, 0)


def test_rank_outside_world_is_refused():
    with pytest.raises(ChaosSpecError, match="outside the job"):
        parse_schedule(["kill:rank=4:step=1"], world_size=4)
