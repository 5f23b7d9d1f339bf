"""The value every probe returns in place of a figure it cannot measure on this machine."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Unavailable", "is_available"]


@dataclass(frozen=True)
class Unavailable:
    """A figure that could not be measured here, with the concrete reason why.

    It is falsy so that `if figure:` reads naturally, and it is never a number: a missing GPU must never show up
    as 0 syncs or 0 % utilization in a report.

    Args:
        reason: short and concrete, e.g. "no CUDA device" or "NVML library not found".
    """

    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError(f"reason must be a non-empty string, got {self.reason!r}")

    def __bool__(self) -> bool:
        return False

    def __str__(self) -> str:
        return f"unavailable: {self.reason}"


def is_available(value: object) -> bool:
    """Tell whether a probe result is a measured value rather than an `Unavailable`.

    Args:
        value: anything a probe returned.

    Returns:
        False for an `Unavailable`, True otherwise (a measured 0 is available).
    """
    return not isinstance(value, Unavailable)
