"""The hazard locator: which source line each hazard gets, in forward, in backward and in the user's own backward."""

from __future__ import annotations

import inspect

import torch

from pitfalls.probes.sites import HazardLocator
from pitfalls.probes.syncs import SyncHazardCounter

ITEM = "aten._local_scalar_dense.default"
MASK_INDEX = "aten.index.Tensor (bool mask)"
MASK_INDEX_PUT = "aten.index_put.default (bool mask)"


def line_of(fn, text: str, *, whole: bool = False) -> int:
    """The line number of the one line of `fn` containing `text` (or, with whole, being it, stripped)."""
    lines, start = inspect.getsourcelines(fn)
    found = [start + i for i, line in enumerate(lines) if (line.strip() == text if whole else text in line)]
    assert len(found) == 1
    return found[0]


def test_the_counter_calls_its_hook_once_per_hazard_before_the_op_runs():
    seen: list[str] = []
    x = torch.arange(6.0)
    with SyncHazardCounter(on_hazard=seen.append) as counter:
        x[x > 2].sum().item()
        x.sum()  # not a hazard: the hook is not called
    assert seen == [MASK_INDEX, ITEM]
    assert counter.result.as_dict() == {MASK_INDEX: 1, ITEM: 1}


class ScaleByMax(torch.autograd.Function):
    """A custom op whose own backward reads a value on the host."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * 2

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        peak = x.max().item()
        return grad * peak


def custom_step(w):
    ScaleByMax.apply(w).sum().backward()


def test_python_running_in_backward_keeps_its_own_line():
    w = torch.randn(8, requires_grad=True)
    with HazardLocator() as locator:
        custom_step(w)
    (site,) = locator.result.sites
    assert site.label == ITEM and site.in_backward
    assert site.line is not None and site.line.lineno == line_of(ScaleByMax.backward, ".item()")
    assert site.line.function == "backward"


def masked_forward(w):
    return w[w > 0].sum()


def test_backward_without_a_recorded_forward_falls_back_to_the_backward_call():
    w = torch.randn(8, requires_grad=True)
    loss = masked_forward(w)  # built before the locator: anomaly mode recorded no forward stack
    with HazardLocator() as locator:
        loss.backward()
    (site,) = locator.result.sites
    assert site.label == MASK_INDEX_PUT and site.in_backward
    assert site.line is not None
    this_test = test_backward_without_a_recorded_forward_falls_back_to_the_backward_call
    assert site.line.lineno == line_of(this_test, "loss.backward()", whole=True)


def test_backward_of_a_forward_inside_the_locator_gets_the_forward_line():
    w = torch.randn(8, requires_grad=True)
    with HazardLocator() as locator:
        masked_forward(w).backward()
    lines = {(site.label, site.in_backward): site.line.lineno for site in locator.result.sites if site.line}
    forward = line_of(masked_forward, "w[w > 0]")
    assert lines == {(MASK_INDEX, False): forward, (MASK_INDEX_PUT, True): forward}
    assert not torch.is_anomaly_enabled()  # switched back off on exit


def test_site_counts_add_up_to_the_counter_totals():
    x = torch.arange(10.0)
    with HazardLocator() as locator:
        for _ in range(3):
            x[x > 4].sum().item()
    result = locator.result
    assert result.total == 6
    assert {site.label: site.count for site in result.sites} == result.counts.as_dict() == {MASK_INDEX: 3, ITEM: 3}
