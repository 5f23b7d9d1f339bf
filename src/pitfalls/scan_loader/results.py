"""What `pitfalls scan-loader` measured: per setting, the memory, the ceiling, and the report as JSON."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pitfalls.families.loader.steady import Steady
from pitfalls.families.loader.verdict import Bound, bound
from pitfalls.probes.anatomy import Anatomy
from pitfalls.probes.group_memory import GroupMemory
from pitfalls.result import Unavailable
from pitfalls.scan_loader.containers import Container

__all__ = ["Advice", "LoaderBound", "ScanLoaderReport", "Setting", "SettingResult", "WorkerGrowth", "verdict"]


@dataclass(frozen=True)
class Setting:
    """One way of building the loader."""

    workers: int
    pin_memory: bool = False

    @property
    def label(self) -> str:
        return f"workers={self.workers} pin={'on' if self.pin_memory else 'off'}"


@dataclass(frozen=True)
class LoaderBound:
    """The verdict of one setting.

    Attributes:
        verdict: "loader-bound" (the step waits in next() more than the loader family's `WAIT_THRESHOLD` of each
            batch, so that the scan and the family's verdict judge alike) or "step-bound".
        wait_share: that share.
        below_ceiling: the ceiling's samples/s over this setting's (1.0: at the ceiling), or None without one.
    """

    verdict: Bound
    wait_share: float
    below_ceiling: float | None

    @property
    def margin(self) -> str:
        ceiling = f"; the ceiling is {self.below_ceiling:.2f}x this rate" if self.below_ceiling else ""
        return f"waits {self.wait_share:.0%} of each batch in next(){ceiling}"


def verdict(steady: Steady, ceiling: float | None) -> LoaderBound:
    """Loader-bound or step-bound, from the wait in next() and the ceiling."""
    share = steady.wait_share
    ratio = ceiling / steady.samples_per_second if ceiling and steady.samples_per_second > 0 else None
    return LoaderBound(bound(share), share, ratio)


@dataclass(frozen=True)
class SettingResult:
    """One setting's run, or why it was skipped.

    Attributes:
        setting: the options.
        steady: the timed run, or None when skipped.
        skipped: why it was not timed ("" when it was).
        peak: the process group's memory during the run (this process and its workers), or why not.
        bound: the verdict, when timed.
    """

    setting: Setting
    steady: Steady | None
    skipped: str = ""
    peak: GroupMemory | Unavailable = Unavailable("not timed")
    bound: LoaderBound | None = None


@dataclass(frozen=True)
class WorkerGrowth:
    """Workers' private memory growth over (part of) an epoch, read at rest: what reading items copied on write.

    Attributes:
        workers: num_workers of the run.
        growth: each worker's USS growth (bytes).
        items_read: items consumed between the two readings.
    """

    workers: int
    growth: tuple[int, ...]
    items_read: int

    @property
    def per_item(self) -> float:
        """Bytes copied into the workers, together, per item read."""
        return sum(self.growth) / self.items_read


@dataclass(frozen=True)
class Advice:
    """One piece of advice.

    Attributes:
        change: what to change.
        gain: the factor it gives, in ``unit``, for ranking (1.0 where the arithmetic gives no factor).
        measured: True when the gain was measured, False when it is the arithmetic.
        figure: the figure behind it.
        why: one line.
        unit: what the gain multiplies: "samples/s", "fewer bytes", or "" (no factor).
    """

    change: str
    gain: float
    measured: bool
    figure: str
    why: str
    unit: str = ""


@dataclass(frozen=True)
class ScanLoaderReport:
    """Everything `pitfalls scan-loader` found."""

    target: str
    step: str | None
    device: str
    budget_s: float
    elapsed_s: float
    anatomy: Anatomy
    prefetch_factor: int
    batches_per_epoch: int | None
    items: int | None
    ceiling: Steady | Unavailable
    settings: tuple[SettingResult, ...]
    epoch_start: dict[str, float | Unavailable]
    copy_on_write: WorkerGrowth | Unavailable
    containers: tuple[Container, ...]
    touch_copied: dict[str, int]
    advice: tuple[Advice, ...] = field(default=())

    @property
    def ceiling_samples_per_second(self) -> float | Unavailable:
        if isinstance(self.ceiling, Unavailable):
            return self.ceiling
        return self.ceiling.samples_per_second

    def as_json(self) -> dict[str, Any]:
        """The report as plain JSON values; a figure that was not measured is ``{"unavailable": reason}``."""

        def value(figure: Any) -> Any:
            return {"unavailable": figure.reason} if isinstance(figure, Unavailable) else figure

        def per_setting(read: Any) -> dict[str, Any]:
            return {r.setting.label: (read(r) if r.steady is not None else {"unavailable": r.skipped})
                    for r in self.settings}

        workers = sorted({r.setting.workers for r in self.settings})
        return {
            "target": self.target,
            "step": self.step,
            "device": self.device,
            "budget_s": self.budget_s,
            "elapsed_s": self.elapsed_s,
            "bytes_per_batch": self.anatomy.bytes_per_batch,
            "bytes_per_batch_if_smaller": self.anatomy.bytes_if_smaller,
            "samples_per_batch": self.anatomy.samples_per_batch,
            "tensors": [dict(asdict(t), shape=list(t.shape)) for t in self.anatomy.tensors],
            "prefetch_factor": self.prefetch_factor,
            "in_flight_bytes": {str(w): self.anatomy.in_flight_bytes(w, self.prefetch_factor) for w in workers},
            "samples_per_second": per_setting(lambda r: r.steady.samples_per_second),
            "ceiling_samples_per_second": value(self.ceiling_samples_per_second),
            "wait_share": per_setting(lambda r: r.steady.wait_share),
            "verdict": per_setting(lambda r: {"verdict": r.bound.verdict, "margin": r.bound.margin,
                                              "below_ceiling": r.bound.below_ceiling}),
            "batches_timed": per_setting(lambda r: {"timed": r.steady.batches, "discarded": r.steady.discarded,
                                                    "short": r.steady.short or None}),
            "time_to_first_batch_s": {k: value(v) for k, v in self.epoch_start.items()},
            "peak_memory": {r.setting.label: value(r.peak) if isinstance(r.peak, Unavailable)
                            else {"pss": r.peak.peak_pss, "uss": r.peak.peak_uss, "shm": r.peak.peak_shm,
                                  "processes": r.peak.peak_processes, "samples": r.peak.samples}
                            for r in self.settings},
            "copy_on_write_per_item": value(self.copy_on_write.per_item
                                            if isinstance(self.copy_on_write, WorkerGrowth) else self.copy_on_write),
            "copy_on_write": value(asdict(self.copy_on_write) if isinstance(self.copy_on_write, WorkerGrowth)
                                   else self.copy_on_write),
            "containers": [dict(asdict(c), copied_when_touched=self.touch_copied.get(c.name)) for c in self.containers],
            "advice": [asdict(f) for f in self.advice],
        }
