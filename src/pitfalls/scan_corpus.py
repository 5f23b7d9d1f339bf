"""The sync-hazard corpus: one-line constructs, each labelled with the syncs it makes per call on CUDA.

Every construct is a function whose body is one line, run eagerly with every tensor on one device. The labels
come from what CUDA does, read in ATen's source and PyTorch's docs, not from what the counter says: docs/scan.md
gives each rule and its source. `CORPUS` lists them; `HELPER` is a helper called from two lines. A construct that
needs CUDA (`Construct.needs_cuda` says why) is labelled like the others and left out of a run on any other device:
`runs_on` tells. ``scripts/gpu-run``'s ``proof corpus`` piece (`pitfalls.gpu_run.syncs`) runs the same corpus on
CUDA.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace

import torch

from pitfalls.probes.hostcopy import Provenance, keep_provenance
from pitfalls.probes.sites import HazardLocator, LocatedHazards

__all__ = [
    "CORPUS", "HELPER", "Agreement", "Construct", "agreement", "corpus_data", "counted_line", "expected_per_line",
    "line_of", "run_corpus", "runs_on", "scan_per_line",
]

N = 64
# Why `capturable=True` runs on CUDA only (torch.optim.optimizer._get_capturable_supported_devices has no CPU).
CAPTURABLE_NEEDS_CUDA = "capturable=True needs its parameters on CUDA (torch.optim refuses the CPU)"


def _parameters(g: torch.Generator, device: str | torch.device) -> list[torch.Tensor]:
    """Two trained parameter tensors (a weight and a bias) with their gradients, on `device`."""
    params = [torch.randn(8, 4, generator=g), torch.randn(8, generator=g)]
    grads = [torch.randn(p.shape, generator=g) for p in params]
    out = []
    for param, grad in zip(params, grads, strict=True):
        leaf = param.to(device).requires_grad_(True)
        leaf.grad = grad.to(device)
        out.append(leaf)
    return out


def _optimizers(g: torch.Generator, device: torch.device) -> dict[str, object]:
    """The optimizers the constructs step, each over parameters of its own; the CUDA-only ones only on CUDA."""
    optim = torch.optim
    made: dict[str, object] = {
        "sgd": optim.SGD(_parameters(g, device), lr=0.01),
        "sgd_momentum": optim.SGD(_parameters(g, device), lr=0.01, momentum=0.9),
        "adam_foreach": optim.Adam(_parameters(g, device), lr=1e-3, foreach=True),
        "adam_single": optim.Adam(_parameters(g, device), lr=1e-3, foreach=False),
        "adamw_foreach": optim.AdamW(_parameters(g, device), lr=1e-3, foreach=True),
        "adamw_single": optim.AdamW(_parameters(g, device), lr=1e-3, foreach=False),
        "adamw_fused": optim.AdamW(_parameters(g, device), lr=1e-3, fused=True),
        "scaled_sgd": optim.SGD(_parameters(g, device), lr=0.01),
        "scaled_fused": optim.AdamW(_parameters(g, device), lr=1e-3, fused=True),
        "clipped": _parameters(g, device),
    }
    if device.type == "cuda":
        made["adamw_capturable"] = optim.AdamW(_parameters(g, device), lr=1e-3, capturable=True)
    # init_scale=1: the gradients keep their size however often the scaler unscales them.
    made["scaler"] = torch.amp.GradScaler(device.type, init_scale=1.0)
    made["scaler_fused"] = torch.amp.GradScaler(device.type, init_scale=1.0)
    return made


def corpus_data(device: str | torch.device = "cpu") -> SimpleNamespace:
    """A namespace of the tensors the constructs read, all on `device`, the same values on every device (the
    constructs write to `y` and `w`)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(N, generator=g)
    d = SimpleNamespace(
        x=x,
        other=x.clone() + 1.0,
        mask=x > 0,
        idx=torch.randint(0, N, (16,), generator=g),
        x2d=torch.randn(8, N, generator=g),
        idx2d=torch.randint(0, N, (8, 4), generator=g),
        labels=torch.randint(0, 8, (N,), generator=g),
        reps=torch.randint(0, 3, (N,), generator=g),
        y=x.clone(),
        w=torch.randn(N, generator=g),
        loss=x.abs().mean(),
    )
    for name, value in vars(d).items():
        setattr(d, name, value.to(device))
    d.w.requires_grad_(True)
    d.total_reps = int(d.reps.sum().item())
    d.hits = 0
    d.device = torch.device(device)
    for name, value in _optimizers(g, d.device).items():
        setattr(d, name, value)
    for scaler in (d.scaler, d.scaler_fused):
        scaler.scale(d.loss)  # a scaler steps only after it has scaled once (it makes its scale there)
    return d


