"""Where the script made its optimizers and its convolutions (or the objects of other classes), for the rules that
name a definition's line."""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, TypeVar

import torch
from torch.nn.modules.conv import _ConvNd

from pitfalls.probes.sites import SourceLine, locate_dispatch, source_line

__all__ = ["Definitions"]

_Made = TypeVar("_Made")


class Definitions:
    """Record the line that made each object of ``classes`` while the block runs.

    Each class's ``__init__`` (every subclass's too: an optimizer's, a convolution's) is wrapped for the run and
    restored after it; each object made is kept weakly with the script's line that made it (the innermost frame
    outside torch and the doctor). With the optimizers among the classes, it also says whether the script made any
    optimizer, which decides how its steps are counted (`steps.StepCounter`).

    Args:
        classes: the classes whose objects' lines are recorded (default: `torch.optim.Optimizer` and convolutions).
    """

    def __init__(self, classes: tuple[type, ...] = (torch.optim.Optimizer, _ConvNd)) -> None:
        self._classes = classes
        self._lines: dict[int, tuple[weakref.ref[Any], SourceLine | None]] = {}
        self._undo = contextlib.ExitStack()
        self.optimizers_made = False

    def _wrap(self, cls: type) -> None:
        original = cls.__init__  # type: ignore[misc]
        definitions = self

        @functools.wraps(original)
        def init(obj: Any, *args: Any, **kwargs: Any) -> None:
            definitions.optimizers_made |= isinstance(obj, torch.optim.Optimizer)
            original(obj, *args, **kwargs)
            definitions._lines[id(obj)] = (weakref.ref(obj), source_line(locate_dispatch()[0]))

        self._undo.callback(setattr, cls, "__init__", original)
        cls.__init__ = init  # type: ignore[misc]

    def __enter__(self) -> Definitions:
        for cls in self._classes:
            self._wrap(cls)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._undo.close()

    def line_of(self, obj: object) -> SourceLine | None:
        """The script's line that made an object, or None when it was made elsewhere."""
        entry = self._lines.get(id(obj))
        return entry[1] if entry is not None and entry[0]() is obj else None

    def made(self, cls: type[_Made]) -> list[tuple[_Made, SourceLine | None]]:
        """Every object of ``cls`` made in the block and still alive, with its line."""
        alive = ((ref(), line) for ref, line in self._lines.values())
        return [(obj, line) for obj, line in alive if isinstance(obj, cls)]
