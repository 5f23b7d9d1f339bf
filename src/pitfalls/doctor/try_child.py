"""One trial of `pitfalls doctor --try`, in a fresh process: the script run with a DataLoader setting applied from
outside (`applied`), its steps timed as the doctor times them, stopped after its timed steps (docs/doctor.md, "--try").

``python -m pitfalls.doctor.try_child SPEC OUT`` reads the trial (`Trial`, as JSON) and writes what `run_trial`
measured to OUT as JSON; the script's own output goes to stderr.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch.utils.data import DataLoader

from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.run import run_doctor

__all__ = ["SETTINGS", "LoaderSetting", "Trial", "applied", "describe", "main", "parse_setting", "run_trial"]

LoaderSetting = Mapping[str, int | bool]
# The DataLoader arguments a setting may change, and what each takes.
SETTINGS = {"num_workers": "an int >= 0", "pin_memory": "True or False", "persistent_workers": "True or False",
            "prefetch_factor": "an int >= 1"}
# With num_workers=0 these are dropped: DataLoader refuses them then.
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


@dataclass(frozen=True)
class Trial:
    """What one trial runs: the script with its arguments, the DataLoader arguments to override (empty: the
    script's own), and the doctor's warm-up and timed steps, batches digested, budget and ``--cuda-on-cpu`` (as
    `DoctorOptions`)."""

    script: str
    args: tuple[str, ...]
    setting: dict[str, Any] = field(default_factory=dict)
    warmup: int = 3
    steps: int = 10
    digests: int = 4
    budget_s: float = 300.0
    cuda_on_cpu: bool = False


def run_trial(trial: Trial) -> dict[str, Any]:
    """Run one trial in this process; returns what it measured."""
    options = DoctorOptions(warmup=trial.warmup, steps=trial.steps, budget_s=trial.budget_s, trial=True,
                            digests=trial.digests, cuda_on_cpu=trial.cuda_on_cpu)
    with applied(trial.setting):
        report = run_doctor(trial.script, trial.args, options, quiet_stdout=True)
    loader = report.loader
    return {
        "measured": report.steps.measured,
        "median_ms": report.step_ms[0] if report.step_ms else None,
        "mean_ms": report.step_ms[2] if report.step_ms else None,
        "wait_share": loader.wait_share if loader is not None else None,
        "workers": loader.workers if loader is not None else None,
        "digests": list(report.digests), "ended": report.ended,
        "failure": report.failure.last_line if report.failure is not None else None,
    }


def main(argv: Sequence[str]) -> int:
    """``python -m pitfalls.doctor.try_child SPEC OUT``; returns 0 once OUT is written."""
    spec, out = argv
    raw = json.loads(spec)
    trial = Trial(**{**raw, "args": tuple(raw["args"])})
    Path(out).write_text(json.dumps({"trial": asdict(trial), **run_trial(trial)}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