# -- the constructs: one line each -------------------------------------------------------------------------------


def bool_read(d: SimpleNamespace) -> object:
    return d.x[d.mask]


def bool_write_scalar(d: SimpleNamespace) -> None:
    d.y[d.mask] = 0.0


def bool_write_host_tensor(d: SimpleNamespace) -> None:
    d.y[d.mask] = torch.tensor(1.5)


def bool_write_device_scalar(d: SimpleNamespace) -> None:
    d.y[d.mask] = d.x.max()


def bool_write_device_slice(d: SimpleNamespace) -> None:
    d.y[d.mask] = d.x[:1]


def bool_read_write(d: SimpleNamespace) -> None:
    d.y[d.mask] = d.x[d.mask] * 2


def bool_read_backward(d: SimpleNamespace) -> None:
    d.w[d.mask].sum().backward()


def where_one_argument(d: SimpleNamespace) -> object:
    return torch.where(d.mask)


def where_three_arguments(d: SimpleNamespace) -> object:
    return torch.where(d.mask, d.x, 0.0)


def nonzero(d: SimpleNamespace) -> object:
    return torch.nonzero(d.mask)


def nonzero_as_tuple(d: SimpleNamespace) -> object:
    return d.mask.nonzero(as_tuple=True)


def count_nonzero(d: SimpleNamespace) -> object:
    return torch.count_nonzero(d.mask)


def unique(d: SimpleNamespace) -> object:
    return torch.unique(d.labels)


def masked_select(d: SimpleNamespace) -> object:
    return torch.masked_select(d.x, d.mask)


def repeat_interleave(d: SimpleNamespace) -> object:
    return torch.repeat_interleave(d.x, d.reps)


def repeat_interleave_output_size(d: SimpleNamespace) -> object:
    return torch.repeat_interleave(d.x, d.reps, output_size=d.total_reps)


def bincount(d: SimpleNamespace) -> object:
    return torch.bincount(d.labels)


def equal(d: SimpleNamespace) -> object:
    return torch.equal(d.x, d.other)


def item(d: SimpleNamespace) -> object:
    return d.loss.item()


def bool_of_tensor(d: SimpleNamespace) -> object:
    return bool(d.loss > 0)


def int_of_tensor(d: SimpleNamespace) -> object:
    return int(d.labels.max())


def float_of_tensor(d: SimpleNamespace) -> object:
    return float(d.loss)


def if_any(d: SimpleNamespace) -> None:
    if d.mask.any(): d.hits += 1  # noqa: E701 (one line: the construct is the branch on a tensor)


def f_string(d: SimpleNamespace) -> object:
    return f"loss {d.loss:.4f}"


def to_cpu_method(d: SimpleNamespace) -> object:
    return d.x.cpu()


def to_cpu_string(d: SimpleNamespace) -> object:
    return d.x.to("cpu")


def to_cpu_keyword(d: SimpleNamespace) -> object:
    return d.x.to(device="cpu")


def to_cpu_non_blocking(d: SimpleNamespace) -> object:
    return d.x.to("cpu", non_blocking=True)


def tolist(d: SimpleNamespace) -> object:
    return d.x.tolist()


def to_device(d: SimpleNamespace) -> object:
    return torch.arange(4).to(d.x.device)


def to_device_non_blocking(d: SimpleNamespace) -> object:
    return torch.arange(4).to(d.x.device, non_blocking=True)


def to_device_then_nonzero(d: SimpleNamespace) -> object:
    return torch.nonzero(torch.arange(4).to(d.x.device, non_blocking=True))


def tensor_on_device(d: SimpleNamespace) -> object:
    return torch.tensor([1.0, 2.0], device=d.x.device)


def full_on_device(d: SimpleNamespace) -> object:
    return torch.full((2,), 1.5, device=d.x.device)


def element_write_scalar(d: SimpleNamespace) -> None:
    d.y[3] = 0.0


def slice_write_scalar(d: SimpleNamespace) -> None:
    d.y[:4] = 0.0


def slice_write_host_tensor(d: SimpleNamespace) -> None:
    d.y[:2] = torch.tensor([1.0, 2.0])


def integer_write_scalar(d: SimpleNamespace) -> None:
    d.y[d.idx] = 0.0


def integer_write_device_scalar(d: SimpleNamespace) -> None:
    d.y[d.idx] = d.x.max()


def integer_index(d: SimpleNamespace) -> object:
    return d.x[d.idx]


def index_select(d: SimpleNamespace) -> object:
    return torch.index_select(d.x, 0, d.idx)


def gather(d: SimpleNamespace) -> object:
    return torch.gather(d.x2d, 1, d.idx2d)


