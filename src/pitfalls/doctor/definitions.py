"""Where the script made its optimizers and its convolutions, for the rules that name a definition's line."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.modules.conv import _ConvNd

from pitfalls.probes.sites import SourceLine, locate_dispatch, source_line

__all__ = ["Definitions"]


class Definitions:
    """Record the line that made each optimizer and each convolution while the block runs.

    `torch.optim.Optimizer.__init__` and `torch.nn.modules.conv._ConvNd.__init__` (every optimizer's and every
    convolution's, however subclassed) are wrapped for the run and restored after it; each object made is kept weakly
    with the script's line that made it (the innermost frame outside torch and the doctor). The optimizers' wrapper
    also says whether the script made any optimizer, which decides how its steps are counted (`steps.StepCounter`).
    """

    def __init__(self) -> None:
        self._lines: dict[int, tuple[weakref.ref[Any], SourceLine | None]] = {}
        self._saved: list[tuple[type, Callable[..., None]]] = []
        self.optimizers_made = False

    def _wrap(self, cls: type, on_made: Callable[[], None] = lambda: None) -> None:
        original = cls.__init__  # type: ignore[misc]
        definitions = self

        @functools.wraps(original)
        def init(obj: Any, *args: Any, **kwargs: Any) -> None:
            on_made()
            original(obj, *args, **kwargs)
            definitions._lines[id(obj)] = (weakref.ref(obj), source_line(locate_dispatch()[0]))

        self._saved.append((cls, original))
        cls.__init__ = init  # type: ignore[misc]

    def __enter__(self) -> Definitions:
        self._wrap(torch.optim.Optimizer, lambda: setattr(self, "optimizers_made", True))
        self._wrap(_ConvNd)
        return self

    def __exit__(self, *exc_info: object) -> None:
        for cls, original in reversed(self._saved):
            cls.__init__ = original
        self._saved = []

    def line_of(self, obj: object) -> SourceLine | None:
        """The script's line that made an optimizer or a convolution, or None when it was made elsewhere."""
        entry = self._lines.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None
