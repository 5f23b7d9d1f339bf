"""Argument checks shared by the families: clear errors naming the argument, the value and what is allowed."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


def check_choice(argument: str, value: Any, allowed: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``allowed``, else raise ValueError naming all three."""
    allowed = tuple(allowed)
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{argument}={value!r} is not known; allowed: {', '.join(allowed)}")
    return value


def check_tensor(argument: str, value: Any) -> torch.Tensor:
    """Return ``value`` if it is a tensor, else raise TypeError."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_dtype(argument: str, tensor: torch.Tensor, allowed: Iterable[torch.dtype], what: str) -> None:
    """Raise TypeError unless ``tensor.dtype`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if tensor.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        raise TypeError(
            f"{argument} has dtype {str(tensor.dtype).removeprefix('torch.')}; {what} must be {names}"
        )


def check_ndim(argument: str, tensor: torch.Tensor, allowed: Iterable[int], layout: str) -> None:
    """Raise ValueError unless ``tensor.ndim`` is one of ``allowed``."""
    if tensor.ndim not in tuple(allowed):
        raise ValueError(f"{argument} has shape {tuple(tensor.shape)}; expected {layout}")


def check_same_device(**tensors: torch.Tensor) -> None:
    """Raise ValueError unless every tensor lives on one device."""
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{name} on {device}" for name, device in devices.items())
        raise ValueError(f"tensors must be on one device, got {listed}")


def check_positive_int(argument: str, value: Any, *, even: bool = False) -> int:
    """Return ``value`` if it is a positive int (and even, if asked), else raise."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{argument} must be an int, got {value!r} ({type(value).__name__})")
    if value <= 0 or (even and value % 2):
        allowed = "a positive even int" if even else "a positive int"
        raise ValueError(f"{argument}={value!r} is not allowed; {argument} must be {allowed}")
    return value


def check_int_at_least(argument: str, value: Any, minimum: int) -> int:
    """Return ``value`` if it is an int >= ``minimum`` (bools refused), else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{argument} must be an int >= {minimum}, got {value!r}")
    return value


def check_callable(argument: str, value: Any) -> Any:
    """Return ``value`` if it is callable, else raise TypeError naming what it is."""
    if not callable(value):
        raise TypeError(f"{argument} must be callable, got {type(value).__name__}: {value!r}")
    return value
