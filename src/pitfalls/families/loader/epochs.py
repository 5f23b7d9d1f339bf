"""Epoch starts: time to the first batch of an epoch, with ``persistent_workers`` off and on.

A case's own loader never ends an epoch (its sampler cycles), so this routine builds a second DataLoader over
the same data set, collate function and worker options with a sampler of one epoch, runs a whole epoch, then
times the next epoch's start: ``iter()`` to its first batch delivered to the device, synchronized. Without
``persistent_workers`` the first epoch's workers were shut down at its end and the next ``iter()`` starts new
ones; with it, the same workers are told to start the epoch. Both values are timed by this one routine
(`epoch_starts_of`, which the calibration also runs on a step of a planted data set).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, RandomSampler

from pitfalls.devices import synchronize
from pitfalls.families.loader.entry import read_case
from pitfalls.families.loader.steps import LoaderStep
from pitfalls.families.loader.workers import shut_down
from pitfalls.family import FLOOR, SkipCase
from pitfalls.result import Unavailable

__all__ = ["EpochStarts", "epoch_start", "epoch_starts", "epoch_starts_of", "one_epoch_loader"]


@dataclass(frozen=True)
class EpochStarts:
    """Seconds to the first batch of an epoch after a whole epoch.

    Attributes:
        fresh: ``persistent_workers=False`` (new workers each epoch; without workers, the main process's batch).
        persistent: ``persistent_workers=True``, or n/a without workers.
    """

    fresh: float
    persistent: float | Unavailable


def one_epoch_loader(step: LoaderStep, *, persistent: bool) -> DataLoader[Any]:
    """A DataLoader like ``step``'s (data set, collate, workers and their options) whose sampler ends each epoch."""
    dataset: Any = step.loader.dataset  # a map-style data set: sized
    order = RandomSampler(dataset, generator=torch.Generator().manual_seed(int(step.params["seed"])))
    return DataLoader(dataset, sampler=order, persistent_workers=persistent and step.loader.num_workers > 0,
                      **step.loader_options)


def epoch_start(loader: DataLoader[Any], deliver: Callable[[Any], object]) -> float:
    """Run one whole epoch of ``loader`` through ``deliver``, then time the next epoch's ``iter()`` to its first batch
    delivered; the workers are shut down before it returns.

    Args:
        loader: a DataLoader whose epochs end.
        deliver: copies a batch to the device and steps, synchronized.

    Returns:
        Seconds from the next epoch's ``iter()`` to its first batch delivered.
    """
    iterator = iter(loader)
    try:
        for batch in iterator:
            deliver(batch)
        began = time.perf_counter()
        iterator = iter(loader)
        deliver(next(iterator))
        return time.perf_counter() - began
    finally:
        shut_down(iterator)


def epoch_starts(variant: str, device: str, **sizes: Any) -> EpochStarts:
    """Time to the first batch of an epoch, persistent_workers off and on, for one case.

    Raises:
        SkipCase: the floor (no loader), or a case that cannot run here.
    """
    if variant == FLOOR:
        raise SkipCase("the floor has no loader: its batches are collated once, in RAM")
    return read_case(variant, device, sizes, epoch_starts_of, start=False)


def epoch_starts_of(step: LoaderStep) -> EpochStarts:
    """Time to the first batch of an epoch, persistent_workers off and on, of loaders like a built step's.

    Args:
        step: a loader step; its own iterator is not used (each figure has a loader of its own, `one_epoch_loader`),
            only its data set, collate function, worker options and delivery to the device.

    Returns:
        Both epoch starts, seconds; ``persistent`` is n/a without workers.
    """

    def deliver(batch: Any) -> None:
        step.deliver(batch)
        synchronize(step.device)

    fresh = epoch_start(one_epoch_loader(step, persistent=False), deliver)
    persistent: float | Unavailable = Unavailable("persistent_workers needs num_workers > 0")
    if step.params["num_workers"]:
        persistent = epoch_start(one_epoch_loader(step, persistent=True), deliver)
    return EpochStarts(fresh, persistent)
