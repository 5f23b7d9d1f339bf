"""`pitfalls doctor --cuda-on-cpu`: a script written for CUDA runs unchanged on a CPU, taking its GPU path.

`CudaOnCpu` is entered once around the script's run, before the first instrument, and maps the script's CUDA calls
onto the CPU; `explain_failure` makes a call it does not cover one line (docs/doctor.md, "--cuda-on-cpu").
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch.overrides import TorchFunctionMode, _pop_mode, _push_mode
from torch.utils._python_dispatch import _disable_current_modes

from pitfalls.doctor.report import CudaOnCpuFigures, Failure
from pitfalls.probes.hostcopy import Provenance, to_non_blocking
from pitfalls.probes.sites import is_user_file, source_line

__all__ = ["CAPABILITY", "DEVICE_NAME", "HINT", "CudaOnCpu", "explain_failure", "no_modes"]

# What the mapped device answers: an A100's identity, so a script's "Ampere or later" branches (bf16, TF32) run.
DEVICE_NAME = "NVIDIA A100-SXM4-80GB"
CAPABILITY = (8, 0)

# The kinds of mapped calls the report counts.
MOVED, MADE, PINNED = "tensors moved to cuda", "tensors made on cuda", "tensors pinned"
SET_DEVICE, SYNCHRONIZE, QUERIES = "set_device", "synchronize", "device and memory queries"
STREAMS, NVTX, RNG = "streams and events", "nvtx ranges", "CUDA generator state"
AUTOCAST, SCALER = "autocast cuda -> cpu", "GradScaler cuda -> cpu"
NCCL, DDP, DATA_PARALLEL = "nccl -> gloo", "DDP device_ids", "DataParallel device_ids"
LOAD, DEFAULT_DEVICE = "torch.load map_location", "default device cuda -> cpu"

# A CUDA call's errors on a machine without a GPU: the CPU wheel's, the CUDA build's without a driver, NCCL's.
NEEDS_CUDA = (
    "Torch not compiled with CUDA enabled", "Found no NVIDIA driver", "No CUDA GPUs are available",
    "Cannot access accelerator device when none is available", "no CUDA-capable device is detected",
    "CUDA driver version is insufficient", "requires CUDA support", "Tried to instantiate dummy base class",
    "without ATen_cuda library", "NVTX functions not installed", "doesn't have NCCL built in",
    "ProcessGroupNCCL is only supported with GPUs",
)
HINT = ("the script needs CUDA, which this machine lacks: run it again with --cuda-on-cpu to take its GPU path on "
        "the CPU (pitfalls doctor --cuda-on-cpu SCRIPT -- ARGS)")


def _names_cuda(device: object) -> bool:
    """Whether a device argument names a CUDA device: "cuda", "cuda:1", torch.device("cuda", 1), or an index."""
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.split(":")[0].strip() == "cuda"
    return isinstance(device, int) and not isinstance(device, bool)


def _with_copy(args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """`Tensor.to`'s arguments with ``copy=True``: a move between host and device makes a new tensor."""
    flags = [i for i, arg in enumerate(args) if i >= 2 and isinstance(arg, bool)]
    if len(flags) >= 2:  # non_blocking, then copy, given by position
        return (*args[:flags[1]], True, *args[flags[1] + 1:]), kwargs
    return args, {**kwargs, "copy": True}


def _answer(value: object) -> Callable[..., Any]:
    return lambda *_args, **_kwargs: value


def _done(*_args: object, **_kwargs: object) -> bool:
    return True


def _nothing(*_args: object, **_kwargs: object) -> None:
    return None


@dataclasses.dataclass(frozen=True)
class MappedDeviceProperties:
    """What `torch.cuda.get_device_properties` answers under the mapping (the fields scripts read)."""

    total_memory: int
    name: str = DEVICE_NAME
    major: int = CAPABILITY[0]
    minor: int = CAPABILITY[1]
    multi_processor_count: int = 108
    is_integrated: bool = False
    is_multi_gpu_board: bool = False
    warp_size: int = 32


