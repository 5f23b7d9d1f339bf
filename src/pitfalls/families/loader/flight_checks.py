"""Known answers for the loader's batch-size figures, all read from one run of a planted loader.

The planted data set's items are uint8 images 3 x 32 x 32 and masks 32 x 32 (3,072 and 1,024 bytes), in batches
of 4: a batch is 16,384 bytes, its image segment three pages and its mask segment one, so a segment's size in
``/proc/PID/maps`` (whole pages) and its file size agree. With W = 2 workers, ``prefetch_factor`` 2 and pinning
off, the loader at rest (`probes.in_flight_of`, the published figures' own routine) holds:

- bytes per batch: B x the item's bytes = 16,384 (`probes.batch_nbytes`, from the tensors handed over);
- batches in flight: W x prefetch_factor = 4 (not the article's one per worker);
- bytes in flight: W x prefetch_factor x 16,384 = 65,536, the torch segments the main process and the workers
  hold (`pitfalls.probes.group_memory.shm_segments`), each once.

Every answer is exact: each row's tolerance is 0.
"""

from __future__ import annotations

from collections.abc import Callable

from pitfalls.families.loader import check_data, probes
from pitfalls.families.loader.probes import InFlight
from pitfalls.families.loader.steps import LoaderStep
from pitfalls.known.one_run import OneRun
from pitfalls.known.table import Check, Reading

__all__ = ["BATCH", "CHECKS", "ITEM_BYTES", "PREFETCH", "SIZE", "WORKERS", "FlightRun", "SizedItems",
           "flight_checks", "planted_step"]

SIZE = 32
BATCH = 4
WORKERS = 2
PREFETCH = 2
ITEMS = 16
# An item: a uint8 image 3 x S x S and a uint8 mask S x S.
ITEM_BYTES = 3 * SIZE * SIZE + SIZE * SIZE

FlightRoutine = Callable[[LoaderStep], InFlight]


class SizedItems(check_data.Items):
    """A planted data set of items of a known size: a uint8 image 3 x S x S and a uint8 mask S x S."""

    size = SIZE


def planted_step(device: str = "cpu") -> LoaderStep:
    """A not yet started ``uint8`` loader step of `SizedItems`, W workers, ``prefetch_factor`` 2, pinning off."""
    return check_data.step(SizedItems(ITEMS), device, start=False, image_size=SIZE, batch=BATCH, num_workers=WORKERS,
                        prefetch_factor=PREFETCH, pin_memory=False)


class FlightRun:
    """The planted loader at rest, read once by ``flight`` (`probes.in_flight_of`, or a faulty routine in a test),
    shared by the three rows."""

    def __init__(self, flight: FlightRoutine = probes.in_flight_of) -> None:
        self.flight = flight
        self.run: OneRun[InFlight] = OneRun(self._measure)

    def _measure(self, device: str) -> InFlight:
        with planted_step(device) as step:
            return self.flight(step)

    def batch_bytes(self, device: str) -> Reading:
        """Bytes per batch: B x the item's bytes."""
        got = self.run.take("batch bytes", device)
        return Reading(BATCH * ITEM_BYTES, got.bytes_per_batch,
                       f"batch {BATCH} of a 3x{SIZE}x{SIZE} uint8 image and a {SIZE}x{SIZE} uint8 mask")

    def batches(self, device: str) -> Reading:
        """Batches in flight: W x prefetch_factor."""
        got = self.run.take("batches", device)
        return Reading(WORKERS * PREFETCH, got.batches,
                       f"W={WORKERS}, prefetch_factor {PREFETCH}; the article's count: {got.workers}")

    def bytes(self, device: str) -> Reading:
        """Bytes in flight: W x prefetch_factor x the batch's bytes."""
        got = self.run.take("bytes", device)
        return Reading(WORKERS * PREFETCH * BATCH * ITEM_BYTES, got.measured_bytes,
                       f"torch segments of the main process and {WORKERS} workers at rest, less those held before; "
                       f"the article's arithmetic: {got.article_bytes:,}")


def flight_checks(run: FlightRun | None = None) -> tuple[Check, ...]:
    """The three rows, read from one run of the planted loader (``run``; the suite's own by default)."""
    run = run or FlightRun()
    why = "exact: sizes of tensors and whole-page segments; a count of batches"
    return (
        check_data.row(f"loader: bytes per batch, {BATCH} x {ITEM_BYTES} B", probes.BYTES_PER_BATCH, "bytes", 0.0,
                    run.batch_bytes, why),
        check_data.row(f"loader: batches in flight, W={WORKERS} x prefetch {PREFETCH}", probes.BATCHES_IN_FLIGHT,
                    "batches", 0.0, run.batches, why),
        check_data.row(f"loader: bytes in flight, W={WORKERS} x prefetch {PREFETCH}", probes.BYTES_IN_FLIGHT, "bytes",
                    0.0, run.bytes, why),
    )


CHECKS = flight_checks()
