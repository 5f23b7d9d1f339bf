"""Article 001: the DataLoader advice, as a ladder of variants that each add one piece of it.

A segmentation batch (B images 3 x S x S, B masks S x S of C classes) is loaded, delivered to the device and
consumed by a small training step. Every variant delivers the same normalized float32 images and int64 masks on the
device; each rung moves one piece of work off the host or out of the loop (the rungs' table is in
docs/families/loader.md, the package's modules in docs/layout.md). The floor iterates batches that were collated
once, in RAM, as uint8: the job with no loading at all.

This module assembles `FAMILY` from the entry, the instruments and their checks, and re-exports what a user calls;
nothing in the package imports it.
"""

from __future__ import annotations

import dataclasses

from pitfalls.families.loader import flight_checks, memory_checks, probes, start_checks, timing_checks, verdict
from pitfalls.families.loader.entry import ENTRY, build
from pitfalls.families.loader.steps import make_step
from pitfalls.families.loader.variants import VARIANTS

FAMILY = dataclasses.replace(
    ENTRY, own_figures=probes.own_figures,
    calibrations=(*timing_checks.CHECKS, *memory_checks.CHECKS, *flight_checks.CHECKS, *start_checks.CHECKS),
    benchmark_figures={
        "track_samples_per_second": probes.SAMPLES_PER_SECOND,
        "track_wait_share": probes.WAIT_SHARE,
        "track_pss": probes.PEAK_PSS,
        "track_uss": probes.PEAK_USS,
        "track_copied_per_item": probes.COPIED_PER_ITEM,
        "track_worker_growth": memory_checks.METADATA_GROWTH,
        "track_group_uss": memory_checks.METADATA_GROUP_USS,
        "track_group_pss": memory_checks.METADATA_GROUP_PSS,
        "track_table": memory_checks.METADATA_TABLE,
        "track_starves_below": verdict.STARVES_BELOW,
        "track_bytes_per_batch": probes.BYTES_PER_BATCH,
        "track_batches_in_flight": probes.BATCHES_IN_FLIGHT,
        "track_bytes_in_flight": probes.BYTES_IN_FLIGHT,
        "track_time_to_first_batch": probes.TIME_TO_FIRST_BATCH,
        "track_epoch_start_fresh": probes.EPOCH_START_FRESH,
        "track_epoch_start_persistent": probes.EPOCH_START_PERSISTENT,
    },
)

__all__ = ["ENTRY", "FAMILY", "VARIANTS", "build", "make_step"]
