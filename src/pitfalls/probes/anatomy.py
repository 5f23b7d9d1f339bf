"""Anatomy of a batch: every tensor with its path, shape, dtype and bytes, and the smallest dtype that holds it.

"Losslessly" is judged on the batches seen. An integer tensor (or a float one holding only integers) takes the
smallest integer dtype its range fits. A float tensor whose every channel holds at most 256 distinct values is
8-bit data converted on the host: it ships as uint8 codes, and the device turns them back into the same floats,
with ``(code - offset) * scale`` per channel when the values are evenly spaced (normalization on the device) or a
256-entry table per channel otherwise. A float tensor that survives a round trip through float16 or bfloat16 ships
as that.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["Anatomy", "TensorInfo", "anatomy", "batch_tensors", "smaller_dtype"]

_INTEGERS = (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_LEVELS = 256
# Host normalization, (x - mean) / std in float32, is off the exact value by a few units in the last place.
_ULPS = 8
_SAMPLE = 1 << 16


def batch_tensors(batch: Any, path: str = "batch") -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor in a batch of nested tuples, lists and dicts, with its path (``batch[0]``, ``batch['mask']``)."""
    if isinstance(batch, torch.Tensor):
        yield path, batch
    elif isinstance(batch, Mapping):
        for key, value in batch.items():
            yield from batch_tensors(value, f"{path}[{key!r}]")
    elif isinstance(batch, Sequence) and not isinstance(batch, (str, bytes)):
        for index, value in enumerate(batch):
            yield from batch_tensors(value, f"{path}[{index}]")


def _integer_fit(low: int, high: int) -> torch.dtype:
    for dtype in _INTEGERS:
        info = torch.iinfo(dtype)
        if info.min <= low and high <= info.max:
            return dtype
    return torch.int64


def _channels(values: torch.Tensor) -> torch.Tensor:
    """[channels, values]: dim 1 of a batch [B, C, ...] with a few channels, the last of [B, H, W, C], else one."""
    if values.ndim >= 4 and values.shape[1] <= 4:
        return values.transpose(0, 1).reshape(values.shape[1], -1)
    if values.ndim >= 4 and values.shape[-1] <= 4:
        return values.reshape(-1, values.shape[-1]).T
    return values.reshape(1, -1)


def _affine(levels: torch.Tensor) -> tuple[float, float] | None:
    """(offset, scale) when sorted distinct floats are ``offset + k * scale`` for integers k in 0..255, else None."""
    if len(levels) < 2:
        return float(levels[0]), 1.0
    wide = levels.double()
    rough = float((wide[1:] - wide[:-1]).min())
    codes = torch.round((wide - wide[0]) / rough)
    if codes[-1] >= _LEVELS:
        return None
    scale = float(wide[-1] - wide[0]) / float(codes[-1])  # the whole span: rounding of one gap does not add up
    return (float(wide[0]), scale) if bool((wide[0] + codes * scale - wide).abs().max() <= _tolerance(wide)) else None


def _tolerance(values: torch.Tensor) -> float:
    return _ULPS * torch.finfo(torch.float32).eps * max(float(values.abs().max()), 1.0)


