"""Host-device synchronization: hazards seen on any device, and real syncs counted on CUDA.

A *sync hazard* is an ATen call that forces the host to wait for an accelerator: its output shape depends on
tensor data (PyTorch tags these `torch.Tag.dynamic_output_shape`: nonzero, _unique2, masked_select, ...), or it
returns tensor data to Python (`torch.Tag.data_dependent_output`: `_local_scalar_dense`, i.e. `.item()` and
`bool(tensor)`; `equal`). Hazards are counted through a `TorchDispatchMode`, so they show up on the CPU too,
where nothing actually waits: the figure says what the same program would do on a GPU.

What the dispatch mode sees, and what it does not:

- It sees ATen calls after autograd, so when `backward()` runs inside the counted region the backward ops are
  counted as well (the autograd engine carries the mode to its worker threads).
- It sees the ops of the device the code ran on. A few ATen kernels take different paths per device (on the CPU
  `one_hot` with an explicit `num_classes` checks the label range with two `.item()` calls), so CPU counts can
  differ from CUDA counts for such ops.
- It never sees inside a compiled region. torch.compile's dynamo refuses to run while a non-infra dispatch mode is
  active ("non-infra torch dispatch mode present, this is not supported today in torch.compile") and falls back
  to eager; the counter makes this explicit and version-independent with `torch.compiler.set_stance
  ("force_eager")`. The counts are therefore always those of the *eager program*, and `HazardCounts.eager` says
  so; they are not a claim about the syncs left in compiled code (count those with `count_cuda_syncs` on a GPU).

Precision beyond the tags: `aten.index.Tensor` is tagged as a whole but only syncs when an index is a boolean
(or uint8) mask; integer indexing is asynchronous. `aten.index_put_` (what `x[mask] = v` dispatches to) is not
tagged, yet with a boolean mask it calls nonzero inside the kernel, except on ATen's `masked_fill_` path (below).
`repeat_interleave.Tensor` is asynchronous when `output_size` is given. A blocking copy between an accelerator and
the CPU is a sync both ways (CUDA's copy kernel ends it with `memcpy_and_sync` unless `non_blocking`): to the host
(`.cpu()`, `.tolist()`, printing) and to the device (`.to(device)` of host data, `torch.tensor(data,
device=...)`); `pitfalls.probes.hostcopy` sees those at the Python API, where a CPU run sees them too, and the
counter counts each once. Writes of host data are copies at ATen level: `x[3] = 0.0` copies the number into a
one-element view (`copy_`), and an `index_put` through integer indices copies a one-element host value to the
device before writing it (`_index_put_impl_`: `value.to(self.device())`).

ATen's masked_fill_ path. `_index_put_impl_` (aten/src/ATen/native/TensorAdvancedIndexing.cpp) calls
`canDispatchToMaskedFill` (TensorAdvancedIndexingUtils.h) when `accumulate` is false, and when that says yes runs
`self.masked_fill_(mask, value.item())` instead of indexing: no nonzero, no sync. It says yes when `value` has one
element and lives on the CPU, and among `indices` exactly one is defined, a kBool or kByte mask on `self`'s
device (undefined entries, `x[:, mask]`, are allowed). The rule reads the same in torch 2.11, 2.13 and 2.14.
`THPVariable_setitem` (torch/csrc/autograd/python_variable_indexing.cpp) makes a Python scalar into a CPU tensor
when `self` is on CUDA (`valueToTensor(self_.options(), py_value, at::Device(kCPU))`), so `x[mask] = 0` never
syncs, while `x[mask] = x.max()` (a one-element tensor on the device), `x[mask] = y[mask]` (many elements),
`x[m1, m2] = 0` (two indices) and the backward of `x[mask]` (`accumulate=True`) do. On a CPU run every value is
on the CPU; whether the CUDA program would hold it there is the value's provenance (`hostcopy.Provenance`).
"""

from __future__ import annotations

import contextlib
import warnings
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pitfalls._checks import check_callable
from pitfalls.probes._cuda import warmed_cuda
from pitfalls.probes.hostcopy import HostCopyMode, Provenance, eager_stance, to_non_blocking
from pitfalls.result import Unavailable

