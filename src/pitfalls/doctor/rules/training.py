"""The GPU path's training rules: DDP's all-reduces that ``no_sync`` would skip or does not, a search for unused
parameters that finds none, ``nn.DataParallel``, a GradScaler with bfloat16 autocast (docs/doctor.md, "The GPU path's
rules"). GradScaler's own syncs are classes of sync hazard (`rules.syncs`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

from torch.nn.parallel import DataParallel

from pitfalls.doctor.planted import GPU_PATH
from pitfalls.doctor.records import Seen
from pitfalls.doctor.rule import Hit, Plant, Rule
from pitfalls.doctor.setup_watch import SetupWatch
from pitfalls.doctor.training_watch import DdpForward, DdpSeen, TrainingWatch
from pitfalls.probes.sites import SourceLine, source_line

__all__ = ["ACCUMULATION", "BF16_SCALER", "DATA_PARALLEL", "FIND_UNUSED", "NO_SYNC_BACKWARD", "RULES"]

_DDP_DOCS = "PyTorch's DDP docs (DistributedDataParallel.no_sync: the forward must run inside it)"
_ALL_REDUCE_WHERE = "CPU or GPU; an all-reduce costs across processes (several GPUs)"


def _ddp(seen: Seen) -> tuple[list[DdpSeen], int]:
    watch, steps = seen.scanned(TrainingWatch)
    return ([] if watch is None else list(watch.ddp.values())), steps


def _most(forwards: list[DdpForward]) -> SourceLine | None:
    """The line that ran the most of these forwards."""
    return Counter(f.line for f in forwards).most_common(1)[0][0]


def _reductions(in_no_sync: bool) -> Callable[[Seen], list[Hit]]:
    """The all-reduces of each DDP module's backwards a step, those whose backward ran outside ``no_sync`` (one a
    step is needed: more are skippable) or those whose backward ran inside it (all run anyway)."""
    def find(seen: Seen) -> list[Hit]:
        modules, steps = _ddp(seen)
        hits = []
        for module in modules:
            ran = [f for f in module.armed if f.backward and f.in_no_sync == in_no_sync]
            per_step = len(ran) / steps if steps else 0.0
            if in_no_sync and ran:
                hits.append(Hit(f"{per_step:g} all-reduce(s) a step run anyway: the forward ran outside no_sync(), "
                                "its backward inside it", _most(ran), per_step))
            elif not in_no_sync and per_step > 1:
                hits.append(Hit(f"{per_step:g} all-reduces a step, one per micro-batch's backward; no_sync() would "
                                f"skip {per_step - 1:g}", _most(ran), per_step - 1))
        return hits

    return find


def _find_unused(seen: Seen) -> list[Hit]:
    modules, steps = _ddp(seen)
    made = seen.watched(SetupWatch).definitions
    hits = []
    for module in modules:
        ddp, read = module.module(), [f.all_used for f in module.armed if f.all_used is not None]
        if ddp is None or not read or not all(read):
            continue
        hits.append(Hit(f"find_unused_parameters=True: {len(module.armed) / steps:g} search(es) of the autograd graph "
                        f"a step, and every parameter was used in each of {len(read)} backward(s)",
                        made.line_of(ddp), len(module.armed) / steps))
    return hits


def _data_parallel(seen: Seen) -> list[Hit]:
    made = seen.watched(SetupWatch).definitions.made(DataParallel)
    return [Hit(f"nn.DataParallel of {type(parallel.module).__name__}", line, None) for parallel, line in made]


def _bf16_scaler(seen: Seen) -> list[Hit]:
    watch, steps = seen.scanned(TrainingWatch)
    if watch is None:
        return []
    return [Hit("GradScaler.scale of a loss whose forward ran under bfloat16 autocast", source_line(key), n / steps)
            for key, n in watch.bf16_scales.items()]


_READS = "the training watch of the scanned steps: "
ACCUMULATION = Rule(
    "gradient accumulation without no_sync", "rule",
    "gradient accumulation under DDP without no_sync(): each micro-batch's backward all-reduces the gradients, where "
    "the last one's would do",
    "run the forward and the backward of every micro-batch but the last inside model.no_sync(): with model.no_sync(): "
    "model(x).backward(); the last, outside it, all-reduces the accumulated gradients once", _DDP_DOCS,
    _READS + "each DDP forward that arms an all-reduce (grad mode on, outside no_sync) and its backward, at the "
    "forward's line", _reductions(in_no_sync=False),
    Plant.of(GPU_PATH, "accumulated_loss = accumulated(x[micro])", "synced_loss = synced(x[micro])"), TrainingWatch,
    _ALL_REDUCE_WHERE, gated=True)
NO_SYNC_BACKWARD = Rule(
    "no_sync around the backward alone", "rule",
    "a DDP forward run outside no_sync() whose backward runs inside it: DDP arms the all-reduce at the forward "
    "(_post_forward's reducer.prepare_for_backward), so the backward all-reduces anyway",
    "run the forward inside no_sync() too: with model.no_sync(): loss = model(x); loss.backward()",
    f"{_DDP_DOCS}; torch/nn/parallel/distributed.py",
    _READS + "each DDP forward that arms an all-reduce, and whether its backward ran inside no_sync(), at the "
    "forward's line", _reductions(in_no_sync=True),
    Plant.of(GPU_PATH, "outside = misplaced(x[micro])", "synced_loss = synced(x[micro])"), TrainingWatch,
    _ALL_REDUCE_WHERE, gated=True)
FIND_UNUSED = Rule(
    "find_unused_parameters with none unused", "rule",
    "DistributedDataParallel(find_unused_parameters=True) where every parameter was used in each scanned step: DDP "
    "searches the autograd graph from the outputs at every forward, for nothing (it warns once, at the first backward)",
    "find_unused_parameters=False (the default); where the unused parameters are the same every step, "
    "static_graph=True instead", "DDP's own check (its reducer's warning: find_unused_parameters=True ... did not "
    "find any unused parameters)",
    _READS + "the reducer's map of the parameters each armed backward used; the setup watch: where the script made "
    "the module", _find_unused,
    Plant.of(GPU_PATH, "accumulated = DistributedDataParallel(", "branchy = DistributedDataParallel("), TrainingWatch,
    gated=True, watch=SetupWatch)
DATA_PARALLEL = Rule(
    "DataParallel", "rule",
    "nn.DataParallel: one process drives every GPU, replicates the module to each every forward and gathers the "
    "outputs on the first GPU, which alone computes the loss: its load and memory are unbalanced, and it is slower "
    "than DDP", "DistributedDataParallel, one process a GPU (torchrun --nproc-per-node N)",
    "article 001 (DataParallel gathers the outputs on the main GPU, which does the loss alone; distributed training "
    "keeps every GPU at full load) and PyTorch's docs (DistributedDataParallel is recommended over DataParallel)",
    "the setup watch of the whole run: where the script made each DataParallel", _data_parallel,
    Plant.of(GPU_PATH, "parallel = nn.DataParallel(", "synced = DistributedDataParallel("),
    where="CPU or GPU; costs on several GPUs", gated=True, watch=SetupWatch)
BF16_SCALER = Rule(
    "GradScaler with bfloat16", "rule",
    "a GradScaler scaling a loss whose forward ran under bfloat16 autocast: bfloat16 has float32's exponent range, so "
    "its gradients need no scaling, and the scaler adds its scaling, unscaling and inf check to every step",
    "drop the GradScaler with bfloat16 autocast: loss.backward() and optimizer.step() (loss scaling is for float16)",
    "PyTorch's AMP docs (gradient scaling keeps float16 gradients from flushing to zero)",
    _READS + "each GradScaler.scale call and the autocast dtypes since the previous one", _bf16_scaler,
    Plant.of(GPU_PATH, "brain_scaler.scale(brain_loss).backward()", "scaler.scale(half_loss).backward()"),
    TrainingWatch, gated=True)
RULES = (ACCUMULATION, NO_SYNC_BACKWARD, FIND_UNUSED, DATA_PARALLEL, BF16_SCALER)
