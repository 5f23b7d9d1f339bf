"""What each kind of sync hazard is called in a report, and the rewrite that removes it.

The rewrites are the ones the suite's own families measure: each names the variant that shows it, so a reader
can run `pitfalls probe` on the pair and see the hazard go away.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["HazardKind", "describe"]


@dataclass(frozen=True)
class HazardKind:
    """A readable name for a sync-hazard label, and how to write the code without it.

    Attributes:
        op: what the report calls the op (e.g. "aten.nonzero", "boolean-mask index", ".item()").
        rewrite: the change that removes the hazard, with the family variant that shows it where one does.
    """

    op: str
    rewrite: str


_MASK = "torch.where(mask, x, fill) instead of x[mask], or the whole tensor and ignore_index (loss: ignore_index)"
_NONZERO = "count_nonzero + topk with a valid mask, not nonzero + randperm (sampler: static); torch.where (loss: where)"
_UNIQUE = "sort + diff + count_nonzero on the device, and torch.where instead of a Python if (loss: sort_count)"
_ITEM = "keep the value on the device: sum tensors in the loop and read once after it; torch.where, not if"
_COPY = "keep the result on the device and copy once at the end, or non_blocking=True into pinned memory"
_SHAPE = "give the op a fixed-shape form: a mask with torch.where, topk, or padding to a known size"
_TO_DEVICE = ("make it on the device (torch.full / torch.zeros / torch.arange with device=), or copy once, outside "
              "the loop, with non_blocking=True from pinned memory")
_HOST_DATA_TO_DEVICE = ("copy from pinned memory without waiting: DataLoader(pin_memory=True) (or .pin_memory()) "
                        "and .to(device, non_blocking=True)")
_ELEMENT_WRITE = ("x[i:i+1] = v fills on the device without a copy; a host tensor: copy it once, non_blocking "
                  "from pinned memory")
_HOST_VALUE = ("torch.where(mask, v, x) (loss: where), or a value made on the device: torch.full((), v, "
               "device=x.device)")

# "Tensor.to of torch.randn's tensor (host to device)": the factory that filled the copied tensor on the host.
_MADE_BY = re.compile(r" of (?P<factory>torch\.\w+)'s tensor ")

# Exact labels from `pitfalls.probes.syncs.hazard_label`; anything else falls through to the rules in `describe`.
_KINDS: dict[str, HazardKind] = {
    "aten.nonzero.default": HazardKind("aten.nonzero", _NONZERO),
    "aten.index.Tensor (bool mask)": HazardKind("boolean-mask index", _MASK),
    "aten.masked_select.default": HazardKind("aten.masked_select (boolean mask)", _MASK),
    "aten._local_scalar_dense.default": HazardKind(".item()", _ITEM),
    # Under torch.inference_mode no autograd key decomposes item() first: a dispatch mode sees the composite op.
    "aten.item.default": HazardKind(".item()", _ITEM),
    "aten.equal.default": HazardKind(
        "torch.equal", "compare on the device, (a == b).all(), and branch with torch.where"
    ),
    "aten.repeat_interleave.Tensor": HazardKind(
        "aten.repeat_interleave", "pass output_size= so the output shape is known without reading the repeats"
    ),
}


def describe(label: str, *, in_backward: bool = False) -> HazardKind:
    """Name a hazard label for a report and give its rewrite.

    Args:
        label: a label from `pitfalls.probes.syncs.hazard_label` (e.g. "aten.nonzero.default").
        in_backward: the op ran in autograd's backward pass, on behalf of the forward line it is reported at.

    Returns:
        The `HazardKind`.
    """
    if "index_put" in label and label.endswith("host value to device)"):
        # x[idx] = 3: ATen copies the Python number, made a CPU tensor, to the device before writing it.
        op = "boolean-mask assignment of a host value" if "bool mask" in label else "indexed assignment of a host value"
        return HazardKind(op, _HOST_VALUE)
    if label.endswith("(bool mask)") and "index_put" in label:
        # x[mask] = v dispatches index_put; so does the backward of x[mask], which is how it shows up in a step.
        op = "boolean-mask index (its backward index_put)" if in_backward else "boolean-mask assignment"
        return HazardKind(op, _MASK)
    if label.startswith("Tensor.numpy"):
        kind = HazardKind(".numpy() of device data: a TypeError on CUDA", "copy once with .cpu() first, at the end")
    elif label.startswith("Tensor.") and label.endswith("(device to host)"):
        # Seen at the Python API: name the call the user wrote.
        method = label.split()[0].removeprefix("Tensor.")
        shown = {"__format__": "formatting", "__repr__": "printing"}.get(method, f".{method}()")
        kind = HazardKind(f"device-to-host copy ({shown})", _COPY)
    elif label.endswith("(device to host)"):
        kind = HazardKind("device-to-host copy", _COPY)
    elif label.startswith(("Tensor.", "torch.")) and label.endswith("(host to device)"):
        call = label.split()[0]
        made_by = _MADE_BY.search(label)
        if call.startswith("torch."):  # a factory given data and a device: built on the host, then copied
            kind = HazardKind(f"host-to-device copy ({call}(..., device=...))", _TO_DEVICE)
        elif made_by:  # a factory's fill, copied: it can be made on the device instead
            kind = HazardKind(f"host-to-device copy (.{call.removeprefix('Tensor.')}(device)) of a tensor "
                              f"{made_by['factory']} made on the host", _TO_DEVICE)
        else:  # host data (a batch, an array's memory): it cannot be made on the device, but copied without a wait
            kind = HazardKind(f"host-to-device copy (.{call.removeprefix('Tensor.')}(device))", _HOST_DATA_TO_DEVICE)
    elif label.endswith("(host to device)"):
        # At ATen level: x[i] = 3 on one element, or a host tensor written into a slice.
        kind = HazardKind("host-to-device copy (a write of host data)", _ELEMENT_WRITE)
    elif label in _KINDS:
        kind = _KINDS[label]
    elif "unique" in label:
        kind = HazardKind(f"unique ({label.removesuffix('.default')})", _UNIQUE)
    else:
        kind = HazardKind(label.removesuffix(".default"), _SHAPE)
    return HazardKind(f"{kind.op} (backward)", kind.rewrite) if in_backward else kind