__all__ = [
    "CUDA_SYNC_WARNING",
    "HazardCounts",
    "SyncCount",
    "SyncHazardCounter",
    "count_cuda_syncs",
    "count_hazards",
    "hazard_label",
    "syncs_per_call",
]

HAZARD_TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)

# The text of PyTorch's TORCH_WARN in c10/cuda warn_or_error_on_sync(), raised once per synchronizing call when
# torch.cuda.set_sync_debug_mode("warn") is on.
CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"

_MASK_DTYPES = (torch.bool, torch.uint8)
# Ops whose CUDA kernel syncs more than once per call; every other hazard syncs once. bincount reads
# `self.min().cpu()` and then `self.max().item()` (aten/src/ATen/native/cuda/SummaryOps.cu, _bincount_cuda_template);
# repeat_interleave without output_size reads `cumsum[-1].item()` and `(repeats >= 0).all().item()`
# (aten/src/ATen/native/Repeat.h, repeat_interleave_common). Both read the same in torch 2.11, 2.13 and 2.14.
SYNCS_PER_CALL = {"aten.bincount.default": 2, "aten.repeat_interleave.Tensor": 2}
# The reasons an index_put syncs, named in its label: a mask expanded by nonzero, and a one-element host value
# that `_index_put_impl_` copies to the device (`value.to(self.device())`, a blocking copy) before writing it.
BOOL_MASK = "bool mask"
HOST_VALUE = "host value to device"
_COPY_LABELS = ("(host to device)", "(device to host)")
_INDEX_PUT_OPS = frozenset(
    {"aten.index_put_.default", "aten.index_put.default", "aten._index_put_impl_.default"}
)


def _mask_reason(indices: object) -> str | None:
    # Advanced indexing passes a list with one entry per indexed dimension; None marks a dimension taken whole.
    # ATen's expandTensors turns each mask into long indices with its own nonzero: one sync per mask.
    listed = indices if isinstance(indices, (list, tuple)) else ()
    masks = sum(1 for i in listed if isinstance(i, torch.Tensor) and i.dtype in _MASK_DTYPES)
    return None if masks == 0 else BOOL_MASK if masks == 1 else f"{masks} {BOOL_MASK}s"


def _is_masked_fill(self: object, indices: object, value: object, accumulate: bool, value_on_host: bool) -> bool:
    """ATen's `canDispatchToMaskedFill` with `accumulate=False` (see the module docstring)."""
    if accumulate or not isinstance(self, torch.Tensor) or not isinstance(value, torch.Tensor):
        return False
    if value.numel() != 1 or not value_on_host:
        return False
    defined = [i for i in indices if i is not None] if isinstance(indices, (list, tuple)) else []
    return (
        len(defined) == 1
        and isinstance(defined[0], torch.Tensor)
        and defined[0].dtype in _MASK_DTYPES
        and defined[0].device == self.device
    )


def _index_put_label(name: str, args: tuple, kwargs: Mapping[str, Any], value_on_host: bool | None) -> str | None:
    indices = args[1] if len(args) > 1 else kwargs.get("indices")
    self = args[0] if args else kwargs.get("self")
    value = args[2] if len(args) > 2 else kwargs.get("values")
    accumulate = bool(args[3] if len(args) > 3 else kwargs.get("accumulate", False))
    if value_on_host is None:
        # Without provenance only the devices can tell: on a CPU run, take the value for device data.
        value_on_host = (
            isinstance(value, torch.Tensor) and isinstance(self, torch.Tensor)
            and value.device.type == "cpu" and self.device.type != "cpu"
        )
    if _is_masked_fill(self, indices, value, accumulate, value_on_host):
        return None
    mask = _mask_reason(indices)
    reasons = [mask] if mask else []
    if value_on_host and isinstance(value, torch.Tensor) and value.dim() == 0:
        reasons.append(HOST_VALUE)
    return f"{name} ({' + '.join(reasons)})" if reasons else None


