"""Markdown pieces every table the suite writes is made of: the one table builder, inline code, links."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["code", "link", "relative", "table"]


def _cell(value: Any) -> str:
    return " ".join(str(value).split()).replace("|", "\\|")


def table(header: Sequence[str], body: Iterable[Sequence[Any]]) -> list[str]:
    """A Markdown table: the header, its separator, one line per row (pipes escaped, line ends folded)."""
    lines = ["| " + " | ".join(_cell(h) for h in header) + " |", "|" + " --- |" * len(header)]
    return lines + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in body]


def code(value: Any) -> str:
    """``value`` as inline code."""
    return f"`{value}`"


def relative(target: Path, page: Path) -> str:
    """The path of ``target`` seen from ``page``'s folder (both paths from the repository's root)."""
    return Path(os.path.relpath(target, page.parent)).as_posix()


def link(text: str, target: Path, page: Path) -> str:
    """A link from ``page`` to ``target`` (both paths from the repository's root)."""
    return f"[{text}]({relative(target, page)})"
