"""Article 001, the DataLoader advice: one batch loaded, delivered to the device and consumed per call.

The figures every family has (``Batch``, ``Speedup``, ``Cuda``: an unpinned copy waits; ``Nvml``: a device starved
by its loader shows as idle), then the loader's own, each one delegating line into
pitfalls.families.loader.probes: samples/s, bytes per batch, time to first batch, PSS and USS of the main process
plus its workers, batches and bytes in flight, copy-on-write growth of the workers per item read, the verdict (wait
share in next(), the step cost below which the loader starves the device), epoch starts and issue 13246's
records. Each sweeps the family's variants and floor over its grid; a figure that does not apply to a case (no
workers, no room, more workers than cores for the timed figures) is n/a with the reason.
"""

import itertools
from typing import Any

# torch.optim's constructors import torch._dynamo on first use: 1.7 s (7 s at load 10) in every process that builds
# a case. asv imports the benchmark modules once in its forkserver and forks each case from it, so importing it
# here pays that once per run instead of once per case (about 140 cases on the quick grid).
import torch._dynamo  # noqa: F401

from pitfalls import measure
from pitfalls.families.loader import epochs, metadata, probes, steady, verdict
from pitfalls.units import MIB

from . import common, shapes

# asv runs ``setup`` before every sample (asv-runner >= 0.3), so each sample is one batch timed right after its own
# settle (a fresh start, the prefilled batches discarded): a few samples suffice on the quick grid, where 60 of them
# (60 worker starts a case) took most of the loader's time.
BATCH_REPEAT = {"quick": (10, 20, 2.0), "full": (steady.TIMED_PER_PREFILLED * steady.prefilled(2, 2), 200, 10.0)}


class Batch(shapes.Time):
    """Time of one batch at steady state: before every sample asv takes (``setup``), the case is started afresh
    and the batches its workers could make in advance are discarded; the sample is the next batch. asv's peakmem is
    this process's own peak RSS: with workers that is the parent alone, so those cases are n/a (see ``Memory``)."""

    family = "loader"
    repeat = BATCH_REPEAT[common.GRID.name]

    def setup(self, *params: Any) -> None:
        super().setup(*params)
        steady.settle(probes.batch_step(self.case))

    def time_batch(self, *params: Any) -> None:
        measure.step(self.case)

    def peakmem_batch(self, *params: Any) -> None:
        measure.step(self.case)


def _with_workers(cls: Any) -> list[tuple[Any, ...]]:
    at = cls.param_names.index("num_workers")
    return [values for values in itertools.product(*cls.params) if values[at] > 0]


Batch.peakmem_batch.skip_params = _with_workers(Batch)  # type: ignore[attr-defined]


class Speedup(shapes.Speedup):
    """Speedup over naive at steady state, by blocks (`Case.block`: one case live at a time, see
    `pitfalls.families.loader.steady`), through the one routine (`pitfalls.measure.speedup`)."""

    family = "loader"

    def track_speedup(self, *params: Any) -> float:
        return common.speedup(self.naive_case, self.case)


class Cuda(shapes.Cuda):
    family = "loader"


class Nvml(shapes.Nvml):
    family = "loader"


class _Figure(common.FamilyBenchmark):
    """One of the loader's own figures, measured by a probe of pitfalls.families.loader.probes for each case."""

    family = "loader"
    mode_axis = False

    def measure(self, probe: Any, params: tuple[Any, ...]) -> Any:
        """Run a probe on this parameter set (variant, device, sizes); a case that cannot run is n/a."""
        with common.skipping():
            return probe(**self.arguments(params))


class Throughput(_Figure):
    """Samples per second at steady state: loading, the copy to the device, the device-side normalize and the model
    step, synchronized."""

    units = {"track_samples_per_second": "samples/s"}

    def setup(self, *params: Any) -> None:
        self.step = probes.batch_step(self.build(params))

    def track_samples_per_second(self, *params: Any) -> float:
        return probes.samples_per_second(self.step)


class BatchBytes(_Figure):
    """Bytes of one batch as the loader hands it over, from its tensors (the article's 167,772,160 and 33,554,432
    at 32 x 512 x 512)."""

    units = {"track_bytes_per_batch": "bytes"}

    def setup(self, *params: Any) -> None:
        self.bytes = self.measure(probes.bytes_per_batch, params)

    def track_bytes_per_batch(self, *params: Any) -> int:
        return self.bytes


class FirstBatch(_Figure):
    """Seconds from starting a fresh loader (its workers included) to its first batch consumed on the device."""

    units = {"track_time_to_first_batch": "seconds"}

    def setup(self, *params: Any) -> None:
        self.seconds = self.measure(probes.time_to_first_batch, params)

    def track_time_to_first_batch(self, *params: Any) -> float:
        return self.seconds


class Memory(_Figure):
    """Peak PSS and USS of the whole loader group (the main process and every worker, sampled every 15 ms in the
    background, collation included) while a fresh loader delivers an epoch (PSS counts a shared page once; RSS
    would count it once per process). Cases with more workers than cores are measured."""

    units = {"track_pss": "MiB", "track_uss": "MiB"}

    def setup(self, *params: Any) -> None:
        self.memory = self.measure(probes.peak_memory, params)

    def track_pss(self, *params: Any) -> float:
        return self.memory.peak_pss / MIB

    def track_uss(self, *params: Any) -> float:
        return self.memory.peak_uss / MIB