class MappedEvent:
    """A CUDA event on the CPU: the work before it is done when it is recorded; timing reads the host's clock."""

    query, wait, synchronize = _done, _nothing, _nothing

    def __init__(self, enable_timing: bool = False, **_kwargs: object) -> None:
        self.enable_timing = enable_timing
        self.at: float | None = None

    def record(self, *_args: object, **_kwargs: object) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, end: MappedEvent) -> float:
        """Milliseconds from this event to ``end``, with CUDA's errors (both timed, both recorded)."""
        if not (self.enable_timing and end.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self.at is None or end.at is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end.at - self.at) * 1e3


class MappedStream:
    """A CUDA stream on the CPU: its work runs as it is issued, so it is always done and waits for nothing."""

    query, wait_stream, wait_event, synchronize = _done, _nothing, _nothing, _nothing
    device, cuda_stream = torch.device("cuda", 0), 0

    def __init__(self, *_args: object, priority: int = 0, **_kwargs: object) -> None:
        self.priority = priority

    def record_event(self, event: MappedEvent | None = None) -> MappedEvent:
        event = event if event is not None else MappedEvent()
        event.record(self)
        return event

    def is_capturing(self) -> bool:
        return False

    def __enter__(self) -> MappedStream:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


class _CudaMode(TorchFunctionMode):
    """The torch calls that name CUDA, mapped onto the CPU; every other call passes. torch.compile traces it inside
    compiled code, so it is plain Python."""

    def __init__(self, mapping: CudaOnCpu) -> None:
        super().__init__()
        self._mapping = mapping

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 (torch's protocol)
        kwargs = kwargs or {}
        mapping = self._mapping
        if func is torch.Tensor.to:
            return mapping.to(func, args, kwargs)
        if func is torch.Tensor.cuda:
            return mapping.cuda(args, kwargs)
        if func is torch.Tensor.pin_memory:
            return mapping.pin(args[0])
        if func is torch.Tensor.is_pinned:
            return mapping.provenance.pinned(args[0])
        if func is torch.Tensor.record_stream:
            return None  # one stream: memory is never reused before the work that reads it is done
        if "device" in kwargs or kwargs.get("pin_memory"):
            return mapping.factory(func, args, kwargs)
        return func(*args, **kwargs)


def _mode_index() -> int | None:
    """Where the mapping's mode is on the torch function mode stack (0: the bottom), or None."""
    for index in range(torch._C._len_torch_function_stack()):
        if isinstance(torch._C._get_function_stack_at(index), _CudaMode):
            return index
    return None


@contextlib.contextmanager
def no_modes() -> Iterator[None]:
    """Run the block with no torch function mode and no dispatch mode but ``--cuda-on-cpu``'s, at the bottom of the
    stack (a dataset or a collate that calls CUDA still runs on the CPU); the stacks are as they were after it."""
    functions = []
    index = _mode_index()
    kept = 0 if index is None else index + 1
    while torch._C._len_torch_function_stack() > kept:
        functions.append(_pop_mode())
    try:
        with _disable_current_modes():
            yield
    finally:
        for mode in reversed(functions):
            _push_mode(mode)


def _from_script() -> bool:
    """Whether the caller of the patched function that asks is the script or a library it calls: not torch (whose
    internals get the real answers) and not the doctor."""
    return is_user_file(sys._getframe(2).f_code.co_filename)


class CudaOnCpu:
    """Run a script written for CUDA on the CPU inside the block: a device per local rank (``LOCAL_WORLD_SIZE``).

    Args:
        provenance: the run's host-made tensors, where pinned memory is marked.

    Attributes:
        calls: the mapped calls by kind (`MOVED`, `SET_DEVICE`, ...).
        devices: the CUDA devices the script sees.
        index: the current device.
    """

    def __init__(self, provenance: Provenance) -> None:
        self.provenance = provenance
        local = os.environ.get("LOCAL_WORLD_SIZE", "1").strip()
        self.devices = max(1, int(local)) if local.isdigit() else 1
        self.calls: dict[str, int] = {}
        self.index = 0
        self._default = self._stream = MappedStream()
        self._mode = _CudaMode(self)
        self._saved: list[tuple[object, str, bool, object]] = []
        self._group = False
        self._stack: contextlib.ExitStack | None = None

    def count(self, kind: str) -> None:
        """Count one mapped call of ``kind``; not while torch.compile traces the mode, whose guards would hold the
        count and compile again at every call (what compiled code maps, it maps in its graph, uncounted)."""
        if not torch.compiler.is_compiling():
            self.calls[kind] = self.calls.get(kind, 0) + 1

    def figures(self) -> CudaOnCpuFigures:
        """The report's account of the mapping: the device it answered as, and the mapped calls by kind."""
        ranked = sorted(self.calls.items(), key=lambda item: (-item[1], item[0]))
        return CudaOnCpuFigures(DEVICE_NAME, CAPABILITY, self.devices, tuple(ranked))

    # -- tensors (the mode) -------------------------------------------------------------------------------------

    def to(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """`Tensor.to`: a CUDA target is the CPU, and the move a copy."""
        if len(args) > 1 and _names_cuda(args[1]):
            args = (args[0], "cpu", *args[2:])
        elif _names_cuda(kwargs.get("device")):
            kwargs = {**kwargs, "device": "cpu"}
        else:
            return func(*args, **kwargs)
        self.count(MOVED)
        args, kwargs = _with_copy(args, kwargs)
        return func(*args, **kwargs)

    def cuda(self, args: tuple, kwargs: dict[str, Any]) -> torch.Tensor:
        """`Tensor.cuda`: a copy on the CPU."""
        self.count(MOVED)
        return torch.Tensor.to(args[0], "cpu", non_blocking=to_non_blocking(args, kwargs), copy=True,
                               memory_format=kwargs.get("memory_format", torch.preserve_format))

    def pin(self, tensor: torch.Tensor) -> torch.Tensor:
        """`Tensor.pin_memory`: a copy, marked pinned host memory (already pinned: the tensor itself)."""
        self.count(PINNED)
        if self.provenance.pinned(tensor):
            return tensor
        out = torch.Tensor.clone(tensor)
        self.provenance.add(out, self.provenance.made_by(tensor))
        self.provenance.pin(out)
        return out

    def factory(self, func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
        """A call given ``device=`` or ``pin_memory=True``: made on the CPU; pinned memory marked, not pinned."""
        cuda, pin = _names_cuda(kwargs.get("device")), bool(kwargs.get("pin_memory"))
        if not (cuda or pin):
            return func(*args, **kwargs)
        changed = dict(kwargs)
        if cuda:
            self.count(MADE)
            changed["device"] = "cpu"
        if pin:
            self.count(PINNED)
            changed["pin_memory"] = False
        out = func(*args, **changed)
        if pin and isinstance(out, torch.Tensor):
            self.provenance.add(out)
            self.provenance.pin(out)
        return out

    # -- torch.cuda and torch.accelerator -----------------------------------------------------------------------

    def _select(self, device: object) -> None:
        index = device if isinstance(device, int) else torch.device(device).index  # type: ignore[call-overload]
        if index is None or index < 0:  # "cuda", or torch.cuda.device(-1): no change
            return
        if index >= self.devices:
            raise RuntimeError("CUDA error: invalid device ordinal")  # CUDA's, past the local ranks' devices
        self.index = index

    def set_device(self, device: object) -> None:
        """`torch.cuda.set_device` and `torch.accelerator.set_device_index`: the current device."""
        self.count(SET_DEVICE)
        self._select(device)

    @contextlib.contextmanager
    def device(self, device: object) -> Iterator[None]:
        """`torch.cuda.device(d)` and `torch.accelerator.device_index(d)`: the current device for the block."""
        saved = self.index
        self.count(SET_DEVICE)
        if device is not None:
            self._select(device)
        try:
            yield
        finally:
            self.index = saved

    @contextlib.contextmanager
    def stream(self, stream: MappedStream | None) -> Iterator[None]:
        """`torch.cuda.stream(s)`: ``s`` is the current stream for the block."""
        saved = self._stream
        self.count(STREAMS)
        self._stream = stream if stream is not None else saved
        try:
            yield
        finally:
            self._stream = saved

    def set_stream(self, stream: MappedStream) -> None:
        self._stream = stream

    def _query(self, owner: object, name: str, answer: Callable[..., Any]) -> tuple[object, str, object]:
        """A question about the device: the mapped answer to the script, the real one to torch's own code."""
        original = getattr(owner, name, None)

        def query(*args: Any, **kwargs: Any) -> Any:
            if not _from_script():
                return original(*args, **kwargs)  # type: ignore[misc]
            self.count(QUERIES)
            return answer(*args, **kwargs)

        return owner, name, query

    def _idle(self, owner: object, name: str, kind: str = QUERIES) -> tuple[object, str, object]:
        """A call with nothing to do on the CPU (the allocator's resets, NVTX ranges), counted where the script
        makes it."""
        def idle(*_args: Any, **_kwargs: Any) -> None:
            if _from_script():
                self.count(kind)

        return owner, name, idle

    def _counted(self, kind: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.count(kind)
            return fn(*args, **kwargs)

        return counted

    def _device_calls(self) -> list[tuple[object, str, object]]:
        cuda, accelerator, nvtx = torch.cuda, torch.accelerator, torch.cuda.nvtx
        both = (cuda, accelerator)

        def host_memory(*_args: object) -> tuple[int, int]:
            memory = psutil.virtual_memory()
            return memory.available, memory.total

        found = [
            *(self._query(owner, "is_available", _answer(True)) for owner in both),
            *(self._query(owner, "device_count", lambda *_args: self.devices) for owner in both),
            *(self._query(owner, name, lambda *_args: self.index) for owner, name in (
                (cuda, "current_device"), (accelerator, "current_device_index"), (accelerator, "current_device_idx"))),
            self._query(accelerator, "current_accelerator", _answer(torch.device("cuda"))),
            self._query(cuda, "get_device_name", _answer(DEVICE_NAME)),
            self._query(cuda, "get_device_capability", _answer(CAPABILITY)),
            self._query(cuda, "get_device_properties",
                        lambda *_args: MappedDeviceProperties(psutil.virtual_memory().total)),
            self._query(cuda, "is_bf16_supported", _answer(True)),
            *(self._query(owner, name, _answer(0)) for owner in both
              for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved")),
            *(self._query(owner, "memory_stats", lambda *_args: {}) for owner in both),
            self._query(cuda, "memory_summary", _answer("")),
            *(self._query(owner, name, host_memory)
              for owner, name in ((cuda, "mem_get_info"), (accelerator, "get_memory_info"))),
            *(self._query(owner, "current_stream", lambda *_args: self._stream) for owner in both),
            self._query(cuda, "default_stream", lambda *_args: self._default),
            *(self._idle(cuda, name) for name in ("init", "reset_max_memory_allocated",
                                                  "set_per_process_memory_fraction")),
            *(self._idle(owner, name) for owner in both
              for name in ("reset_peak_memory_stats", "reset_accumulated_memory_stats", "empty_cache")),
            *(self._idle(nvtx, name, NVTX) for name in ("range_push", "range_pop", "range_start", "range_end",
                                                         "mark")),
            *((owner, name, self.set_device) for owner, name in (
                (cuda, "set_device"), (accelerator, "set_device_index"), (accelerator, "set_device_idx"))),
            (cuda, "device", self.device),
            (accelerator, "device_index", self.device),
            *((owner, "synchronize", self._counted(SYNCHRONIZE, _nothing)) for owner in both),
            (cuda, "Stream", self._counted(STREAMS, MappedStream)),
            (cuda, "Event", self._counted(STREAMS, MappedEvent)),
            (cuda, "stream", self.stream),
            *((owner, "set_stream", self._counted(STREAMS, self.set_stream)) for owner in both),
            # The CUDA generator is the CPU's: random ops on mapped tensors draw from it.
            (cuda, "get_rng_state", self._counted(RNG, lambda *_args: torch.get_rng_state())),
            (cuda, "get_rng_state_all", self._counted(RNG, lambda: [torch.get_rng_state()])),
            (cuda, "set_rng_state", self._counted(RNG, lambda state, *_args: torch.set_rng_state(state))),
            (cuda, "set_rng_state_all", self._counted(RNG, lambda states: torch.set_rng_state(states[0]))),
            (cuda, "initial_seed", self._counted(RNG, torch.initial_seed)),
        ]
        return [(owner, name, value) for owner, name, value in found if hasattr(owner, name)]  # torch 2.11 has fewer

    # -- distributed, parallel, AMP, loading ----------------------------------------------------------------------

    @staticmethod
    def _rebound(original: Callable[..., Any], change: Callable[[dict[str, Any]], object]) -> Callable[..., Any]:
        """``original`` with its arguments, defaults included, changed by ``change`` first (in place)."""
        signature = inspect.signature(original)

        def rebound(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            change(bound.arguments)
            return original(*bound.args, **bound.kwargs)

        return rebound

    def _gloo(self, arguments: dict[str, Any]) -> None:
        """A process group on gloo where the script named NCCL: NCCL's options and the bound device go."""
        if "nccl" in str(arguments.get("backend")).lower():
            self.count(NCCL)
            arguments["backend"] = "gloo"
            arguments["pg_options"] = None
        arguments.pop("device_id", None)

    def _init_process_group(self, arguments: dict[str, Any]) -> None:
        """`init_process_group`: no backend is the default, NCCL for CUDA tensors on a GPU; the group made here is
        destroyed on exit."""
        if arguments.get("backend") is None:
            arguments["backend"] = "nccl"
        self._gloo(arguments)
        self._group = True

    def _no_device_ids(self, kind: str) -> Callable[[dict[str, Any]], None]:
        def change(arguments: dict[str, Any]) -> None:
            if arguments.get("device_ids") is not None or arguments.get("output_device") is not None:
                self.count(kind)
            arguments["device_ids"] = arguments["output_device"] = None

        return change

    def _on_cpu(self, kind: str, argument: str) -> Callable[[dict[str, Any]], None]:
        """Name the CPU where the script named CUDA (``device_type``, ``device``), counting ``kind``."""
        def change(arguments: dict[str, Any]) -> None:
            if arguments.get(argument) == "cuda":
                self.count(kind)
                arguments[argument] = "cpu"
                if kind == AUTOCAST and arguments.get("dtype") is None:
                    arguments["dtype"] = torch.get_autocast_dtype("cuda")  # CUDA's float16, not the CPU's bfloat16

        return change

    def _map_location(self, arguments: dict[str, Any]) -> None:
        """CUDA storages load onto the CPU (a checkpoint saved on a GPU names its device in each storage)."""
        where = arguments.get("map_location")
        if isinstance(where, dict):
            arguments["map_location"] = {key: "cpu" if _names_cuda(value) else value for key, value in where.items()}
        elif where is None or _names_cuda(where):
            arguments["map_location"] = "cpu"
        if where is not None and arguments["map_location"] != where:
            self.count(LOAD)

    def _default_device(self, arguments: dict[str, Any]) -> None:
        """`torch.set_default_device("cuda")` and ``with torch.device("cuda"):`` set the CPU."""
        if _names_cuda(arguments.get("device")):
            self.count(DEFAULT_DEVICE)
            arguments["device"] = "cpu"

    @staticmethod
    def _module_to(original: Callable[..., Any]) -> Callable[..., Any]:
        """`Module.to(rank)`: an index names CUDA (torch parses a bare index as the accelerator's, which a CPU
        build lacks); each tensor's move is then the mode's."""
        def to(module: Any, *args: Any, **kwargs: Any) -> Any:
            if args and _names_cuda(args[0]) and isinstance(args[0], int):
                args = (torch.device("cuda", args[0]), *args[1:])
            if _names_cuda(kwargs.get("device")) and isinstance(kwargs["device"], int):
                kwargs = {**kwargs, "device": torch.device("cuda", kwargs["device"])}
            return original(module, *args, **kwargs)

        return to

    def _others(self) -> list[tuple[object, str, object]]:
        from torch.amp import autocast_mode, grad_scaler
        from torch.utils._device import DeviceContext

        data_parallel = importlib.import_module("torch.nn.parallel.data_parallel")  # the package's name: a function
        found: list[tuple[object, str, object]] = []
        if dist.is_available():
            c10d = dist.distributed_c10d
            ddp = importlib.import_module("torch.nn.parallel.distributed").DistributedDataParallel
            found += [
                *((owner, "init_process_group", self._rebound(c10d.init_process_group, self._init_process_group))
                  for owner in (dist, c10d)),
                *((owner, "new_group", self._rebound(c10d.new_group, self._gloo)) for owner in (dist, c10d)),
                *((owner, "barrier", self._rebound(c10d.barrier, lambda arguments: arguments.pop("device_ids")))
                  for owner in (dist, c10d)),
                (ddp, "__init__", self._rebound(ddp.__init__, self._no_device_ids(DDP))),
            ]
        parallel = data_parallel.DataParallel  # with torch's real answer, no CUDA, it runs its module itself
        return [
            *found,
            (parallel, "__init__", self._rebound(parallel.__init__, self._no_device_ids(DATA_PARALLEL))),
            (autocast_mode.autocast, "__init__",
             self._rebound(autocast_mode.autocast.__init__, self._on_cpu(AUTOCAST, "device_type"))),
            (grad_scaler.GradScaler, "__init__",
             self._rebound(grad_scaler.GradScaler.__init__, self._on_cpu(SCALER, "device"))),
            *((owner, "load", self._rebound(torch.serialization.load, self._map_location))
              for owner in (torch, torch.serialization)),
            (DeviceContext, "__init__", self._rebound(DeviceContext.__init__, self._default_device)),
            (torch.nn.Module, "to", self._module_to(torch.nn.Module.to)),
        ]

    # -- the block ----------------------------------------------------------------------------------------------

    def __enter__(self) -> CudaOnCpu:
        with contextlib.ExitStack() as stack:
            stack.callback(self._restore)
            for owner, name, value in [*self._device_calls(), *self._others()]:
                self._saved.append((owner, name, name in vars(owner), getattr(owner, name)))
                setattr(owner, name, value)
            stack.enter_context(warnings.catch_warnings())
            # torch's DataLoader gets the real answer, no accelerator: it pins nothing, and says so for every
            # iterator; the loader watch marks its batches pinned, as a GPU would pin them.
            warnings.filterwarnings("ignore", message="'pin_memory' argument is set as true but no accelerator")
            self._mode.__enter__()
            stack.callback(self._leave_mode)
            stack.callback(self._destroy_group)
            self._stack = stack.pop_all()
        return self

    def __exit__(self, *exc_info: object) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()

    def _destroy_group(self) -> None:
        if self._group and dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()  # the script ran in this process; its group must not outlive it

    @staticmethod
    def _leave_mode() -> None:
        """Pop the mapping's mode wherever it is on the stack, the modes above it put back."""
        index = _mode_index()
        if index is None:
            return
        above = [_pop_mode() for _ in range(torch._C._len_torch_function_stack() - index - 1)]
        _pop_mode()
        for mode in reversed(above):
            _push_mode(mode)

    def _restore(self) -> None:
        for owner, name, own, value in reversed(self._saved):
            if own:
                setattr(owner, name, value)
            else:
                delattr(owner, name)
        self._saved = []


def _unmapped(error: BaseException, last: str) -> str:
    """One line: the CUDA call the mapping does not cover, at the script's innermost line that reached it."""
    where: tuple[str, int, str] | None = None
    called = ""
    tb = error.__traceback__
    while tb is not None:
        code, module = tb.tb_frame.f_code, str(tb.tb_frame.f_globals.get("__name__", ""))
        if is_user_file(code.co_filename):
            where, called = (code.co_filename, tb.tb_lineno, code.co_name), ""
        elif where is not None and not called and module.split(".")[0] == "torch":
            called = f"{module}.{getattr(code, 'co_qualname', code.co_name)}"
        tb = tb.tb_next
    line = source_line(where)
    if line is None:
        return f"a CUDA call that --cuda-on-cpu does not map onto the CPU ({last})"
    call = called or (f"`{line.code}`" if line.code else "a CUDA call")
    return f"{call} at {Path(line.path).name}:{line.lineno} is not mapped onto the CPU by --cuda-on-cpu ({last})"


def explain_failure(failure: Failure, error: BaseException) -> Failure:
    """The script's failure as the report gives it, where the error is a CUDA call's on a machine without a GPU.

    Under the mapping it is a call the mapping does not cover: one line naming the call and the script's line, and
    no traceback. Without it, the error gets `HINT`, to run the script again with ``--cuda-on-cpu``.

    Args:
        failure: the failure as the run recorded it.
        error: the exception the script raised.

    Returns:
        The failure to report (``failure`` itself for any other error).
    """
    if not any(sign in str(error) for sign in NEEDS_CUDA):
        return failure
    if _mode_index() is None:
        return dataclasses.replace(failure, hint=HINT)
    return dataclasses.replace(failure, last_line=_unmapped(error, failure.last_line), traceback="")