def topk(d: SimpleNamespace) -> object:
    return torch.topk(d.x, 5)


def sort(d: SimpleNamespace) -> object:
    return torch.sort(d.x)


def masked_fill(d: SimpleNamespace) -> object:
    return d.x.masked_fill(d.mask, 0.0)


def clamp_in_place(d: SimpleNamespace) -> object:
    return d.y.clamp_(min=-1.0, max=1.0)


def sgd_step(d: SimpleNamespace) -> None:
    d.sgd.step()


def sgd_momentum_step(d: SimpleNamespace) -> None:
    d.sgd_momentum.step()


def adam_foreach_step(d: SimpleNamespace) -> None:
    d.adam_foreach.step()


def adam_single_tensor_step(d: SimpleNamespace) -> None:
    d.adam_single.step()


def adamw_foreach_step(d: SimpleNamespace) -> None:
    d.adamw_foreach.step()


def adamw_single_tensor_step(d: SimpleNamespace) -> None:
    d.adamw_single.step()


def adamw_fused_step(d: SimpleNamespace) -> None:
    d.adamw_fused.step()


def adamw_capturable_step(d: SimpleNamespace) -> None:
    d.adamw_capturable.step()


def grad_scaler_step(d: SimpleNamespace) -> None:
    d.scaler.step(d.scaled_sgd); d.scaler.update()  # noqa: E702 (one line: a scaler steps once per update)


def grad_scaler_fused_step(d: SimpleNamespace) -> None:
    d.scaler_fused.step(d.scaled_fused); d.scaler_fused.update()  # noqa: E702 (one line, as above)


def clip_grad_norm(d: SimpleNamespace) -> object:
    return torch.nn.utils.clip_grad_norm_(d.clipped, 1.0)


def clip_grad_norm_nonfinite_check(d: SimpleNamespace) -> object:
    return torch.nn.utils.clip_grad_norm_(d.clipped, 1.0, error_if_nonfinite=True)


def _nonzero_rows(mask: torch.Tensor) -> torch.Tensor:
    return mask.nonzero()


def helper_called_twice(d: SimpleNamespace) -> None:
    _nonzero_rows(d.mask)
    _nonzero_rows(~d.mask)


@dataclass(frozen=True)
class Construct:
    """One construct of the corpus.

    Attributes:
        run: the one-line function; call it with `corpus_data(device)`.
        syncs: the syncs one call makes on CUDA in eager mode.
        needs_cuda: why it runs on CUDA only ("" when it runs on every device).
    """

    run: Callable[[SimpleNamespace], object]
    syncs: int
    needs_cuda: str = ""

    @property
    def name(self) -> str:
        """The construct's function name."""
        return self.run.__name__

    @property
    def code(self) -> str:
        """The construct's one line, without a linter's comment."""
        return inspect.getsource(self.run).splitlines()[-1].split("  # noqa")[0].strip()


CORPUS: tuple[Construct, ...] = (
    Construct(bool_read, 1),
    Construct(bool_write_scalar, 0),
    Construct(bool_write_host_tensor, 0),
    Construct(bool_write_device_scalar, 1),
    Construct(bool_write_device_slice, 1),
    Construct(bool_read_write, 2),
    Construct(bool_read_backward, 2),
    Construct(where_one_argument, 1),
    Construct(where_three_arguments, 0),
    Construct(nonzero, 1),
    Construct(nonzero_as_tuple, 1),
    Construct(count_nonzero, 0),
    Construct(unique, 1),
    Construct(masked_select, 1),
    Construct(repeat_interleave, 2),
    Construct(repeat_interleave_output_size, 0),
    Construct(bincount, 2),
    Construct(equal, 1),
    Construct(item, 1),
    Construct(bool_of_tensor, 1),
    Construct(int_of_tensor, 1),
    Construct(float_of_tensor, 1),
    Construct(if_any, 1),
    Construct(f_string, 1),
    Construct(to_cpu_method, 1),
    Construct(to_cpu_string, 1),
    Construct(to_cpu_keyword, 1),
    Construct(to_cpu_non_blocking, 0),
    Construct(tolist, 1),
    Construct(to_device, 1),
    Construct(to_device_non_blocking, 0),
    Construct(to_device_then_nonzero, 1),
    Construct(tensor_on_device, 1),
    Construct(full_on_device, 0),
    Construct(element_write_scalar, 1),
    Construct(slice_write_scalar, 0),
    Construct(slice_write_host_tensor, 1),
    Construct(integer_write_scalar, 1),
    Construct(integer_write_device_scalar, 0),
    Construct(integer_index, 0),
    Construct(index_select, 0),
    Construct(gather, 0),
    Construct(topk, 0),
    Construct(sort, 0),
    Construct(masked_fill, 0),
    Construct(clamp_in_place, 0),
    Construct(sgd_step, 0),
    Construct(sgd_momentum_step, 0),
    Construct(adam_foreach_step, 0),
    Construct(adam_single_tensor_step, 0),
    Construct(adamw_foreach_step, 0),
    Construct(adamw_single_tensor_step, 0),
    Construct(adamw_fused_step, 0),
    Construct(adamw_capturable_step, 0, needs_cuda=CAPTURABLE_NEEDS_CUDA),
    Construct(grad_scaler_step, 1),
    Construct(grad_scaler_fused_step, 0),
    Construct(clip_grad_norm, 0),
    Construct(clip_grad_norm_nonfinite_check, 1),
)

