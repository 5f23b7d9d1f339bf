"""The exact sync hazards of every registered variant, counted on the CPU.

These are the numbers the articles are about: on a GPU each hazard is a point where the host waits for the
device. Every variant of every family must have an expectation here, so a newly registered variant fails this
test until someone has reasoned out, and written down, what it should count.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pitfalls import registry
from pitfalls.cases import build_case
from pitfalls.probes.syncs import count_hazards

NONZERO = "aten.nonzero.default"
UNIQUE = "aten._unique2.default"
MASK_INDEX = "aten.index.Tensor (bool mask)"
MASK_INDEX_PUT = "aten.index_put.default (bool mask)"
HOST_VALUE_PUT = "aten.index_put_.default (host value to device)"

# Forward + loss (Case.fn: the net's logits, then the variant's loss).
LOSS_FORWARD: dict[str, dict[str, int]] = {
    # nonzero(target == background) finds the background pixels (1 nonzero); writing IGNORE there indexes with
    # the integer tensors nonzero returned, asynchronous in itself, but the Python number is a CPU tensor on CUDA
    # and _index_put_impl_ copies it to the device first, a blocking copy (1 index_put, host value to device);
    # unique(target) (1 _unique2); then target[mask] and logits[mask] (2 boolean-mask index).
    "naive": {NONZERO: 1, HOST_VALUE_PUT: 1, UNIQUE: 1, MASK_INDEX: 2},
    # torch.where removes the nonzero; unique and both masks stay.
    "where": {UNIQUE: 1, MASK_INDEX: 2},
    # sort + diff + count_nonzero replace unique, and torch.where replaces the Python branch on its result;
    # the two boolean masks stay.
    "sort_count": {MASK_INDEX: 2},
    # CrossEntropyLoss(ignore_index=-1) on the unmasked tensors: nothing left.
    "ignore_index": {},
}

# One training step (the Case itself: zero_grad, forward + loss, backward, SGD step). Backward adds one hazard
# where the logits were masked: index's backward scatters the gradient with index_put and the same boolean mask
# (the masked target has no gradient, so its mask adds nothing). zero_grad and SGD add none.
LOSS_STEP: dict[str, dict[str, int]] = {
    "naive": {NONZERO: 1, HOST_VALUE_PUT: 1, UNIQUE: 1, MASK_INDEX: 2, MASK_INDEX_PUT: 1},
    "where": {UNIQUE: 1, MASK_INDEX: 2, MASK_INDEX_PUT: 1},
    "sort_count": {MASK_INDEX: 2, MASK_INDEX_PUT: 1},
    "ignore_index": {},
}

# One sampling call of one row. nonzero: one nonzero for the positives and one for the negatives; the picks are
# then taken with integer indices from randperm (asynchronous). static: count_nonzero, where, rand, topk and
# gather all have fixed output shapes.
SAMPLER_ROW: dict[str, dict[str, int]] = {
    "nonzero": {NONZERO: 2},
    "static": {},
}

BATCH = 4  # the nonzero variant loops over the rows in Python: two nonzero per row; static takes the batch at once
SAMPLER_BATCH: dict[str, dict[str, int]] = {
    "nonzero": {NONZERO: 2 * BATCH},
    "static": {},
}


@pytest.mark.parametrize(("family", "table"), [
    ("loss", LOSS_FORWARD), ("loss", LOSS_STEP), ("sampler", SAMPLER_ROW), ("sampler", SAMPLER_BATCH),
])
def test_every_registered_variant_has_an_expectation(family, table) -> None:
    assert set(table) == set(registry.variants(family))


@pytest.mark.parametrize("variant", registry.variants("loss"))
def test_loss_forward_hazards(variant) -> None:
    case = build_case("loss", variant, batch=2, image_size=16)
    assert count_hazards(case.fn, *case.inputs).as_dict() == LOSS_FORWARD[variant]


@pytest.mark.parametrize("variant", registry.variants("loss"))
def test_loss_training_step_hazards(variant) -> None:
    case = build_case("loss", variant, batch=2, image_size=16)
    assert count_hazards(case).as_dict() == LOSS_STEP[variant]


@pytest.mark.parametrize("variant", registry.variants("sampler"))
def test_sampler_row_hazards(variant) -> None:
    case = build_case("sampler", variant, n=1000, batch=1)
    assert count_hazards(case).as_dict() == SAMPLER_ROW[variant]


@pytest.mark.parametrize("variant", registry.variants("sampler"))
def test_sampler_batch_hazards(variant) -> None:
    case = build_case("sampler", variant, n=1000, batch=BATCH)
    assert count_hazards(case).as_dict() == SAMPLER_BATCH[variant]


SMALL = {"loss": {"batch": 2, "image_size": 16}, "sampler": {"n": 1000, "batch": 1},
         "calibration": {"ms": 0, "items": 4, "mib": 0}}
BASELINE_TOTAL = {"loss": 6, "sampler": 2, "calibration": 4}  # calibration: k planted .item() calls


@pytest.mark.parametrize("family", [f for f in registry.family_names() if "hazards" in registry.family(f).figures])
def test_the_baseline_has_hazards_and_the_last_variant_has_none(family) -> None:
    # The articles' claim in one line, counted on the cases themselves: the naive form makes the host wait, the
    # final form never does.
    variants = registry.variants(family)
    assert count_hazards(build_case(family, registry.baseline(family), **SMALL[family])).total == BASELINE_TOTAL[family]
    assert count_hazards(build_case(family, variants[-1], **SMALL[family])).total == 0


class _Dispatched(TorchDispatchMode):
    """Every ATen call a region dispatches, with its arguments: an oracle written apart from the counter."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[torch._ops.OpOverload, tuple, dict, object]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        out = func(*args, **(kwargs or {}))
        self.calls.append((func, args, kwargs or {}, out))
        return out


