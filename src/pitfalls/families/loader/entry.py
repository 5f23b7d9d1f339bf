"""The family's entry, all but its own figures (`pitfalls.families.loader` adds those): so that the
instruments can place a case without importing the package that lists them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Any, TypeVar

import torch

from pitfalls.families.loader import steady
from pitfalls.families.loader.equivalence import compare
from pitfalls.families.loader.steps import make_step
from pitfalls.families.loader.variants import CACHES, VARIANTS, estimate
from pitfalls.family import CUDA, NVML, SPEEDUP, TIME, Case, Family, Param

NAME = "loader"
T = TypeVar("T")


def build(variant: str, device: torch.device, compiled: bool, params: dict[str, Any]) -> Case:
    """One batch per call of a variant (or the floor) as a case; ``close`` shuts its workers down."""
    step = make_step(variant, device, params)
    return Case(NAME, variant, device, compiled, params, step, close=step.close, block=partial(steady.block, step))


def read_case(variant: str, device: str, sizes: Mapping[str, Any], read: Callable[[Any], T], **options: Any) -> T:
    """Build a case's step from a caller's arguments (`Family.place`), read it once with ``read`` (a figure's
    routine; with ``start=False`` it starts the loader itself) and close it whatever the reading raised.

    Args:
        variant: a variant or the floor.
        device: "cpu" or "cuda".
        sizes: the family's parameters.
        read: the figure's routine on the built step.
        **options: `make_step`'s.
    """
    where, params = ENTRY.place(variant, device, sizes)
    with make_step(variant, where, params, **options) as step:
        return read(step)


ENTRY = Family(
    name=NAME,
    article="001",
    summary="DataLoader: disk, resize, host normalize and int64 masks vs data in RAM, uint8, normalize on the device",
    variants=VARIANTS,
    params=(
        Param("num_workers", 0, "DataLoader worker processes (0: load in the main process)", minimum=0),
        Param("pin_memory", False, "pin batches and copy them non_blocking (CUDA only); an axis of every rung, "
              "switched by none", kind=bool),
        Param("image_size", 512, "S: images 3 x S x S, masks S x S", minimum=8),
        Param("batch", 32, "items per batch"),
        Param("image_format", "png", "how images are encoded (masks are always PNG)", choices=("png", "jpeg")),
        Param("storage", "list", "how the RAM variants hold items: a Python list of per-item objects (the "
              "article's) or one packed buffer with offsets", choices=("list", "packed")),
        Param("cache", "warm", "the rungs that read files (naive, offline): 'warm' reads them from the page cache, "
              "that is from RAM; 'cold' drops each file from it just before reading it (posix_fadvise DONTNEED, "
              "checked by mincore), so it comes from the disk", choices=CACHES),
        Param("items", 64, "items in the data set (an epoch); at least batch"),
        Param("classes", 4, "mask labels C, 2..255 (masks are uint8)", minimum=2),
        Param("prefetch_factor", 2, "batches each worker loads ahead (DataLoader's default is 2)"),
        Param("start_method", "fork", "how workers start (DataLoader's multiprocessing_context)",
              choices=("fork", "forkserver", "spawn")),
        Param("timeout", 120, "seconds to wait for a batch from the workers before failing (0: forever)", minimum=0),
        Param("model_step", True, "train the 1x1-conv head on each batch (false: deliver the batch only)"),
        Param("model_ms", 0, "milliseconds of planted device work added to each step (a busy matrix loop; 0: the "
              "model step alone): the verdict's axis", minimum=0),
        Param("source_scale", 4, "the naive variant's files are this many times the training size on a side "
              "(the article's 2048 -> 512)"),
        Param("seed", 0, "seed of the data set, the epochs' order and the model", minimum=0),
    ),
    builder=build,
    estimate=estimate,
    comparer=compare,
    smoke={"image_size": 32, "batch": 4, "items": 8},
    grids={
        # Small enough for a shared 2-core CPU: every variant with and without workers, the article's form. Steady
        # state times 60 batches a block at 2 workers (ten times the 6 made in advance), so batches are small.
        "quick": {"num_workers": (0, 2), "image_size": (32,), "batch": (8,), "image_format": ("png",),
                  "storage": ("list",), "pin_memory": (False,), "cache": CACHES},
        # The article's 512x512 batches of 32, and its 8 workers.
        # The quick sizes too, so that a full run extends the quick series rather than starting others.
        "full": {"num_workers": (0, 1, 2, 4, 8), "image_size": (32, 128, 256, 512), "batch": (8, 32),
                 "image_format": ("png", "jpeg"), "storage": ("list", "packed"), "pin_memory": (False, True),
                 "cache": CACHES},
    },
    article_sizes=({"image_size": 512, "batch": 32, "num_workers": 8, "image_format": "jpeg"},),
    figures=frozenset({TIME, SPEEDUP, CUDA, NVML}),
    unit="batch",
)