def _levels(channel: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """A channel's distinct values, when there are at most 256, and whether they are evenly spaced; else None.

    A strided sample finds the candidates (sorting every value takes seconds per batch on a CPU); every value is
    then checked against them, and a value the sample missed falls back to the full count.
    """
    step = max(1, channel.numel() // _SAMPLE)
    candidates = torch.unique(channel[::step])
    if len(candidates) > _LEVELS:
        return None
    line = _affine(candidates)
    if line is not None:
        offset, scale = line
        codes = torch.round((channel.double() - offset) / scale)
        if bool(((codes >= 0) & (codes < _LEVELS)).all()) and \
                bool((offset + codes * scale - channel).abs().max() <= _tolerance(candidates)):
            return candidates, True
    else:
        found = candidates[torch.bucketize(channel, candidates).clamp(max=len(candidates) - 1)]
        if bool((found == channel).all()):
            return candidates, False
    full = torch.unique(channel)
    return (full, _affine(full) is not None) if len(full) <= _LEVELS else None


def smaller_dtype(values: torch.Tensor) -> tuple[torch.dtype, str]:
    """The smallest dtype that holds a tensor's values losslessly, and how the device gets them back.

    Args:
        values: one tensor of a batch (several batches concatenated on dim 0 see more of the values).

    Returns:
        The dtype (the tensor's own when nothing smaller holds it) and one line of how.
    """
    if values.numel() == 0 or values.dtype == torch.bool:
        return values.dtype, "already the smallest"
    if values.is_complex():
        return values.dtype, "complex: not examined"
    floating = values.is_floating_point()
    finite = not floating or bool(torch.isfinite(values).all())
    if not floating or (finite and bool((values == values.round()).all())):
        low, high = int(values.min()), int(values.max())
        fit = _integer_fit(low, high)
        if floating:
            return fit, f"whole numbers in [{low}, {high}]; cast back on the device"
        if fit.itemsize < values.dtype.itemsize:
            return fit, f"values in [{low}, {high}]; cast back on the device"
        return values.dtype, "already the smallest"
    channels = _channels(values.detach())
    found = [_levels(channel) for channel in channels] if finite else [None]
    levels = [level for level in found if level is not None]
    most = max((len(values) for values, _ in levels), default=0)
    # Too few values per level and any data looks 8-bit: a table is claimed only where the data shows it.
    if len(levels) == len(found) and channels.shape[1] >= 4 * most:
        if all(even for _, even in levels):
            return torch.uint8, (f"{len(levels)} channel(s) of at most {most} evenly spaced values: 8-bit data "
                                 "normalized on the host; normalize on the device")
        return torch.uint8, (f"{len(levels)} channel(s) of at most {most} values: uint8 codes and a 256-entry "
                             "table per channel on the device")
    for dtype in (torch.bfloat16, torch.float16):
        if dtype.itemsize < values.dtype.itemsize and bool((values.to(dtype).to(values.dtype) == values).all()):
            return dtype, f"every value survives a round trip through {_name(dtype)}"
    return values.dtype, "already the smallest that holds these values"


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of a batch.

    Attributes:
        path: where it sits in the batch, e.g. ``batch['mask']``.
        shape: its shape in one batch.
        dtype: its dtype, e.g. "float32".
        bytes: its bytes in one batch.
        smaller_dtype: the smallest dtype that holds its values (its own dtype when none is smaller).
        bytes_if_smaller: its bytes in that dtype.
        how: one line of how the device gets the values back.
    """

    path: str
    shape: tuple[int, ...]
    dtype: str
    bytes: int
    smaller_dtype: str
    bytes_if_smaller: int
    how: str


@dataclass(frozen=True)
class Anatomy:
    """The tensors of a batch and the article's arithmetic on them.

    Attributes:
        tensors: every tensor, in the batch's order.
        batches_seen: batches the smaller dtypes were judged on.
        samples_per_batch: the batch's leading size.
    """

    tensors: tuple[TensorInfo, ...]
    batches_seen: int
    samples_per_batch: int

    @property
    def bytes_per_batch(self) -> int:
        """Bytes of one batch as the loader hands it over."""
        return sum(info.bytes for info in self.tensors)

    @property
    def bytes_if_smaller(self) -> int:
        """Bytes of one batch with every tensor in its smaller dtype."""
        return sum(info.bytes_if_smaller for info in self.tensors)

    def in_flight_bytes(self, workers: int, prefetch_factor: int) -> int:
        """Batches in flight = workers x prefetch_factor, times the bytes of one batch."""
        return workers * prefetch_factor * self.bytes_per_batch


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def anatomy(batches: Sequence[Any]) -> Anatomy:
    """The anatomy of a loader's batches, judged on all of them (they must share their structure).

    Args:
        batches: one or more batches as the loader returned them.

    Returns:
        The `Anatomy`, shapes and bytes from the first batch.
    """
    if not batches:
        raise ValueError("anatomy needs at least one batch")
    first = list(batch_tensors(batches[0]))
    seen = [dict(batch_tensors(batch)) for batch in batches]
    infos = []
    for path, tensor in first:
        # Batches whose tensor differs past dim 0 (a last, partial batch is alike; padded lengths are not) are
        # left out of the judgement rather than reshaped.
        alike = [found[path] for found in seen if path in found and found[path].shape[1:] == tensor.shape[1:]]
        together = torch.cat(alike) if tensor.ndim else tensor
        dtype, how = smaller_dtype(together)
        infos.append(TensorInfo(path, tuple(tensor.shape), _name(tensor.dtype), tensor.numel() * tensor.element_size(),
                                _name(dtype), tensor.numel() * dtype.itemsize, how))
    samples = first[0][1].shape[0] if first and first[0][1].ndim else 1
    return Anatomy(tuple(infos), len(batches), int(samples))
