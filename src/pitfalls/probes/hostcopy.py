"""Host copies and host-made tensors, seen at the Python API, so a CPU run counts what a CUDA run would sync.

On a CPU tensor `.cpu()`, `.to("cpu")`, `.tolist()` and printing dispatch no ATen copy, so a dispatch mode never
sees them; on CUDA each is a blocking device-to-host copy. The same holds the other way: `.to(device)` (a device
index too, `.to(rank)`) and `.cuda()` of a host-made tensor and `torch.tensor(data, device=...)` dispatch no copy on
a CPU run and are blocking host-to-device copies on CUDA. `HostCopyMode`, a `TorchFunctionMode` entered beside
the hazard counter's dispatch mode, records them at the Python call, on any device, and keeps the dispatch mode
quiet for the ATen calls they make inside (on CUDA the `_to_copy`, inside `print` the `.item()` calls), so each
such call counts once and the per-line counts of a program are the same on the CPU and on CUDA.

It also keeps the *provenance* of tensors: which tensors the same program, run on CUDA, would hold on the host.
Those are the tensors made from Python numbers or arrays by a factory given no device (`torch.tensor(2.0)`,
`torch.zeros(3)`) or the device string "cpu", the tensors that share a NumPy array's or a buffer's memory
(`torch.from_numpy`, `torch.frombuffer`: no torch function mode sees these two, so the mode wraps them while it is
on), the results of `.cpu()` and `.to("cpu")`, and whatever an op computes from host tensors alone (a
`torch.stack` of host tensors). A `torch.device` object is taken for the program's device (code writes
`device=x.device` or `.to(device)` to follow its data), and tensors made before the counted region are taken to
live on the program's device. The hazard rules read this where the device alone cannot tell on a CPU run: a copy
or `.item()` of a host tensor makes no sync, and `x[mask] = v` with a host-made one-element value takes ATen's
`masked_fill_` path (see `pitfalls.probes.syncs`).

Provenance outlives one counted region when the caller keeps it: `keep_provenance` records it, counting nothing,
while a step warms up, and a counter given the same `Provenance` reads it. A tensor a step makes on the host and
keeps (the `state["step"]` of Adam and AdamW, a `torch.tensor(0.0, device="cpu")` made at their first step unless
`capturable` or `fused`) is then still host-made when later steps are counted, and reading it is no sync.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

__all__ = ["HostCopyMode", "Provenance", "eager_stance", "keep_provenance", "to_non_blocking"]

# Factories that make a tensor from Python data or a size: on the host unless given a device.
_FACTORIES = frozenset(
    {
        torch.tensor, torch.as_tensor, torch.asarray, torch.scalar_tensor, torch.zeros, torch.ones, torch.full,
        torch.empty, torch.arange, torch.linspace, torch.eye, torch.rand, torch.randn, torch.randint,
        torch.randperm,
    }
)
# Factories that copy their data: given a device, they build the tensor on the host and copy it there, blocking
# (`internal_new_from_data` in torch/csrc/utils/tensor_new.cpp: `.to(device, ..., non_blocking=false)`).
_FROM_DATA = frozenset({torch.tensor, torch.as_tensor, torch.asarray})
_ALWAYS_HOST = frozenset({torch.from_numpy, torch.Tensor.cpu})
# Data that is not a fill: a factory given an array, a buffer or a tensor copies host data, a batch's kind.
_FILLS = (bool, int, float, complex, list, tuple)
_FORMATTING = {torch.Tensor.__format__: "Tensor.__format__", torch.Tensor.__repr__: "Tensor.__repr__"}
_SETTERS = frozenset({torch.Tensor.__setitem__, torch.Tensor.index_put_, torch.Tensor.index_put, torch.index_put})
NUMPY_LABEL = "Tensor.numpy (of a device tensor: a TypeError on CUDA)"
# Where a copy's result lives in the CUDA program (`HostCopyMode._copy_label`).
_HOST, _DEVICE = "host", "device"


def _is_host_target(device: object) -> bool:
    # Only the string names the host for sure; a torch.device object is usually the program's own device.
    return isinstance(device, str) and torch.device(device).type == "cpu"


def to_non_blocking(args: tuple, kwargs: Mapping[str, Any]) -> bool:
    """The non_blocking argument of a copy call: `Tensor.to`, `Tensor.cuda`, `Tensor.copy_` (and ATen's `copy_`).

    Every form takes it as the first bool after the device, dtype, tensor or source (`Tensor.to` takes `copy` as the
    second; torch's own `_parse_to` refuses `copy`, so it cannot read a call that passes it).

    Args:
        args: the call's positional arguments, the tensor first.
        kwargs: its keyword arguments.

    Returns:
        Whether the copy was asked not to block.
    """
    if "non_blocking" in kwargs:
        return bool(kwargs["non_blocking"])
    return next((arg for arg in args[1:] if isinstance(arg, bool)), False)


class Provenance:
    """The tensors a CUDA run of the program would hold on the host, by identity (weakly held)."""

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref[torch.Tensor]] = {}
        self._made_by: dict[int, str] = {}
        self._pinned: set[int] = set()
        self.quiet = 0  # > 0 while a call already counted at the Python API runs its ATen ops
        self.setitem_value_on_host: list[bool] = []

    def add(self, value: object, made_by: str = "") -> None:
        """Mark every tensor in `value` (a tensor, or a structure of them) as host-made.

        Args:
            value: a tensor, or a structure of them.
            made_by: the factory that filled it on the host ("torch.randn"; also an op of such tensors alone), or
                "" for host data of another kind (a batch, a NumPy array's memory), which cannot be made on the
                device instead.
        """
        for leaf in tree_flatten(value)[0]:
            if isinstance(leaf, torch.Tensor):
                # Identity, not equality: a set of tensors would compare them with ==, an ATen op per lookup.
                self._refs[id(leaf)] = weakref.ref(leaf, functools.partial(self._forget, id(leaf)))
                if made_by:
                    self._made_by[id(leaf)] = made_by
                else:
                    self._made_by.pop(id(leaf), None)

    def _forget(self, key: int, ref: weakref.ref[torch.Tensor]) -> None:
        # The tensor is gone: drop its entry, unless its id was reused by a tensor added since.
        if self._refs.get(key) is ref:
            del self._refs[key]
            self._made_by.pop(key, None)
            self._pinned.discard(key)

    def pin(self, value: object) -> None:
        """Mark the host-made tensors in `value` as page-locked in the CUDA program (a batch of a DataLoader asked
        for pinned memory, which a run without an accelerator does not pin)."""
        for leaf in tree_flatten(value)[0]:
            if isinstance(leaf, torch.Tensor) and self.on_host(leaf):
                self._pinned.add(id(leaf))

    def pinned(self, tensor: torch.Tensor) -> bool:
        """Whether the CUDA program would hold `tensor` in page-locked host memory (as `pin` marked it)."""
        return id(tensor) in self._pinned and self.on_host(tensor)

    def made_by(self, tensor: torch.Tensor) -> str:
        """The factory that filled a host-made tensor on the host ("torch.randn"), or "" (not one, or not known)."""
        return self._made_by.get(id(tensor), "") if self.on_host(tensor) else ""

    def common_factory(self, tree: object) -> str:
        """The factory of the first tensor in `tree` when every tensor there was filled by one, else ""."""
        names = [self.made_by(leaf) for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]
        return names[0] if names and all(names) else ""

    def on_host(self, tensor: torch.Tensor) -> bool:
        """Whether a CUDA run of the program would hold `tensor` on the host."""
        if tensor.device.type not in ("cpu", "meta"):
            return False
        ref = self._refs.get(id(tensor))
        return ref is not None and ref() is tensor

    def value_on_host(self, value: object) -> bool:
        """Whether an assigned value would be on the host: a Python number, or a host-made tensor."""
        if isinstance(value, torch.Tensor):
            return self.on_host(value) if value.device.type == "cpu" else False
        return isinstance(value, (bool, int, float, complex))

    def all_on_host(self, tree: object) -> bool:
        """Whether `tree` holds at least one tensor and all its tensors are host-made."""
        tensors = [leaf for leaf in tree_flatten(tree)[0] if isinstance(leaf, torch.Tensor)]
        return bool(tensors) and all(self.on_host(t) for t in tensors)

    @contextlib.contextmanager
    def quieted(self) -> Iterator[None]:
        """Keep the dispatch rules quiet while a call counted at the Python API runs."""
        self.quiet += 1
        try:
            yield
        finally:
            self.quiet -= 1


# Factories of host memory that torch function modes do not see (they take no tensor and check no mode); the mode
# wraps them at torch's top level, where a script calls them (`torch.from_numpy(a)`), while it is on.
_UNSEEN_HOST_FACTORIES = ("from_numpy", "frombuffer")


def _recording(factory: Callable[..., torch.Tensor], provenance: Provenance) -> Callable[..., torch.Tensor]:
    @functools.wraps(factory)
    def made_on_host(*args: Any, **kwargs: Any) -> torch.Tensor:
        out = factory(*args, **kwargs)
        provenance.add(out)
        return out

    return made_on_host


class HostCopyMode(TorchFunctionMode):
    """Record blocking copies between host and device at the Python API, and keep the provenance of tensors.

    Args:
        provenance: the host-made tensors, shared with the dispatch rules.
        on_copy: called with the label of each blocking copy ("Tensor.cpu (device to host)", "torch.tensor (host
            to device)", ...), before it runs.
    """

    def __init__(self, provenance: Provenance, on_copy: Callable[[str], None]) -> None:
        super().__init__()
        self._provenance = provenance
        self._on_copy = on_copy
        self._unwrapped: dict[str, Any] = {}

    def __enter__(self) -> HostCopyMode:
        for name in _UNSEEN_HOST_FACTORIES:
            factory = self._unwrapped[name] = getattr(torch, name)
            setattr(torch, name, _recording(factory, self._provenance))
        return super().__enter__()

    def __exit__(self, *exc_info: object) -> None:
        try:
            super().__exit__(*exc_info)
        finally:
            for name, factory in self._unwrapped.items():
                setattr(torch, name, factory)
            self._unwrapped = {}

    def _from_data_label(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> str | None:
        """The label of a factory that copies host data to the device it is given (or None)."""
        device = kwargs.get("device")
        if device is None or _is_host_target(device):
            return None
        data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        if isinstance(data, torch.Tensor) and not self._provenance.on_host(data):
            return None  # device data: a copy on the device, or none at all
        return f"torch.{func.__name__} (host to device)"

    def _to_device_label(self, call: str, src: torch.Tensor, from_device: bool, non_blocking: bool) -> str | None:
        """The label of a copy of ``src`` to the device by ``call`` ("Tensor.to"), or None when it does not wait."""
        # Host data to the device: blocking unless non_blocking (which CUDA's sync debug mode never flags, even
        # from pageable memory, where the driver stages the copy). A factory's fill is named in the label: its
        # fix (make it on the device) is not a batch's (pinned memory and non_blocking=True).
        if from_device or non_blocking:
            return None
        made_by = self._provenance.made_by(src)
        return f"{call} of {made_by}'s tensor (host to device)" if made_by else f"{call} (host to device)"

    def _copy_label(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> tuple[str | None, str | None]:
        """The label of the blocking copy between host and device this call is (or None), and where its result
        is: `_HOST`, `_DEVICE` (a copy to the device), or None (the other rules tell)."""
        if func in _FROM_DATA:
            return self._from_data_label(func, args, kwargs), None
        src = args[0] if args else None
        if not isinstance(src, torch.Tensor) or src.device.type == "meta":
            return None, None
        from_device = not self._provenance.on_host(src)
        if func is torch.Tensor.cpu:
            return ("Tensor.cpu (device to host)" if from_device else None), _HOST
        if func is torch.Tensor.cuda:
            return self._to_device_label("Tensor.cuda", src, from_device, to_non_blocking(args, kwargs)), _DEVICE
        if func is torch.Tensor.to:
            target = args[1] if len(args) > 1 else kwargs.get("device", kwargs.get("other"))
            if isinstance(target, torch.Tensor):
                to_host = self._provenance.on_host(target)
            elif isinstance(target, str):
                to_host = _is_host_target(target)
            elif isinstance(target, torch.device):
                if target.type == "cpu" and src.device.type != "cpu":
                    return None, _HOST  # on an accelerator the dispatch rules see the real copy to the host
                to_host = False  # taken for the program's device
            elif isinstance(target, int) and not isinstance(target, bool):
                to_host = False  # a device index, `.to(rank)`: the accelerator's
            else:
                return None, (None if from_device else _HOST)  # a dtype: the tensor stays where it is
            non_blocking = to_non_blocking(args, kwargs)
            if to_host:
                return ("Tensor.to (device to host)" if from_device and not non_blocking else None), _HOST
            return self._to_device_label("Tensor.to", src, from_device, non_blocking), _DEVICE
        if not from_device or src.numel() == 0:
            return None, None
        if func is torch.Tensor.tolist:
            return "Tensor.tolist (device to host)", None
        if func is torch.Tensor.numpy:
            return NUMPY_LABEL, None
        if func in _FORMATTING:
            return f"{_FORMATTING[func]} (device to host)", None
        return None, None

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        kwargs = kwargs or {}
        provenance = self._provenance
        if func in _SETTERS:
            # x[mask] = v and index_put_: whether v is host-made decides ATen's masked_fill_ path.
            value = args[2] if len(args) > 2 else kwargs.get("values", kwargs.get("value"))
            provenance.setitem_value_on_host.append(provenance.value_on_host(value))
            try:
                return func(*args, **kwargs)
            finally:
                provenance.setitem_value_on_host.pop()
        label, where = self._copy_label(func, args, kwargs)
        if label is not None:
            self._on_copy(label)
            with provenance.quieted():
                out = func(*args, **kwargs)
        else:
            out = func(*args, **kwargs)
        same = isinstance(out, torch.Tensor) and bool(args) and out is args[0]
        if where == _HOST or func in _ALWAYS_HOST:
            if same:
                # On a CPU run `.cpu()` returns the tensor itself, but in the CUDA program the copy is another
                # tensor: hand back an alias, so the copy is host-made and the source stays device data.
                out = out.view_as(out)
            provenance.add(out)
        elif where == _DEVICE:
            if same and provenance.on_host(out):
                # The other way: `.to(device)` of host data returns it on a CPU run, where the CUDA program holds a
                # copy on the device; the alias is that copy, and the host tensor stays host-made.
                out = out.view_as(out)
        elif func in _FACTORIES:
            device = kwargs.get("device")
            if device is None or _is_host_target(device):
                data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
                fill = func not in _FROM_DATA or isinstance(data, _FILLS)
                provenance.add(out, f"torch.{func.__name__}" if fill else "")
        elif provenance.all_on_host((args, kwargs)):
            provenance.add(out, provenance.common_factory((args, kwargs)))
        return out


def eager_stance() -> contextlib.AbstractContextManager[object]:
    """Run torch.compile'd code eagerly inside the block (`torch.compiler.set_stance("force_eager")`).

    Dynamo does not compile under a non-infra mode, so while a mode of this package is on, compiled code runs as the
    eager program it counts; torch without `set_stance` (before 2.6) gets a block that changes nothing.
    """
    set_stance = getattr(torch.compiler, "set_stance", None)
    return set_stance("force_eager") if set_stance is not None else contextlib.nullcontext()


def _ignore(_label: str) -> None:
    return None


@contextlib.contextmanager
def keep_provenance(provenance: Provenance) -> Iterator[Provenance]:
    """Record which tensors made inside the block are host-made, into `provenance`, counting nothing.

    Compiled code runs eagerly inside (see `eager_stance`). Give the same `provenance` to the counter of the calls
    that follow (`SyncHazardCounter(provenance=...)`), so what a warm-up call made on the host stays host-made.

    Args:
        provenance: where the host-made tensors are recorded; it may already hold some.

    Returns:
        A context manager that yields `provenance`.
    """
    with eager_stance(), HostCopyMode(provenance, _ignore):
        yield provenance