# The helper's line syncs once per call site: twice per call of `helper_called_twice`.
HELPER = Construct(helper_called_twice, 2)


def line_of(fn: Callable[..., object]) -> tuple[str, int]:
    """(path, line number) of the last line of a function of this module (a construct's one line, the helper's)."""
    lines, start = inspect.getsourcelines(fn)
    return inspect.getsourcefile(fn) or "", start + len(lines) - 1


def counted_line(construct: Construct) -> tuple[str, int]:
    """The line a construct's syncs are counted at: its own, or for the helper its callee's (where scans count)."""
    return line_of(_nonzero_rows if construct is HELPER else construct.run)


def runs_on(construct: Construct, device: str | torch.device) -> bool:
    """Whether a construct runs on `device` (a device or its name): one that needs CUDA runs there only."""
    return not construct.needs_cuda or torch.device(device).type == "cuda"


def run_corpus(d: SimpleNamespace) -> None:
    """One step over the corpus data ``d`` (`corpus_data`): every construct that runs on its device, then the helper."""
    for construct in CORPUS:
        if runs_on(construct, d.device):
            construct.run(d)
    HELPER.run(d)


_Line = tuple[str, int]


def expected_per_line(device: str | torch.device | None = None) -> dict[_Line, int]:
    """``{(path, line): syncs per call}`` of `run_corpus` as labelled (the helper's at its own line), for the
    constructs that run on `device` (None: every construct, the CUDA-only ones too)."""
    return {counted_line(c): c.syncs for c in (*CORPUS, HELPER) if device is None or runs_on(c, device)}


def scan_per_line(device: str = "cpu", *, calls: int = 2) -> tuple[dict[_Line, float], LocatedHazards]:
    """Scan `run_corpus` once warmed up (under `keep_provenance`, as `pitfalls scan` warms up): the counter's syncs
    per call by source line, and what it located.

    Args:
        device: where the corpus data lives.
        calls: counted calls after one warm-up call.

    Returns:
        (syncs per call by line, the located hazards over all counted calls).
    """
    d = corpus_data(device)
    provenance = Provenance()
    with keep_provenance(provenance):
        run_corpus(d)
    with HazardLocator(provenance=provenance) as locator:
        for _ in range(calls):
            run_corpus(d)
    found = locator.result
    per_line: dict[_Line, float] = {}
    for site in found.sites:
        key = (site.line.path, site.line.lineno) if site.line else ("", 0)
        per_line[key] = per_line.get(key, 0) + site.count / calls
    return per_line, found


@dataclass(frozen=True)
class Agreement:
    """How one per-line count agrees with another taken as the truth.

    Attributes:
        precision: the share of the counted syncs that the truth has at the same line.
        recall: the share of the truth's syncs counted at their line.
        wrong: (line, counted, truth) for every line where they differ.
    """

    precision: float
    recall: float
    wrong: tuple[tuple[_Line, float, float], ...]


def agreement(counted: Mapping[_Line, float], truth: Mapping[_Line, float]) -> Agreement:
    """Compare per-line counts with the truth, line by line (a sync counted at the wrong line is a miss).

    Args:
        counted: syncs per call by line, as a counter says.
        truth: syncs per call by line, as labelled or as CUDA counted them.

    Returns:
        The `Agreement`; precision and recall are 1.0 when nothing was counted and nothing was due.
    """
    lines = set(counted) | set(truth)
    hits = sum(min(counted.get(line, 0), truth.get(line, 0)) for line in lines)
    total_counted = sum(counted.values())
    total_truth = sum(truth.values())
    wrong = tuple(sorted((line, counted.get(line, 0), truth.get(line, 0)) for line in lines
                         if counted.get(line, 0) != truth.get(line, 0)))
    return Agreement(precision=hits / total_counted if total_counted else 1.0,
                     recall=hits / total_truth if total_truth else 1.0, wrong=wrong)