def syncs_per_call(label: str) -> int:
    """The real CUDA syncs one call of a hazard label makes: `SYNCS_PER_CALL`'s count, else one per reason its
    parentheses name, a reason "2 bool masks" counting two (an index_put with a mask and a host value: 2), else
    one."""
    if label in SYNCS_PER_CALL:
        return SYNCS_PER_CALL[label]
    if not (label.endswith(")") and (BOOL_MASK in label or HOST_VALUE in label)):
        return 1
    reasons = label[label.rindex("(") + 1:-1].split(" + ")
    return sum(int(reason.split()[0]) if reason[0].isdigit() else 1 for reason in reasons)


def _on_accelerator(tensor: object) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type not in ("cpu", "meta")


def _on_cpu(tensor: object) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.device.type == "cpu"


def _blocking_copy_direction(name: str, args: tuple, kwargs: Mapping[str, Any]) -> str | None:
    """"device to host" or "host to device" for a blocking copy between the CPU and an accelerator, by the devices
    the tensors are on (an accelerator run); None for any other call.

    Both directions wait: without non_blocking, CUDA's copy kernel ends with `memcpy_and_sync` (a
    cudaStreamSynchronize, flagged by the sync debug mode) whichever way it copies.
    """
    if name == "aten._to_copy.default":
        target = kwargs.get("device")
        if target is None or kwargs.get("non_blocking", False):
            return None
        src, target_type = args[0], torch.device(target).type
    elif name == "aten.copy_.default":  # copy_(dst, src): dst is the tensor written
        if to_non_blocking(args, kwargs):
            return None
        src, target_type = args[1], args[0].device.type
    else:
        return None
    if _on_accelerator(src) and target_type == "cpu":
        return "device to host"
    if _on_cpu(src) and target_type not in ("cpu", "meta"):
        return "host to device"
    return None


def hazard_label(
    func: torch._ops.OpOverload,
    args: tuple,
    kwargs: Mapping[str, Any],
    *,
    value_on_host: bool | None = None,
) -> str | None:
    """Name the sync hazard an ATen call is, or return None when the call is asynchronous.

    Args:
        func: the ATen overload being dispatched.
        args: its positional arguments.
        kwargs: its keyword arguments.
        value_on_host: for index_put, whether the CUDA program would hold the value on the host (a Python scalar,
            a host-made tensor); None reads it from the devices, which on a CPU run says no.

    Returns:
        The op's name (e.g. "aten.nonzero.default"), qualified for the mask forms of indexing
        ("aten.index.Tensor (bool mask)"), an index_put's reasons ("aten.index_put_.default (bool mask + host value
        to device)") and copies ("aten._to_copy.default (device to host)", "aten.copy_.default (host to device)"),
        or None.
    """
    name = str(func)
    if name in _INDEX_PUT_OPS:
        return _index_put_label(name, args, kwargs, value_on_host)
    if name == "aten.index.Tensor":
        mask = _mask_reason(args[1] if len(args) > 1 else kwargs.get("indices"))
        return f"{name} ({mask})" if mask else None
    if name == "aten.repeat_interleave.Tensor":
        return None if kwargs.get("output_size") is not None else name
    direction = _blocking_copy_direction(name, args, kwargs)
    if direction is not None:
        return f"{name} ({direction})"
    if any(tag in func.tags for tag in HAZARD_TAGS):
        return name
    return None


@dataclass(frozen=True)
class HazardCounts:
    """Sync-hazard counts seen in one counted region: the syncs the calls would make on CUDA.

    Attributes:
        counts: (label, count) pairs sorted by label; see `hazard_label` for the labels. An op that syncs
            several times per call on CUDA (`SYNCS_PER_CALL`) counts that many.
        eager: always True: the counts are those of the eager program (compiled regions run eagerly while
            counting), stated so that a report never passes them off as compiled-code figures.
    """

    counts: tuple[tuple[str, int], ...] = ()
    eager: bool = field(default=True)

    @property
    def total(self) -> int:
        """The number of hazard calls of every kind."""
        return sum(n for _, n in self.counts)

    def as_dict(self) -> dict[str, int]:
        """Return the counts as a new dict from label to count."""
        return dict(self.counts)

    def get(self, label: str) -> int:
        """Return the count for one label (0 when it was not seen)."""
        return self.as_dict().get(label, 0)

    def __str__(self) -> str:
        inner = ", ".join(f"{label}: {n}" for label, n in self.counts)
        return f"{self.total} sync hazards ({inner})" if inner else "0 sync hazards"


