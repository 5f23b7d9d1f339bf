"""The test guard `no_sync_hazards` and the `sync_hazards` pytest fixture, on passing and failing blocks."""

from __future__ import annotations

import inspect
import textwrap

import pytest
import torch

import pitfalls
from pitfalls.cases import smoke_case
from pitfalls.families import loss
from pitfalls.probes.syncs import count_hazards

pytest_plugins = ("pytester",)


def line_of(fn, text: str) -> int:
    lines, start = inspect.getsourcelines(fn)
    found = [start + i for i, line in enumerate(lines) if text in line]
    assert len(found) == 1
    return found[0]


@pytest.fixture(scope="module")
def naive_step():
    step = smoke_case("loss", "naive")
    step()
    return step


def test_a_sync_free_step_passes_the_guard():
    step = smoke_case("loss", "ignore_index")
    step()
    with pitfalls.no_sync_hazards() as guard:
        step()
    assert guard.result is not None and guard.result.total == 0


def test_the_naive_step_fails_with_every_hazard_at_its_line(naive_step):
    with pytest.raises(pitfalls.SyncHazardError) as failure:
        with pitfalls.no_sync_hazards():
            naive_step()
    error = failure.value
    assert isinstance(error, AssertionError)  # a test framework reports it as a failure, not an error
    found: dict[str, int] = {}
    for site in error.sites:
        found[site.label] = found.get(site.label, 0) + site.count
    assert found == count_hazards(naive_step).as_dict()
    message = str(error)
    assert message.startswith("6 sync hazards in the guarded block:")
    nonzero = line_of(loss.NaiveLoss.compute, "torch.nonzero(")
    assert f"loss.py:{nonzero}: aten.nonzero x1: background = torch.nonzero(" in message
    assert "rewrite: count_nonzero + topk" in message


def test_allowed_hazards_pass_and_the_rest_are_listed(naive_step):
    host_value = "aten.index_put_.default (host value to device)"
    allow = {"aten.nonzero", "aten._unique2.default", host_value, "loss.py:masked_cross_entropy"}
    with pitfalls.no_sync_hazards(allow=allow) as guard:
        naive_step()
    assert guard.result is not None and guard.result.total == 6  # seen, but every one allowed

    mask_line = line_of(loss.MaskedLoss.masked_cross_entropy, "= target[mask]")
    with pytest.raises(pitfalls.SyncHazardError) as failure:
        allow = {"aten.nonzero", "unique (aten._unique2)", host_value, f"families/loss.py:{mask_line}"}
        with pitfalls.no_sync_hazards(allow=allow):
            naive_step()
    left = {(site.label, site.line.lineno) for site in failure.value.sites if site.line}
    pred_line = line_of(loss.MaskedLoss.masked_cross_entropy, "pred.permute(0, 2, 3, 1)[mask]")
    assert left == {
        ("aten.index.Tensor (bool mask)", pred_line),
        ("aten.index_put.default (bool mask)", pred_line),
    }


def test_the_blocks_own_error_is_not_replaced():
    x = torch.arange(4.0)
    with pytest.raises(ZeroDivisionError):
        with pitfalls.no_sync_hazards():
            x[x > 1].sum()
            raise ZeroDivisionError


def test_allow_must_be_a_collection_of_strings():
    with pytest.raises(TypeError, match=r"allow must be a collection of strings, e.g. \{'aten.nonzero'\}"):
        pitfalls.no_sync_hazards(allow="aten.nonzero")
    with pytest.raises(TypeError, match="non-empty strings"):
        pitfalls.no_sync_hazards(allow={3})


FIXTURE_EXAMPLE = """
import torch


def test_sync_free(sync_hazards):
    x = torch.randn(32)
    with sync_hazards():
        y = torch.where(x > 0, x, 0.0).sum()


def test_masked(sync_hazards):
    x = torch.randn(32)
    with sync_hazards(allow={".item()"}):
        y = x[x > 0].sum().item()
"""


def test_the_fixture_through_its_entry_point(pytester):
    path = pytester.makepyfile(test_fixture_example=textwrap.dedent(FIXTURE_EXAMPLE))
    mask_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "x[x > 0]" in line)
    # A subprocess: plugins load from the installed entry points, as in a user's CI, not from this session.
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    out = result.stdout.str()
    assert "SyncHazardError: 1 sync hazard in the guarded block:" in out
    assert f"test_fixture_example.py:{mask_line}: boolean-mask index x1: y = x[x > 0].sum().item()" in out
    assert "FAILED test_fixture_example.py::test_masked" in out
    assert "hazard_guard.py" not in out  # the guard's own frame is hidden from the user's failure report


def test_the_fixture_comes_from_the_pitfalls_entry_point(pytester):
    pytester.makepyfile(test_fixture_example=textwrap.dedent(FIXTURE_EXAMPLE))
    result = pytester.runpytest_subprocess("-p", "no:pitfalls", "-p", "no:cacheprovider")
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(["*fixture 'sync_hazards' not found*"])


def _rows(mask: torch.Tensor) -> torch.Tensor:
    return mask.nonzero()


def test_the_guard_names_the_call_sites_of_a_shared_helper() -> None:
    x = torch.randn(16)
    with pytest.raises(pitfalls.SyncHazardError) as raised:
        with pitfalls.no_sync_hazards():
            _rows(x > 0)
            _rows(x < 0)
    message = str(raised.value)
    assert "called from" in message
    assert "_rows(x > 0)" in message and "_rows(x < 0)" in message
