"""What each kind of sync hazard is called in a report, its class, and the rewrite that removes it.

The rewrites are the ones the suite's own families measure: each names the variant that shows it, so a reader
can run `pitfalls probe` on the pair and see the hazard go away. Each label belongs to one `HazardClass` of
`CLASSES`: the doctor makes one rule of each, whose fix is the class's rewrite. A scalar read torch makes on the
line's behalf inside GradScaler (the torch functions between the line and the op, `HazardSite.via`) is a class of its
own, with GradScaler's rewrite, and not the line's own scalar read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CLASSES", "DATA_TO_DEVICE", "ELEMENT_WRITE", "FILL_TO_DEVICE", "GET_SCALE", "HOST_VALUE", "INF_CHECK",
           "MASK", "NONZERO", "NUMPY", "REPEAT", "SCALAR", "SHAPE", "TO_HOST", "UNIQUE", "HazardClass", "HazardKind",
           "describe"]


@dataclass(frozen=True)
class HazardClass:
    """A class of sync hazards that one rewrite removes.

    Attributes:
        name: its short name ("nonzero", "scalar read").
        finds: what it is, in a sentence.
        rewrite: the change that removes it, with the family variant that shows it where one does.
    """

    name: str
    finds: str
    rewrite: str


@dataclass(frozen=True)
class HazardKind:
    """A readable name for a sync-hazard label, and its class.

    Attributes:
        op: what the report calls the op (e.g. "aten.nonzero", "boolean-mask index", ".item()").
        hazard: its class, whose rewrite removes it.
    """

    op: str
    hazard: HazardClass

    @property
    def rewrite(self) -> str:
        """The change that removes the hazard."""
        return self.hazard.rewrite


NONZERO = HazardClass(
    "nonzero", "torch.nonzero (argwhere, a boolean tensor's .nonzero()): the host reads how many elements are set, "
    "to size the output", "count_nonzero + topk with a valid mask, not nonzero + randperm (sampler: static); "
    "torch.where (loss: where)")
MASK = HazardClass(
    "boolean mask", "indexing, selecting or assigning with a boolean mask (x[mask], masked_select, x[mask] = v): the "
    "output's size is the mask's count, read on the host",
    "torch.where(mask, x, fill) instead of x[mask], or the whole tensor and ignore_index (loss: ignore_index)")
UNIQUE = HazardClass(
    "unique", "torch.unique and its kin: the host reads how many values are unique",
    "sort + diff + count_nonzero on the device, and torch.where instead of a Python if (loss: sort_count)")
SCALAR = HazardClass(
    "scalar read", ".item(), int(), float(), bool(), an if or torch.equal of device tensors: the host waits for the "
    "value",
    "keep the value on the device: sum tensors in the loop and read once after it; torch.where, not if")
TO_HOST = HazardClass(
    "blocking copy to the host", ".tolist(), .cpu(), .to('cpu') or printing of a device tensor: the host waits "
    "for the copy", "keep the result on the device and copy once at the end, or non_blocking=True into pinned memory")
SHAPE = HazardClass(
    "data-dependent shape", "another op whose output's shape depends on the data (PyTorch tags it "
    "dynamic_output_shape): the host reads the shape",
    "give the op a fixed-shape form: a mask with torch.where, topk, or padding to a known size")
FILL_TO_DEVICE = HazardClass(
    "host fill copied to the device", "a tensor a factory (torch.randn, zeros, arange, tensor, ...) fills on the "
    "host, then copied to the device, blocking: the host waits for the copy",
    "make it on the device (torch.full / torch.zeros / torch.arange with device=), or copy once, outside the loop, "
    "with non_blocking=True from pinned memory")
DATA_TO_DEVICE = HazardClass(
    "blocking copy to the device", "a batch or other host data copied to the device without non_blocking: the host "
    "waits for the copy", "copy from pinned memory without waiting: DataLoader(pin_memory=True) (or .pin_memory()) "
    "and .to(device, non_blocking=True)")
ELEMENT_WRITE = HazardClass(
    "write of host data", "one element written from Python (x[i] = 3), or a host tensor written into a slice of a "
    "device tensor: a blocking copy", "x[i:i+1] = v fills on the device without a copy; a host tensor: copy it once, "
    "non_blocking from pinned memory")
HOST_VALUE = HazardClass(
    "assignment of a host value", "x[idx] = v or x[mask] = v with a host value (a Python number, a host tensor): ATen "
    "copies it to the device first", "torch.where(mask, v, x) (loss: where), or a value made on the device: "
    "torch.full((), v, device=x.device)")
NUMPY = HazardClass(
    "numpy of device data", ".numpy() of a device tensor: a TypeError on CUDA, a copy to the host once fixed",
    "copy once with .cpu() first, at the end")
REPEAT = HazardClass(
    "repeat_interleave without output_size", "repeat_interleave with tensor repeats and no output_size: the host "
    "reads the repeats' sum", "pass output_size= so the output shape is known without reading the repeats")
INF_CHECK = HazardClass(
    "GradScaler's inf check", "GradScaler.step with an optimizer that is not fused (no _step_supports_amp_scaling): "
    "it reads found_inf with .item() to decide whether to step, every step",
    "fused=True in the optimizer where it has it (Adam, AdamW, SGD): GradScaler hands it found_inf on the device; or "
    "bf16 autocast without a GradScaler")
GET_SCALE = HazardClass(
    "GradScaler.get_scale", "scaler.get_scale() in the step: .item() of the scale, the host waits for it",
    "read the scale only on the steps that log it (a step skipped for infs shows as the scale dropping at the next "
    "read), not every step")
CLASSES = (NONZERO, MASK, UNIQUE, SCALAR, TO_HOST, SHAPE, FILL_TO_DEVICE, DATA_TO_DEVICE, ELEMENT_WRITE, HOST_VALUE,
           NUMPY, REPEAT, INF_CHECK, GET_SCALE)
# The GradScaler functions whose scalar reads are classes of their own (torch/amp/grad_scaler.py): `_maybe_opt_step`
# sums found_inf with .item() for an optimizer without _step_supports_amp_scaling; `get_scale` reads the scale.
_GRAD_SCALER = "torch.amp.grad_scaler."
_SCALER_READS = {"_maybe_opt_step": HazardKind(".item() of GradScaler's found_inf", INF_CHECK),
                 "get_scale": HazardKind(".item() of GradScaler's scale", GET_SCALE)}

# "Tensor.to of torch.randn's tensor (host to device)": the factory that filled the copied tensor on the host.
_MADE_BY = re.compile(r" of (?P<factory>torch\.\w+)'s tensor ")

# Exact labels from `pitfalls.probes.syncs.hazard_label`; anything else falls through to the rules in `describe`.
_KINDS: dict[str, HazardKind] = {
    "aten.nonzero.default": HazardKind("aten.nonzero", NONZERO),
    "aten.index.Tensor (bool mask)": HazardKind("boolean-mask index", MASK),
    "aten.masked_select.default": HazardKind("aten.masked_select (boolean mask)", MASK),
    "aten._local_scalar_dense.default": HazardKind(".item()", SCALAR),
    # Under torch.inference_mode no autograd key decomposes item() first: a dispatch mode sees the composite op.
    "aten.item.default": HazardKind(".item()", SCALAR),
    "aten.equal.default": HazardKind("torch.equal", SCALAR),
    "aten.repeat_interleave.Tensor": HazardKind("aten.repeat_interleave", REPEAT),
}


def _scaler_read(via: tuple[str, ...]) -> HazardKind | None:
    """GradScaler's own scalar read: the innermost GradScaler function between the line and the op is one of
    `_SCALER_READS` (its generator expression included), and no optimizer's step runs inside it (GradScaler.step
    calls the optimizer's, whose own reads are the line's)."""
    names = [f.split(".<locals>")[0] for f in via]
    inner = max((i for i, f in enumerate(names) if f.startswith(_GRAD_SCALER)), default=None)
    if inner is None or any(f.startswith("torch.optim.") for f in names[inner:]):
        return None
    return _SCALER_READS.get(names[inner].rsplit(".", 1)[-1])


def describe(label: str, *, in_backward: bool = False, via: tuple[str, ...] = ()) -> HazardKind:
    """Name a hazard label for a report and give its class.

    Args:
        label: a label from `pitfalls.probes.syncs.hazard_label` (e.g. "aten.nonzero.default").
        in_backward: the op ran in autograd's backward pass, on behalf of the forward line it is reported at.
        via: the torch functions between the line and the op, outermost first (`pitfalls.probes.sites.HazardSite`).

    Returns:
        The `HazardKind`.
    """
    if label in _KINDS and _KINDS[label].hazard is SCALAR and (scaler := _scaler_read(via)) is not None:
        return scaler
    if "index_put" in label and label.endswith("host value to device)"):
        # x[idx] = 3: ATen copies the Python number, made a CPU tensor, to the device before writing it.
        op = "boolean-mask assignment of a host value" if "bool mask" in label else "indexed assignment of a host value"
        return HazardKind(op, HOST_VALUE)
    if label.endswith("(bool mask)") and "index_put" in label:
        # x[mask] = v dispatches index_put; so does the backward of x[mask], which is how it shows up in a step.
        op = "boolean-mask index (its backward index_put)" if in_backward else "boolean-mask assignment"
        return HazardKind(op, MASK)
    if label.startswith("Tensor.numpy"):
        kind = HazardKind(".numpy() of device data: a TypeError on CUDA", NUMPY)
    elif label.startswith("Tensor.") and label.endswith("(device to host)"):
        # Seen at the Python API: name the call the user wrote.
        method = label.split()[0].removeprefix("Tensor.")
        shown = {"__format__": "formatting", "__repr__": "printing"}.get(method, f".{method}()")
        kind = HazardKind(f"device-to-host copy ({shown})", TO_HOST)
    elif label.endswith("(device to host)"):
        kind = HazardKind("device-to-host copy", TO_HOST)
    elif label.startswith(("Tensor.", "torch.")) and label.endswith("(host to device)"):
        call = label.split()[0]
        made_by = _MADE_BY.search(label)
        if call.startswith("torch."):  # a factory given data and a device: built on the host, then copied
            kind = HazardKind(f"host-to-device copy ({call}(..., device=...))", FILL_TO_DEVICE)
        elif made_by:  # a factory's fill, copied: it can be made on the device instead
            kind = HazardKind(f"host-to-device copy (.{call.removeprefix('Tensor.')}(device)) of a tensor "
                              f"{made_by['factory']} made on the host", FILL_TO_DEVICE)
        else:  # host data (a batch, an array's memory): it cannot be made on the device, but copied without a wait
            kind = HazardKind(f"host-to-device copy (.{call.removeprefix('Tensor.')}(device))", DATA_TO_DEVICE)
    elif label.endswith("(host to device)"):
        # At ATen level: x[i] = 3 on one element, or a host tensor written into a slice.
        kind = HazardKind("host-to-device copy (a write of host data)", ELEMENT_WRITE)
    elif label in _KINDS:
        kind = _KINDS[label]
    elif "unique" in label:
        kind = HazardKind(f"unique ({label.removesuffix('.default')})", UNIQUE)
    else:
        kind = HazardKind(label.removesuffix(".default"), SHAPE)
    return HazardKind(f"{kind.op} (backward)", kind.hazard) if in_backward else kind