class SyncHazardCounter(TorchDispatchMode):
    """Count sync-hazard ATen calls made inside a `with` block.

    Args:
        label_ranges: also wrap each hazard call in a `torch.profiler.record_function("sync-hazard: <label>")`
            range, so a profiler trace shows where the hazards are.
        on_hazard: called with the label of each hazard call, before the call runs, so it can look at the
            Python stack that dispatched it (see `pitfalls.probes.sites`); it returns False for a call that is no
            hazard after all (a read of host memory the stack tells apart), which is then not counted.
        provenance: the host-made tensors known so far (from `hostcopy.keep_provenance` over a warm-up), read and
            added to while counting; None starts afresh at each `with`, every tensor made before it taken for
            the program's device.

    Use `.result` after the block. Compiled functions called inside run eagerly (see the module docstring).
    """

    def __init__(
        self,
        *,
        label_ranges: bool = False,
        on_hazard: Callable[[str], bool | None] | None = None,
        provenance: Provenance | None = None,
    ) -> None:
        super().__init__()
        if on_hazard is not None and not callable(on_hazard):
            raise TypeError(f"on_hazard must be callable or None, got {type(on_hazard).__name__}: {on_hazard!r}")
        if provenance is not None and not isinstance(provenance, Provenance):
            raise TypeError(f"provenance must be a Provenance or None, got {type(provenance).__name__}")
        self._label_ranges = bool(label_ranges)
        self._on_hazard = on_hazard
        self._counter: Counter[str] = Counter()
        self._stack: contextlib.ExitStack | None = None
        self._kept = provenance
        self._provenance = provenance if provenance is not None else Provenance()

    def __enter__(self) -> SyncHazardCounter:
        self._counter.clear()
        self._provenance = self._kept if self._kept is not None else Provenance()
        with contextlib.ExitStack() as stack:
            stack.enter_context(eager_stance())
            super().__enter__()
            stack.callback(super().__exit__, None, None, None)
            # Host copies at the Python API; inside it, the ATen ops of a counted copy stay quiet (one count each).
            stack.enter_context(HostCopyMode(self._provenance, self._hazard))
            self._stack = stack.pop_all()  # all three stay on past this block; a failure above undoes the others
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()  # the function mode, this dispatch mode, then the stance, innermost first

    def _hazard(self, label: str) -> None:
        if self._on_hazard is None or self._on_hazard(label) is not False:
            self._counter[label] += 1

    def _label(self, func: torch._ops.OpOverload, args: tuple, kwargs: Mapping[str, Any]) -> str | None:
        provenance = self._provenance
        if provenance.quiet:
            return None  # inside a host copy already counted at the Python API
        name = str(func)
        pending = provenance.setitem_value_on_host
        if name in _INDEX_PUT_OPS:
            value = args[2] if len(args) > 2 else kwargs.get("values")
            on_host = pending[-1] if pending else isinstance(value, torch.Tensor) and provenance.on_host(value)
            if provenance.on_host(args[0]):
                return None  # a host-made tensor written on the host: the CUDA program does this on the CPU
            return hazard_label(func, args, kwargs, value_on_host=on_host)
        if name == "aten.copy_.default" and args[0].device.type == args[1].device.type == "cpu":
            return self._host_copy_label(name, args, kwargs, value_on_host=bool(pending and pending[-1]))
        label = hazard_label(func, args, kwargs)
        if label is not None and not label.endswith(_COPY_LABELS) and provenance.all_on_host((args, kwargs)):
            return None  # every tensor is host-made: the CUDA program runs this op on the CPU (a copy leaves it)
        return label

    def _host_copy_label(self, name: str, args: tuple, kwargs: Mapping[str, Any], *, value_on_host: bool) -> str | None:
        """A copy between two CPU tensors, read as the CUDA program would make it: between the host and the device
        when one side is host-made and the other is not (`x[i] = 3` copies the scalar into one element, `x[:2] =
        torch.tensor(...)` a host tensor into a slice; `value_on_host` says the written value is a host one)."""
        dst, src = args[0], args[1]
        if to_non_blocking(args, kwargs):
            return None
        provenance = self._provenance
        src_on_host, dst_on_host = value_on_host or provenance.on_host(src), provenance.on_host(dst)
        if src_on_host and not dst_on_host:
            return f"{name} (host to device)"
        if dst_on_host and not src_on_host:
            return f"{name} (device to host)"
        return None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        kwargs = kwargs or {}
        label = self._label(func, args, kwargs)
        if label is None:
            return func(*args, **kwargs)
        for _ in range(syncs_per_call(label)):
            self._hazard(label)
        if not self._label_ranges:
            return func(*args, **kwargs)
        # Inside __torch_dispatch__ this mode is off, so record_function's own ops do not come back here.
        with torch.profiler.record_function(f"sync-hazard: {label}"):
            return func(*args, **kwargs)

    @property
    def result(self) -> HazardCounts:
        """The counts so far, as an immutable `HazardCounts`."""
        return HazardCounts(counts=tuple(sorted(self._counter.items())))


