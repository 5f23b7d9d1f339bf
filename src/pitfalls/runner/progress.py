"""Where the main job's time goes: asv's progress with the time left, and at the end the seconds per family.

asv prints a line as each benchmark ends, but a benchmark can run for minutes (the calibration table's errors took
190 s on 2 cores) with nothing printed. So the job passes asv's output through and, every `HEARTBEAT_S` seconds of
silence, says what runs and about how long is left, by the durations asv recorded for the same benchmarks in the
newest committed results of this machine (or of another machine when this one has none). At the end it reads the
durations of the run just made: seconds per family and the slowest benchmarks (`time_table`).
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from pitfalls import asv_files
from pitfalls.markdown import table

__all__ = ["HEARTBEAT_S", "Durations", "Progress", "durations_of", "newest_durations", "time_table"]

# Seconds without a line from asv after which the job says what runs and what is left.
HEARTBEAT_S = 30.0
# asv's line as a benchmark ends: "[ 12.50%] ··· bench_loss.Step.time_step    ok"; and as one starts (with
# --show-stderr): "[ 12.50%] ··· Running (bench_loss.Step.time_step--)..".
_ENDED = re.compile(r"^\[\s*[\d.]+%\] ·+ (?P<name>bench_\w+\.\w+\.\w+)\s+(?P<status>ok|failed|n/a|skipped)\b")
_STARTED = re.compile(r"Running \((?P<name>bench_\w+\.\w+\.\w+)--\)")


@dataclass(frozen=True)
class Durations:
    """Seconds asv recorded for each benchmark (all its parameter sets) and each ``setup_cache``, in one results file.

    Attributes:
        benchmarks: benchmark name -> seconds.
        setup_caches: module -> seconds of its setup caches.
        source: the results file they were read from.
    """

    benchmarks: Mapping[str, float] = field(default_factory=dict)
    setup_caches: Mapping[str, float] = field(default_factory=dict)
    source: str = ""

    @property
    def total(self) -> float:
        return sum(self.benchmarks.values()) + sum(self.setup_caches.values())


def durations_of(path: Path) -> Durations:
    """The durations recorded in one asv results file (an unreadable file gives none)."""
    try:
        benchmarks, caches = asv_files.durations(asv_files.load(path))
    except asv_files.Unreadable:
        return Durations(source=str(path))
    return Durations(benchmarks, caches, str(path))


def newest_durations(results_dir: Path, machine: str, env: str) -> Durations:
    """The durations of the newest results file (by commit date) of ``env`` (a glob, ``installed-*``) on
    ``machine``, else of the newest of any machine."""

    def files(name: str) -> list[Path]:
        found = [results_dir / relative for relative in asv_files.result_files(results_dir, name)]
        return [p for p in found if fnmatch.fnmatch(p.name, f"*-{env}.json")] or found

    found = []
    for path in files(machine) or [p for name in asv_files.machines(results_dir) for p in files(name)]:
        with contextlib.suppress(asv_files.Unreadable):
            results = asv_files.load(path)
            benchmarks, caches = asv_files.durations(results)
            if benchmarks:  # asv's "date" is its commit's: a fresh clone gives every file the same mtime
                date = results.date if isinstance(results.date, (int, float)) else 0
                found.append((date, Durations(benchmarks, caches, str(path))))
    return max(found, key=lambda dated: dated[0])[1] if found else Durations()


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds >= 90 else f"{seconds:.0f} s"


class Progress:
    """asv's output passed through, with what runs and about how long is left whenever it stays silent.

    Args:
        expected: the durations to expect (`newest_durations`).
        out: where the lines go.
        heartbeat_s: seconds of silence before a status line.
        clock: seconds, monotonic (tests plant a fake).
    """

    def __init__(self, expected: Durations, out: TextIO = sys.stdout, heartbeat_s: float = HEARTBEAT_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.expected, self.out, self.heartbeat_s, self.clock = expected, out, heartbeat_s, clock
        self.began = self.last_line = clock()
        self.done: set[str] = set()
        self.running = ""
        self.running_since = self.began
        self._lock = threading.Lock()

    def line(self, text: str) -> None:
        """One line of asv's output: passed through, and read for the benchmark it ends or starts."""
        ended, started = _ENDED.search(text), _STARTED.search(text)
        with self._lock:
            self.out.write(text if text.endswith("\n") else text + "\n")
            self.out.flush()
            self.last_line = self.clock()
            if ended:
                self.done.add(ended["name"])
                # asv runs the benchmarks in name order: the next one it knows of is the one running now.
                later = sorted(name for name in self.expected.benchmarks if name > ended["name"]
                               and name not in self.done)
                self.running, self.running_since = (later[0] if later else ""), self.last_line
            if started:
                self.running, self.running_since = started["name"], self.last_line

    def left_s(self) -> float | None:
        """Seconds left by the expected durations: the benchmarks not ended yet (the one running, less what it ran);
        None with nothing to go by."""
        if not self.expected.benchmarks:
            return None
        left = sum(s for name, s in self.expected.benchmarks.items() if name not in self.done)
        if self.running in self.expected.benchmarks:
            left -= min(self.clock() - self.running_since, self.expected.benchmarks[self.running])
        modules_done = {name.split(".")[0] for name in self.done}
        left += sum(s for module, s in self.expected.setup_caches.items() if module not in modules_done)
        return max(left, 0.0)

    def status(self) -> str:
        """What runs, how many benchmarks ended, and about how long is left."""
        now = self.clock()
        running = f"{self.running} for {_minutes(now - self.running_since)}, " if self.running else ""
        left = self.left_s()
        guess = (f"about {_minutes(left)} left by the durations of {Path(self.expected.source).name}"
                 if left is not None else "no earlier run to say how long is left")
        total = len(self.expected.benchmarks) or "?"
        return f"== {_minutes(now - self.began)} in: {running}{len(self.done)} of {total} benchmarks done, {guess}"

    def beat(self) -> bool:
        """Print the status if asv has been silent for the heartbeat; whether it printed."""
        with self._lock:
            if self.clock() - self.last_line < self.heartbeat_s:
                return False
            self.out.write(self.status() + "\n")
            self.out.flush()
            self.last_line = self.clock()
            return True

    def follow(self, lines: Iterable[str]) -> None:
        """Pass every line through, a heartbeat thread beating until the lines end."""
        ended = threading.Event()

        def heartbeat() -> None:
            while not ended.wait(min(self.heartbeat_s, 5.0)):
                self.beat()

        beater = threading.Thread(target=heartbeat, daemon=True)
        beater.start()
        try:
            for text in lines:
                self.line(text)
        finally:
            ended.set()
            beater.join()


def time_table(durations: Durations, slowest: int = 5) -> list[str]:
    """Seconds per family (benchmarks and setup caches) and the ``slowest`` benchmarks, as a markdown table."""
    families: defaultdict[str, float] = defaultdict(float)
    for name, seconds in [*durations.benchmarks.items(), *durations.setup_caches.items()]:
        families[name.split(".")[0].removeprefix("bench_")] += seconds
    by_family = [[family, f"{seconds:.0f}"] for family, seconds in sorted(families.items(), key=lambda kv: -kv[1])]
    by_family.append([f"all ({len(durations.benchmarks)} benchmarks, setup caches included)", f"{durations.total:.0f}"])
    ranked = sorted(durations.benchmarks.items(), key=lambda kv: -kv[1])[:slowest]
    lines = table(("family", "seconds"), by_family) + [""]
    lines += table(("slowest benchmark", "seconds"), [[f"`{name}`", f"{seconds:.0f}"] for name, seconds in ranked])
    return lines

