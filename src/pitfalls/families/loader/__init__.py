"""Article 001: the DataLoader advice, as a ladder of variants that each add one piece of it.

A segmentation batch (B images 3 x S x S, B masks S x S of C classes) is loaded, delivered to the device and
consumed by a small training step. Every variant delivers the same thing: the normalized float32 image batch and
the int64 mask batch on the device. They differ in where the work is done:

=============== ========================================== ============================= ====================
variant         where an item comes from                   per item on the host           on the device
=============== ========================================== ============================= ====================
naive           disk, ``source_scale`` x larger            read, decode, resize,          -
                                                           normalize to float32, int64
offline         disk, resized once offline (advice 3)      read, decode, normalize       -
ram_encoded     encoded bytes in RAM (advice 1)            decode, normalize             -
ram_decoded     decoded pixels in RAM                      normalize                     -
uint8           decoded pixels in RAM                      nothing: uint8 image and      normalize (a
                                                           uint8 mask (advice 4)         ``Normalize`` module),
                                                                                         mask to int64
host_decode     JPEG bytes in RAM                          decode (OpenCV), uint8 out    normalize, mask to int64
gpu_decode      JPEG bytes in RAM                          nothing                       decode (torchvision
                                                                                         ``decode_jpeg``),
                                                                                         normalize
=============== ========================================== ============================= ====================

Each rung changes one thing from the one before; host_decode and gpu_decode differ only in where the JPEG is
decoded. ``pin_memory`` (pinned batches, copied with ``non_blocking``; CUDA only) is an axis of every rung,
switched on by none. uint8's host work left is the HWC -> CHW transpose of each image (a uint8 copy).

The floor iterates batches that were collated once, in RAM, as uint8: the job with no loading at all.

One call of a case is one batch: the next batch of a persistent iterator, copied to the device, then one step of
a 1x1-convolution head with cross-entropy and SGD, so that a device starved by its loader shows as idle. The
sampler cycles through seeded epochs without end, so the iterator (and its workers) lives as long as the case
and no epoch boundary stalls the pipeline; ``Case.close`` shuts the workers down.

Workers are DataLoader's own: ``num_workers``, ``prefetch_factor``, ``pin_memory``, ``timeout``,
``multiprocessing_context`` (``start_method``) and a ``worker_init_fn`` that records each worker's pid (and, for the
copy-on-write figure, its memory) in shared memory. A case with more workers than usable CPU cores is skipped with
the reason (its memory figures are still measured), as is one whose estimate does not fit in RAM.

The package: `variants` (the rungs' names and the bytes each ships), `data` (the synthetic set on disk), `stores`
and `datasets` (the host side of an item), `device` (normalize, copy, decoders, the consumer model), `workers`
(DataLoader machinery), `steps` (one batch per call), `steady` (the steady-state timing), `verdict` (loader- or
step-bound, from a steady run), `stepcost` (the ``model_ms`` step), `epochs` (epoch starts, persistent_workers off
and on), `equivalence`, `metadata` (issue 13246's records), `ladder` (the ladder table of a results file), `entry`
(the family's entry but its own figures), `probes` (the instruments, the group's memory among them) and their known
answers: `timing_checks` (samples/s, the speedup, the verdict), `memory_checks` (the group's memory,
copy-on-write, issue 13246's records), `flight_checks` (a batch's bytes, batches and bytes in flight) and
`start_checks` (the first batch, epoch starts). This module assembles `FAMILY` from the entry, the instruments and
their checks, and re-exports what a user calls; nothing in the package imports it.
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
