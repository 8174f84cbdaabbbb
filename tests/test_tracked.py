"""The per-step snapshot of tracked state: what a dropped step changed is put back."""

from __future__ import annotations

import torch

from torchrelay.runtime.tracked import TrackedState


def _tracked() -> tuple[TrackedState, torch.optim.Optimizer, torch.optim.lr_scheduler.StepLR]:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.9, 0.99))
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    tracked = TrackedState()
    tracked.add("model", model)
    tracked.add("optimizer", opt)
    tracked.add("scheduler", scheduler)
    return tracked, opt, scheduler


def test_a_dropped_steps_scheduler_and_hyperparameters_are_put_back() -> None:
    tracked, opt, scheduler = _tracked()
    snap = tracked.snapshot()
    opt.step()  # the dropped step (no gradients: nothing moves)
    scheduler.step()
    opt.param_groups[0]["betas"] = (0.5, 0.5)
    assert opt.param_groups[0]["lr"] == 0.05
    tracked.restore(snap)
    assert opt.param_groups[0]["lr"] == 0.1
    assert opt.param_groups[0]["betas"] == (0.9, 0.99)
    assert scheduler.last_epoch == 0 and scheduler.get_last_lr() == [0.1]


def test_hyperparameters_that_change_in_place_are_copied_not_shared() -> None:
    """Numbers and tuples of numbers are kept by reference (nothing can change them in
    place); a tensor or a list could be changed in place by the dropped step, so the snapshot
    must hold a copy of it."""
    tracked, opt, _ = _tracked()
    group = opt.param_groups[0]
    group["lr"] = torch.tensor(0.1)
    group["milestones"] = [10, 20]
    snap = tracked.snapshot()
    group["lr"].mul_(0.5)
    group["milestones"].append(30)
    tracked.restore(snap)
    assert group["lr"].item() == torch.tensor(0.1).item()
    assert group["milestones"] == [10, 20]
    # A second restore from the same snapshot gives the same values: it was not consumed.
    group["lr"].mul_(0.5)
    tracked.restore(snap)
    assert group["lr"].item() == torch.tensor(0.1).item()
