"""Fast local A/B runs with pytest-benchmark: every variant and floor of a family timed in one session, grouped.

    bash scripts/ab                       # every family over its quick grid, compared within each group
    bash scripts/ab -k sampler --benchmark-save=before   # then change code and
    bash scripts/ab -k sampler --benchmark-compare       # compare with the saved run

In the normal test run these execute once each (``--benchmark-disable``), as a check that every case runs and
keeps its family's output contract.
"""

from __future__ import annotations

import itertools

import pytest
import torch.utils._pytree as pytree
from skips import allowed

from pitfalls.devices import available_devices, synchronize
from pitfalls.family import SkipCase
from pitfalls.registry import all_families


def quick_points(entry):
    """Every parameter set of the family's quick grid (the asv suite sweeps the same)."""
    axes = entry.axes("quick")
    return [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]


CASES = [
    pytest.param(entry.name, variant, sizes, device,
                 id=f"{entry.name}-{variant}-{'-'.join(map(str, sizes.values()))}-{device}")
    for entry in all_families().values()
    for sizes in quick_points(entry)
    for variant in entry.cases
    for device in available_devices()
]


def shape_of(output):
    """The output's structure and each leaf's dtype: what every variant of a family must return alike."""
    leaves, spec = pytree.tree_flatten(output)
    return spec, [getattr(leaf, "dtype", type(leaf)) for leaf in leaves]


@pytest.mark.parametrize(("family", "variant", "sizes", "device"), CASES)
def test_ab(benchmark, family, variant, sizes, device):
    entry = all_families()[family]
    try:
        case = entry.build(variant, device=device, **sizes)
    except SkipCase as skip:  # a variant that needs what this machine lacks (loader's gpu_decode)
        # Only a reason on the allow-list skips: a wrong memory estimate ("does not fit") must fail, not hide.
        if allowed(skip.reason) is None:
            pytest.fail(f"{family}/{variant} {sizes} {device} skipped for a reason not on tests/skips.py's "
                        f"allow-list: {skip.reason}")
        pytest.skip(skip.reason)
    benchmark.group = f"{family} {' '.join(f'{k}={v}' for k, v in sizes.items())} {device}"
    benchmark.extra_info.update(family=family, variant=variant, device=device, **sizes)
    calls = 0

    def one_call():
        nonlocal calls
        calls += 1
        output = case()
        # Without the wait a CUDA call would be timed as its launch only.
        synchronize(case.device)
        return output

    with case:  # a loader's workers, a ddp case's ranks: released when the test is done with the case
        one_call()  # warm-up outside the timed rounds (allocator, lazy init)
        calls = 0
        output = benchmark(one_call)
    if benchmark.disabled:
        assert calls == 1
    else:
        assert calls >= benchmark.stats.stats.rounds
    with entry.build(entry.baseline, device=device, **sizes) as naive_case:
        naive = naive_case()
    assert shape_of(output) == shape_of(naive)
