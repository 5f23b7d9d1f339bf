"""Article 001, the DataLoader advice: one batch loaded, delivered to the device and consumed per call.

The shared figures (benchmarks/common.py) made for the loader family from its entry (pitfalls.families.loader):
``Batch`` (time_batch, peakmem_batch), ``Speedup``, ``Cuda`` (real syncs per batch: an unpinned copy waits) and
``Nvml`` (a device starved by its loader shows as idle). The loader's own figures follow, each delegating to
pitfalls.families.loader_probes: samples/s, bytes per batch, time to first batch, PSS and USS of the main process
plus its workers, batches and bytes in flight, and copy-on-write growth of the workers per item read. Each sweeps
the family's variants and floor over its grid; a figure that does not apply to a case (no workers, no room, more
workers than cores for the timed figures) is n/a with the reason.
"""

from typing import Any

from pitfalls.families import loader_probes as probes

from . import common

globals().update(common.family_classes("loader", __name__, time=("Batch", "batch")))

MIB = 2**20


class _Loader(common._FamilyBenchmark):
    family = "loader"

    def measure(self, probe: Any, params: tuple[Any, ...]) -> Any:
        """Run a probe on this parameter set (variant, device, sizes), turning a case that cannot run into n/a."""
        with common.skipping_unavailable_cases():
            return probe(**self.arguments(params))


class Throughput(_Loader):
    """Samples per second of a warmed-up case: loading, the copy to the device, the device-side normalize and
    the model step, synchronized."""

    units = {"track_samples_per_second": "samples/s"}

    def setup(self, *params: Any) -> None:
        self.step = probes.batch_step(self.build(params))

    def track_samples_per_second(self, *params: Any) -> float:
        return probes.samples_per_second(self.step)


class BatchBytes(_Loader):
    """Bytes of one batch as the loader hands it over, from its tensors (the article's 167,772,160 and 33,554,432
    at 32 x 512 x 512)."""

    units = {"track_bytes_per_batch": "bytes"}

    def setup(self, *params: Any) -> None:
        self.bytes = self.measure(probes.bytes_per_batch, params)

    def track_bytes_per_batch(self, *params: Any) -> int:
        return self.bytes


class FirstBatch(_Loader):
    """Seconds from starting a fresh loader (its workers included) to its first batch consumed on the device."""

    units = {"track_time_to_first_batch": "seconds"}

    def setup(self, *params: Any) -> None:
        self.seconds = self.measure(probes.time_to_first_batch, params)

    def track_time_to_first_batch(self, *params: Any) -> float:
        return self.seconds


class Memory(_Loader):
    """Peak PSS and USS of the main process plus its workers while a fresh loader delivers an epoch (PSS counts a
    shared page once; RSS would count it once per process). Cases with more workers than cores are measured."""

    units = {"track_pss": "MiB", "track_uss": "MiB"}

    def setup(self, *params: Any) -> None:
        self.memory = self.measure(probes.peak_memory, params)

    def track_pss(self, *params: Any) -> float:
        return self.memory.pss / MIB

    def track_uss(self, *params: Any) -> float:
        return self.memory.uss / MIB


class InFlight(_Loader):
    """Batches made ahead of the consumer, and the shared memory they hold, once a loader rests: against the
    article's num_workers x bytes per batch and DataLoader's num_workers x prefetch_factor x bytes per batch."""

    units = {"track_batches_in_flight": "batches", "track_bytes_in_flight": "MiB"}

    def setup(self, *params: Any) -> None:
        self.flight = self.measure(probes.in_flight, params)

    def track_batches_in_flight(self, *params: Any) -> int:
        return self.flight.batches

    def track_bytes_in_flight(self, *params: Any) -> float:
        return self.flight.measured_bytes / MIB


class CopyOnWrite(_Loader):
    """Growth of the workers' private memory per item read over an epoch, after their first batch: the pages that
    reference counting copies out of the parent (PyTorch issue 13246), for a Python list of per-item objects
    against one packed buffer (the ``storage`` axis)."""

    units = {"track_copied_per_item": "KiB/item"}

    def setup(self, *params: Any) -> None:
        self.growth = self.measure(probes.copy_on_write, params)

    def track_copied_per_item(self, *params: Any) -> float:
        return self.growth.per_item / 1024