def count_hazards(fn: Callable[..., object], *args: object, **kwargs: object) -> HazardCounts:
    """Call `fn(*args, **kwargs)` once and count the sync hazards it dispatches.

    Args:
        fn: any callable; a torch.compile'd one runs eagerly while counted.
        *args: positional arguments for fn.
        **kwargs: keyword arguments for fn.

    Returns:
        The `HazardCounts` of that one call (forward and, if fn runs it, backward).
    """
    check_callable("fn", fn)
    with SyncHazardCounter() as counter:
        fn(*args, **kwargs)
    return counter.result


@dataclass(frozen=True)
class SyncCount:
    """Host-device synchronizations counted on CUDA.

    Attributes:
        total: synchronizing CUDA calls seen over all counted calls.
        calls: how many calls of the function were counted.
        method: how they were counted ("sync debug mode").
    """

    total: int
    calls: int
    method: str

    @property
    def per_call(self) -> float:
        """Synchronizations per call of the function."""
        return self.total / self.calls


def count_cuda_syncs(
    fn: Callable[[], object],
    *,
    calls: int = 1,
    warmup: int = 1,
    cuda: Any = None,
) -> SyncCount | Unavailable:
    """Count the synchronizing CUDA calls `fn()` makes, with PyTorch's sync debug mode.

    Warm-up calls run before counting, so one-off syncs (lazy initialisation, cuDNN autotuning, compilation)
    stay out of the figure. The previous debug mode is always restored. PyTorch flags the syncs it instruments
    (blocking copies to the host, `.item()`, nonzero, stream and event waits); `torch.cuda.synchronize()` itself
    is not flagged.

    Args:
        fn: a zero-argument callable that launches the CUDA work of one call.
        calls: calls to count (>= 1).
        warmup: calls to run first, uncounted (>= 0).
        cuda: the `torch.cuda`-like module to use; tests pass a fake. None means torch.cuda, after checking
            that torch was built with CUDA and a device is present.

    Returns:
        A `SyncCount`, or `Unavailable("no CUDA device")` / `Unavailable("no CUDA device: torch built without CUDA")`.
    """
    cuda = warmed_cuda(fn, calls, warmup, cuda)
    if isinstance(cuda, Unavailable):
        return cuda
    cuda.synchronize()
    previous = cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        # "always": Python would otherwise show a warning from the same code location only once.
        warnings.simplefilter("always")
        cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(calls):
                fn()
        finally:
            cuda.set_sync_debug_mode(previous)
    cuda.synchronize()
    total = 0
    for w in caught:
        if CUDA_SYNC_WARNING in str(w.message):
            total += 1
        else:
            # Recording swallowed every warning of the counted calls; give back the ones that are not ours.
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno, source=w.source)
    return SyncCount(total=total, calls=calls, method="sync debug mode")
