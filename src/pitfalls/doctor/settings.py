"""A DataLoader setting for `pitfalls doctor --try`: parsed from the command line, applied from outside the script.

A setting is a few of the DataLoader's own arguments, ``num_workers=2,pin_memory=True``. Applied, it overrides them
in every DataLoader the script builds (`DataLoader.__init__` wrapped for the block), whatever the script passed.
With ``num_workers=0`` the arguments that need workers (``prefetch_factor``, ``persistent_workers``) are dropped,
as DataLoader refuses them then.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Iterator, Mapping
from typing import Any

from torch.utils.data import DataLoader

__all__ = ["SETTINGS", "LoaderSetting", "applied", "describe", "parse_setting"]

LoaderSetting = Mapping[str, int | bool]
# The DataLoader arguments a setting may change, and what each takes.
SETTINGS = {"num_workers": "an int >= 0", "pin_memory": "True or False", "persistent_workers": "True or False",
            "prefetch_factor": "an int >= 1"}
_NEED_WORKERS = ("prefetch_factor", "persistent_workers")


def _value(name: str, text: str) -> int | bool:
    if name in ("pin_memory", "persistent_workers"):
        if text not in ("True", "False"):
            raise ValueError(f"{name}={text!r} is not allowed; {name} takes True or False")
        return text == "True"
    least = 0 if name == "num_workers" else 1
    try:
        number = int(text)
    except ValueError:
        number = least - 1
    if number < least:
        raise ValueError(f"{name}={text!r} is not allowed; {name} takes {SETTINGS[name]}")
    return number


def parse_setting(text: str) -> dict[str, int | bool]:
    """Read ``"num_workers=2,pin_memory=True"``.

    Args:
        text: comma-separated ``name=value`` pairs of `SETTINGS`.

    Returns:
        The setting, by name.

    Raises:
        ValueError: a name that is not a setting, a value it does not take, or no pair at all (one line).
    """
    setting: dict[str, int | bool] = {}
    for pair in (p.strip() for p in text.split(",")):
        name, equals, value = pair.partition("=")
        name = name.strip()
        if not equals or name not in SETTINGS:
            raise ValueError(f"{pair!r} is not a DataLoader setting; allowed: {', '.join(f'{n}=...' for n in SETTINGS)}"
                             " (comma-separated), or 'loader' for settings chosen from the cores and the wait")
        setting[name] = _value(name, value.strip())
    return setting


def describe(setting: LoaderSetting) -> str:
    """The setting as the command line writes it ("as written" for none)."""
    return ",".join(f"{k}={v}" for k, v in setting.items()) or "as written"


@contextlib.contextmanager
def applied(setting: LoaderSetting) -> Iterator[None]:
    """Build every DataLoader with ``setting`` in place of the script's own arguments, inside the block."""
    original = DataLoader.__init__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def init(loader: DataLoader, *args: Any, **kwargs: Any) -> None:
        bound = signature.bind(loader, *args, **kwargs)
        bound.arguments.update(setting)
        if not bound.arguments.get("num_workers"):
            for name in _NEED_WORKERS:
                bound.arguments.pop(name, None)
        original(*bound.args, **bound.kwargs)

    DataLoader.__init__ = init  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        DataLoader.__init__ = original  # type: ignore[method-assign]
