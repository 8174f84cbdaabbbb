"""The state schema: round trips real state dicts, refuses anything that is not plain data."""

import json

import pytest
import torch

from torchrelay.transfer.flatten import SchemaError, TensorSpec, flatten, parse_dtype, unflatten


def _trained_state():
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, betas=(0.8, 0.9))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    sched.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "step": 7,
    }


def test_round_trip_through_json_keeps_types_and_tensors():
    state = _trained_state()
    tree, tensors, specs = flatten(state)
    tree = json.loads(json.dumps(tree))
    specs = [TensorSpec.from_json(json.loads(json.dumps(s.to_json()))) for s in specs]
    rebuilt = unflatten(tree, [t.clone() for t in tensors])
    assert rebuilt["optimizer"]["param_groups"][0]["betas"] == (0.8, 0.9)
    assert set(rebuilt["optimizer"]["state"]) == {0, 1}  # int keys survive JSON
    assert rebuilt["step"] == 7
    for spec, tensor in zip(specs, tensors, strict=True):
        assert spec.dtype == tensor.dtype and spec.shape == tuple(tensor.shape)
    assert torch.equal(rebuilt["model"]["weight"], state["model"]["weight"])
    assert specs[0].path == ("model", "weight")


def test_arbitrary_objects_are_refused():
    with pytest.raises(SchemaError, match="cannot transfer a function"):
        flatten({"fn": lambda: 0})
    with pytest.raises(SchemaError, match="not a plain value"):
        flatten({(1, 2): 3})


def test_malformed_schema_is_refused():
    with pytest.raises(SchemaError):
        unflatten({"__tensor__": 5}, [])
    with pytest.raises(SchemaError):
        unflatten({"__reduce__": ["os.system", "echo pwned"]}, [])


def test_only_real_dtypes_parse():
    assert parse_dtype("torch.bfloat16") is torch.bfloat16
    for bad in ("torch.Tensor", "os", "torch.load"):
        with pytest.raises(SchemaError):
            parse_dtype(bad)
