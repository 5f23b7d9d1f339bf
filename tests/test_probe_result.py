"""The value probes return instead of a figure they cannot measure."""

from __future__ import annotations

import dataclasses

import pytest

from pitfalls.result import Unavailable, is_available


def test_unavailable_is_falsy_and_reads_with_its_reason() -> None:
    missing = Unavailable("no CUDA device")
    assert not missing
    assert str(missing) == "unavailable: no CUDA device"
    assert missing == Unavailable("no CUDA device")
    assert missing != Unavailable("NVML library not found")


def test_unavailable_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        Unavailable("x").reason = "y"  # type: ignore[misc]


@pytest.mark.parametrize("reason", ["", "   ", None, 0])
def test_unavailable_needs_a_reason(reason) -> None:
    with pytest.raises(ValueError, match="reason must be a non-empty string"):
        Unavailable(reason)  # type: ignore[arg-type]


def test_a_measured_zero_is_available() -> None:
    assert is_available(0)
    assert is_available(0.0)
    assert not is_available(Unavailable("no CUDA device"))