def hazards_among_dispatched(case) -> dict[str, int]:
    """Count, from the ops one call dispatched, those whose result the host must wait for: an op tagged as having
    a data-dependent output shape or value, except indexing, which waits only for a boolean mask; and an index_put
    through integer indices of a 0-dim value that no dispatched op made (a Python number, which `x[i] = v` turns
    into a CPU tensor without dispatching, and ATen copies to the device)."""
    with _Dispatched() as seen:
        case()
    # lift_fresh only hands a constant made outside dispatch (the Python number's tensor) to the mode.
    made = {id(out) for func, _, _, out in seen.calls if func is not torch.ops.aten.lift_fresh.default}
    found: Counter[str] = Counter()
    for func, args, kwargs, _ in seen.calls:
        name = str(func)
        if name in ("aten.index.Tensor", "aten.index_put.default", "aten.index_put_.default",
                    "aten._index_put_impl_.default"):
            indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
            value = args[2] if len(args) > 2 else None
            if any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices):
                found[f"{name} (bool mask)"] += 1
            elif isinstance(value, torch.Tensor) and value.dim() == 0 and id(value) not in made:
                found[f"{name} (host value to device)"] += 1
        elif {torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output} & set(func.tags):
            found[name] += 1
    return dict(found)


@pytest.mark.parametrize(("family", "variant"), [(f, v) for f in SMALL for v in registry.variants(f)])
def test_the_counter_counts_the_hazards_among_the_ops_actually_dispatched(family, variant) -> None:
    case = build_case(family, variant, **SMALL[family])
    assert count_hazards(case).as_dict() == hazards_among_dispatched(case)


@pytest.mark.parametrize(("family", "variant", "params"), [
    ("loss", "naive", {"batch": 2, "image_size": 16}),
    ("sampler", "nonzero", {"n": 1000}),
])
def test_a_compiled_case_counts_the_hazards_of_its_eager_program(family, variant, params) -> None:
    eager = count_hazards(build_case(family, variant, **params))
    compiled = count_hazards(build_case(family, variant, compiled=True, **params))
    assert compiled == eager
    assert compiled.eager is True
