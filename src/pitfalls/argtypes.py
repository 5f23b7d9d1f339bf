"""Argument types shared by the commands: a bad value is one line naming it and what is allowed (argparse, exit 2)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

__all__ = ["positive"]

N = TypeVar("N", int, float)


def positive(kind: Callable[[str], N]) -> Callable[[str], N]:
    """An argparse type: ``kind`` (int or float) of the text, refused unless more than 0.

    Args:
        kind: int or float.

    Returns:
        The parser argparse calls with the option's text.
    """
    name = getattr(kind, "__name__", "number")

    def parse(text: str) -> N:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a {name}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed; it must be more than 0")
        return value

    parse.__name__ = name  # argparse names the type in its "invalid ... value" line
    return parse