class InFlight(_Figure):
    """Batches made ahead of the consumer, and the shared memory they hold, once a loader rests: against the
    article's num_workers x bytes per batch and DataLoader's num_workers x prefetch_factor x bytes per batch."""

    units = {"track_batches_in_flight": "batches", "track_bytes_in_flight": "MiB"}

    def setup(self, *params: Any) -> None:
        self.flight = self.measure(probes.in_flight, params)

    def track_batches_in_flight(self, *params: Any) -> int:
        return self.flight.batches

    def track_bytes_in_flight(self, *params: Any) -> float:
        return common.figure(self.flight.measured_bytes) / MIB


class CopyOnWrite(_Figure):
    """Growth of the workers' private memory per item read over an epoch, after their first batch: the pages that
    reference counting copies out of the parent (PyTorch issue 13246), for a Python list of per-item objects
    against one packed buffer (the ``storage`` axis)."""

    units = {"track_copied_per_item": "KiB/item"}

    def setup(self, *params: Any) -> None:
        self.growth = self.measure(probes.copy_on_write, params)

    def track_copied_per_item(self, *params: Any) -> float:
        return common.figure(self.growth.per_item) / 1024


class Verdict(_Figure):
    """Is the loader the bottleneck? The share of each batch the step waits in ``next()`` at steady state, and the
    step cost below which the loader starves the device (wait share above `verdict.WAIT_THRESHOLD`), with a step
    of ``model_ms`` planted milliseconds more than the model step (`pitfalls.families.loader.verdict`). Every case
    is measured once, alone, in one process (``setup_cache``), and both figures read that run."""

    extra_axes = {"model_ms": list(verdict.MODEL_MS[common.GRID.name])}
    units = {"track_wait_share": "share", "track_starves_below": "ms"}
    timeout = 1800

    def setup_cache(self) -> dict[tuple[Any, ...], Any]:
        return measure.case_table(verdict.verdict, self.param_names, self.params)  # type: ignore[attr-defined]

    def setup(self, table: dict[tuple[Any, ...], Any], *params: Any) -> None:
        with common.skipping():
            self.verdict = measure.lookup(table, params)

    def track_wait_share(self, table: Any, *params: Any) -> float:
        return self.verdict.wait_share

    def track_starves_below(self, table: Any, *params: Any) -> float:
        return common.figure(self.verdict.starves_below_s) * 1e3


class EpochStart(_Figure):
    """Seconds to the first batch of an epoch after a whole epoch, persistent_workers off (new workers) and on (the
    same workers), both by one routine (`pitfalls.families.loader.epochs`); n/a without workers for "on". Every
    case is measured once, in one process (``setup_cache``)."""

    units = {"track_epoch_start_fresh": "seconds", "track_epoch_start_persistent": "seconds"}
    timeout = 1800

    def setup_cache(self) -> dict[tuple[Any, ...], Any]:
        return measure.case_table(epochs.epoch_starts, self.param_names, self.params)  # type: ignore[attr-defined]

    def setup(self, table: dict[tuple[Any, ...], Any], *params: Any) -> None:
        with common.skipping():
            self.starts = measure.lookup(table, params)

    def track_epoch_start_fresh(self, table: Any, *params: Any) -> float:
        return self.starts.fresh

    def track_epoch_start_persistent(self, table: Any, *params: Any) -> float:
        return common.figure(self.starts.persistent)


class Metadata(common.Benchmark):
    """PyTorch issue 13246: per-item records (path, size, an annotation dict) held as a Python list of objects
    against numpy arrays, read by forked workers over one full epoch. Each worker's USS growth from its start
    (the pages of the table it copied), and the whole group's USS and PSS (main process plus workers) at the
    epoch's end; the table's own size to read them against. Measured once per parameter set, in one process. Its
    axes are the records' form and size, not the family's cases."""

    param_names = ["metadata", "num_workers", "items"]
    params = [list(metadata.RECORD_FORMS), *map(list, metadata.GRIDS[common.GRID.name].values())]
    units = {name: "MiB" for name in ("track_worker_growth", "track_group_uss", "track_group_pss", "track_table")}
    timeout = 1800

    def setup_cache(self) -> dict[tuple[Any, ...], Any]:
        return measure.case_table(metadata.records_memory, self.param_names, self.params)

    def setup(self, table: dict[tuple[Any, ...], Any], *params: Any) -> None:
        with common.skipping():
            self.memory = measure.lookup(table, params)

    def track_worker_growth(self, table: Any, *params: Any) -> float:
        return metadata.mib(self.memory.growth) / len(self.memory.growth)

    def track_group_uss(self, table: Any, *params: Any) -> float:
        return metadata.mib(self.memory.group_uss)

    def track_group_pss(self, table: Any, *params: Any) -> float:
        return metadata.mib(self.memory.group_pss)

    def track_table(self, table: Any, *params: Any) -> float:
        return metadata.mib(self.memory.dataset_bytes)
