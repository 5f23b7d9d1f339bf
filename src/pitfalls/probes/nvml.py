"""Sample a GPU's utilization, memory, power and SM clock through NVML while code runs.

NVML's "utilization" is the share of a driver sampling period (1/6 s to 1 s) in which any kernel ran; it is not
SM occupancy, and a GPU running one tiny kernel at a time can read 100 %. The sampler reads it every
`interval_s` anyway (cheap), and also reads the driver's own utilization sample buffer
(`nvmlDeviceGetSamples`, NVML_GPU_UTILIZATION_SAMPLES) for the measured window, which has the driver's time
resolution rather than ours.

The sampling thread only calls NVML and appends to lists, and sleeps on an Event between samples, so it costs
the measured code one Python thread wake-up per interval and nothing else. It makes every NVML call, from
nvmlInit to nvmlShutdown, so an NVML call that never returns (a wedged driver) holds that thread only: the
sampler waits for it with a timeout, reports the figures as unavailable, and the measured code goes on.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any, TypeVar

import torch

from pitfalls.devices import synchronize
from pitfalls.result import Unavailable
from pitfalls.units import MIB

__all__ = [
    "MetricSummary",
    "NvmlSampler",
    "NvmlSummary",
    "NvmlTarget",
    "nvml_error_reason",
    "nvml_query",
    "nvml_target",
    "nvml_unavailable_reason",
    "nvml_windows",
]

# Seconds the sampler waits for NVML when a block starts and ends; nvmlInit alone can take seconds on a machine
# whose GPUs are not kept initialised (no persistence mode), so this is generous.
DEFAULT_TIMEOUT_S = 10.0
# Each metric the sampler reads: its unit, and how it is read from a device handle.
_METRICS: dict[str, tuple[str, Callable[[Any, Any], float]]] = {
    "utilization_pct": ("%", lambda nvml, h: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu)),
    "memory_used_mib": ("MiB", lambda nvml, h: nvml.nvmlDeviceGetMemoryInfo(h).used / MIB),
    "power_w": ("W", lambda nvml, h: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0),
    "sm_clock_mhz": ("MHz", lambda nvml, h: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))),
}
T = TypeVar("T")
# NVML errors that mean the GPU or the driver is gone: one of them ends a window whichever metric raised it.
_FATAL_ERRORS = ("NVMLError_GpuIsLost", "NVMLError_DriverNotLoaded", "NVMLError_Uninitialized",
                 "NVMLError_LibraryNotFound", "NVMLError_ResetRequired")


@dataclass(frozen=True)
class NvmlTarget:
    """Which GPU NVML should read: by PCI bus id (exact) or by NVML index.

    Attributes:
        index: NVML's device index (NVML orders by PCI bus, CUDA by default fastest-first, so prefer the bus id).
        pci_bus_id: "DDDDDDDD:BB:DD.F" as NVML writes it.
    """

    index: int | None = None
    pci_bus_id: str | None = None

    def __post_init__(self) -> None:
        if (self.index is None) == (self.pci_bus_id is None):
            raise ValueError(f"give exactly one of index and pci_bus_id, got {self.index!r}, {self.pci_bus_id!r}")
        if self.index is not None and (isinstance(self.index, bool) or not isinstance(self.index, int)
                                       or self.index < 0):
            raise ValueError(f"index must be an int >= 0, got {self.index!r}")

    def __str__(self) -> str:
        return f"NVML index {self.index}" if self.pci_bus_id is None else f"PCI {self.pci_bus_id}"


def _visible_devices(environ: Mapping[str, str]) -> list[int] | None:
    raw = environ.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    parts = [p.strip() for p in raw.split(",") if p.strip()]
    if not parts or not all(p.isdigit() for p in parts):
        # UUIDs or MIG names: not a plain index list, so it cannot be mapped to an NVML index here.
        return None
    return [int(p) for p in parts]


def nvml_target(
    device: torch.device | str | int,
    *,
    environ: Mapping[str, str] | None = None,
    get_properties: Callable[[int], Any] | None = None,
) -> NvmlTarget:
    """Map a torch CUDA device to the GPU NVML should read.

    In order of preference: the device's PCI bus id from `torch.cuda.get_device_properties` (exact whatever
    CUDA_VISIBLE_DEVICES and CUDA_DEVICE_ORDER say); else CUDA_VISIBLE_DEVICES when it is a plain list of
    integers; else the CUDA index itself (right only when CUDA and NVML enumerate alike).

    Args:
        device: a CUDA torch.device or string ("cuda", "cuda:1"), or an int taken as an NVML index as is.
        environ: the environment to read CUDA_VISIBLE_DEVICES from; None means os.environ.
        get_properties: `index -> properties` with pci_domain_id/pci_bus_id/pci_device_id; None means
            torch.cuda.get_device_properties when CUDA is usable, else no properties.

    Returns:
        An `NvmlTarget`.
    """
    if isinstance(device, int) and not isinstance(device, bool):
        return NvmlTarget(index=device)
    if not isinstance(device, (torch.device, str)):
        raise TypeError(f"device must be a torch.device, a str or an int, got {type(device).__name__}: {device!r}")
    dev = torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"device must be a CUDA device for NVML, got {str(dev)!r}")
    index = dev.index if dev.index is not None else 0
    if get_properties is None and torch.backends.cuda.is_built() and torch.cuda.is_available():
        get_properties = torch.cuda.get_device_properties
    if get_properties is not None:
        props = get_properties(index)
        ids = [getattr(props, name, None) for name in ("pci_domain_id", "pci_bus_id", "pci_device_id")]
        if all(isinstance(i, int) for i in ids):
            domain, bus, dev_id = ids
            return NvmlTarget(pci_bus_id=f"{domain:08X}:{bus:02X}:{dev_id:02X}.0")
    visible = _visible_devices(os.environ if environ is None else environ)
    if visible is not None:
        if index >= len(visible):
            raise ValueError(f"device index {index} is not in CUDA_VISIBLE_DEVICES={visible}")
        return NvmlTarget(index=visible[index])
    return NvmlTarget(index=index)


@dataclass(frozen=True)
class MetricSummary:
    """Mean and maximum of one sampled metric.

    Attributes:
        mean: mean of the samples.
        max: largest sample.
        samples: how many samples.
        unit: "%", "MiB", "W" or "MHz".
    """

    mean: float
    max: float
    samples: int
    unit: str


@dataclass(frozen=True)
class NvmlSummary:
    """What the sampler saw over one `with` block.

    Attributes:
        target: the GPU read, as text.
        duration_s: seconds between entering and leaving the block.
        interval_s: the requested sampling interval.
        utilization_pct: kernel-active percent from nvmlDeviceGetUtilizationRates, sampled by us.
        memory_used_mib: device memory in use (all processes), MiB.
        power_w: board power draw, W.
        sm_clock_mhz: SM clock, MHz.
        nvml_utilization_pct: the driver's own utilization samples inside the window.
        failure: why sampling stopped early (samples taken before it are kept), or None.
    """

    target: str
    duration_s: float
    interval_s: float
    utilization_pct: MetricSummary | Unavailable
    memory_used_mib: MetricSummary | Unavailable
    power_w: MetricSummary | Unavailable
    sm_clock_mhz: MetricSummary | Unavailable
    nvml_utilization_pct: MetricSummary | Unavailable
    failure: str | None = None


def _is_a(nvml: Any, err: BaseException, cls_name: str) -> bool:
    """Whether ``err`` is the binding's error class ``cls_name`` (False where the binding has no such class)."""
    cls = getattr(nvml, cls_name, None)
    return isinstance(cls, type) and isinstance(err, cls)


def nvml_error_reason(nvml: Any, err: BaseException) -> str:
    """Give a short reason for an NVML error, by its class where the class says it all.

    Args:
        nvml: the NVML binding module whose error classes to match (pynvml or a fake).
        err: the error raised.

    Returns:
        E.g. "NVML library not found", "GPU is lost", or "NVML error: <message>" for the rest.
    """
    known = (
        ("NVMLError_LibraryNotFound", "NVML library not found"),
        ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded"),
        ("NVMLError_GpuIsLost", "GPU is lost"),
        ("NVMLError_NotFound", "GPU not found"),
        ("NVMLError_NotSupported", "not supported on this GPU"),
        ("NVMLError_NoPermission", "no permission"),
    )
    for cls_name, text in known:
        if _is_a(nvml, err, cls_name):
            return text
    return f"NVML error: {err}"


def _is_fatal(nvml: Any, err: BaseException) -> bool:
    """Whether ``err`` says the GPU or the driver is gone, so no metric can be read any more in this window."""
    return any(_is_a(nvml, err, cls_name) for cls_name in _FATAL_ERRORS)


def _summary(values: list[float], unit: str) -> MetricSummary:
    return MetricSummary(mean=statistics.fmean(values), max=max(values), samples=len(values), unit=unit)


def _sample_value(nvml: Any, value_type: int, value: Any) -> float:
    fields = {
        "NVML_VALUE_TYPE_DOUBLE": "dVal",
        "NVML_VALUE_TYPE_UNSIGNED_INT": "uiVal",
        "NVML_VALUE_TYPE_UNSIGNED_LONG": "ulVal",
        "NVML_VALUE_TYPE_UNSIGNED_LONG_LONG": "ullVal",
        "NVML_VALUE_TYPE_SIGNED_LONG_LONG": "sllVal",
        "NVML_VALUE_TYPE_SIGNED_INT": "siVal",
        "NVML_VALUE_TYPE_UNSIGNED_SHORT": "usVal",
    }
    for const, attr in fields.items():
        if getattr(nvml, const, None) == value_type:
            return float(getattr(value, attr))
    raise ValueError(f"unknown NVML sample value type {value_type!r}")


def _import_nvml() -> ModuleType | Unavailable:
    try:
        import pynvml
    except ImportError:
        return Unavailable("nvidia-ml-py (pynvml) not installed")
    return pynvml


def nvml_query(read: Callable[[Any], T], nvml: ModuleType | Any | None = None) -> T | Unavailable:
    """Initialise NVML, read one thing and shut NVML down again.

    Args:
        read: ``read(nvml) -> value``, between nvmlInit and nvmlShutdown.
        nvml: the NVML binding module; None imports pynvml. Tests pass a fake.

    Returns:
        The value read, or `Unavailable` with the reason, e.g. "NVML library not found".
    """
    nvml = nvml if nvml is not None else _import_nvml()
    if isinstance(nvml, Unavailable):
        return nvml
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        return Unavailable(nvml_error_reason(nvml, err))
    try:
        return read(nvml)
    except nvml.NVMLError as err:
        return Unavailable(nvml_error_reason(nvml, err))
    finally:
        nvml.nvmlShutdown()


def nvml_unavailable_reason(nvml: ModuleType | Any | None = None) -> str | None:
    """Say why NVML cannot be used on this machine, or None when it can (it is initialised and shut down once).

    Args:
        nvml: the NVML binding module; None imports pynvml. Tests pass a fake.

    Returns:
        E.g. "NVML library not found", or None.
    """
    done = nvml_query(lambda _: None, nvml)
    return done.reason if isinstance(done, Unavailable) else None


class _Window:
    """One `with` block's NVML session, owned by its sampling thread from nvmlInit to nvmlShutdown (on every path,
    when its last call returns)."""

    def __init__(self, nvml: Any, target: NvmlTarget, interval_s: float, start_us: int) -> None:
        self.nvml = nvml
        self.target = target
        self.interval_s = interval_s
        self.start_us = start_us
        self.end_us = start_us
        self.opened = threading.Event()
        self.stop = threading.Event()
        self.abandoned = False  # set when the sampler stopped waiting for this window's thread
        self.unavailable: Unavailable | None = None
        self.values: dict[str, list[float]] = {m: [] for m in _METRICS}
        self.disabled: dict[str, str] = {}
        self.failure: str | None = None
        self.driver: MetricSummary | Unavailable = Unavailable("no samples taken")
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, name="pitfalls-nvml-sampler", daemon=True)

    def run(self) -> None:
        nvml = self.nvml
        initialised = False
        try:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as err:
                self.unavailable = Unavailable(nvml_error_reason(nvml, err))
                return
            initialised = True
            try:
                if self.target.pci_bus_id is not None:
                    handle = nvml.nvmlDeviceGetHandleByPciBusId(self.target.pci_bus_id)
                else:
                    handle = nvml.nvmlDeviceGetHandleByIndex(self.target.index)
            except nvml.NVMLError as err:
                self.unavailable = Unavailable(f"{nvml_error_reason(nvml, err)} ({self.target})")
                return
            self.opened.set()
            if self.abandoned:
                return
            while not self.stop.is_set():
                self._sample_once(handle)
                if self.failure is not None:
                    # The driver buffer is not read from a device that just failed; NVML is shut down at once.
                    self.driver = Unavailable(self.failure)
                    return
                self.stop.wait(self.interval_s)
            if not self.abandoned:
                self.driver = self._driver_samples(handle)  # end_us was set before stop
        except BaseException as err:  # handed to the caller in __exit__, never swallowed
            self.error = err
        finally:
            self.opened.set()
            if initialised:
                # A lost GPU can make shutdown fail too; that failure is already in the summary.
                with contextlib.suppress(nvml.NVMLError):
                    nvml.nvmlShutdown()

    def _sample_once(self, handle: Any) -> None:
        nvml = self.nvml
        for metric, (_, read) in _METRICS.items():
            if metric in self.disabled:
                continue
            try:
                self.values[metric].append(read(nvml, handle))
            except nvml.NVMLError as err:
                reason = nvml_error_reason(nvml, err)
                if not _is_fatal(nvml, err) and (_is_a(nvml, err, "NVMLError_NotSupported")
                                                 or not self.values[metric]):
                    # A metric this GPU or this sandbox never lets us read (power under a VM: NoPermission or
                    # Unknown) says nothing of the device: the others go on sampling the whole window.
                    self.disabled[metric] = reason
                    continue
                # The GPU or driver is gone, or a metric that was read fails now: the device changed under us.
                n = max((len(v) for v in self.values.values()), default=0)
                self.failure = f"{reason} (mid-run, after {n} sample{'' if n == 1 else 's'})"
                return

    def _driver_samples(self, handle: Any) -> MetricSummary | Unavailable:
        nvml = self.nvml
        kind = getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", None)
        if kind is None or not hasattr(nvml, "nvmlDeviceGetSamples"):
            return Unavailable("nvmlDeviceGetSamples not in this NVML binding")
        try:
            value_type, samples = nvml.nvmlDeviceGetSamples(handle, kind, self.start_us)
        except nvml.NVMLError as err:
            if _is_a(nvml, err, "NVMLError_NotFound"):
                # NVML's answer when its buffer holds nothing newer than the timestamp.
                return Unavailable("no driver utilization samples in the window")
            return Unavailable(nvml_error_reason(nvml, err))
        values = [
            _sample_value(nvml, value_type, s.sampleValue)
            for s in samples
            if self.start_us <= s.timeStamp <= self.end_us
        ]
        if not values:
            return Unavailable("no driver utilization samples in the window")
        return _summary(values, "%")

    def metric(self, metric: str) -> MetricSummary | Unavailable:
        values = self.values[metric]
        if values:
            return _summary(values, _METRICS[metric][0])
        return Unavailable(self.disabled.get(metric) or self.failure or "no samples taken")


class NvmlSampler:
    """Context manager sampling one GPU through NVML in a background thread.

    Args:
        device: an `NvmlTarget`, an NVML index, or a CUDA torch.device/str (mapped with `nvml_target`).
        interval_s: seconds between samples (> 0; default 20 ms).
        nvml: the NVML binding module; None imports pynvml (nvidia-ml-py). Tests pass a fake.
        clock: monotonic seconds, for the window's duration.
        wall_clock: seconds since the epoch, to select the driver's utilization samples (µs timestamps).
        timeout_s: how long entering and leaving the block wait for NVML (> 0); an NVML call still running
            after it makes `summary` `Unavailable("NVML call did not return within N s")`.

    The block's code runs whatever NVML does; if NVML is missing, `summary` is an `Unavailable` with the reason.
    """

    def __init__(
        self,
        device: NvmlTarget | torch.device | str | int = 0,
        *,
        interval_s: float = 0.02,
        nvml: ModuleType | Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise ValueError(f"interval_s must be a number of seconds > 0, got {interval_s!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < math.inf:
            raise ValueError(f"timeout_s must be a number of seconds > 0, got {timeout_s!r}")
        self._target = device if isinstance(device, NvmlTarget) else nvml_target(device)
        self._interval = float(interval_s)
        self._timeout = float(timeout_s)
        self._nvml = nvml
        self._clock = clock
        self._wall_clock = wall_clock
        self._summary: NvmlSummary | Unavailable | None = None
        self._window: _Window | None = None
        self._unavailable: Unavailable | None = None

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> NvmlSampler:
        if self._window is not None:
            raise RuntimeError("this NvmlSampler is already running; use one `with` block at a time")
        self._summary = None
        self._unavailable = None
        self._start = self._clock()
        start_us = int(self._wall_clock() * 1e6)
        nvml = self._nvml if self._nvml is not None else _import_nvml()
        if isinstance(nvml, Unavailable):
            self._unavailable = nvml
            return self
        self._nvml = nvml
        # A window of its own per block: a thread given up on keeps its own state and stop event.
        window = _Window(nvml, self._target, self._interval, start_us)
        window.thread.start()
        if not window.opened.wait(self._timeout):
            window.abandoned = True
            window.stop.set()
            self._unavailable = self._stuck()
            return self
        if window.unavailable is not None or window.error is not None:
            window.thread.join(self._timeout)
            if window.error is not None:
                raise RuntimeError("the NVML sampling thread failed") from window.error
            self._unavailable = window.unavailable
            return self
        self._window = window
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        window, self._window = self._window, None
        end = self._clock()
        if window is None:
            if self._unavailable is None:
                raise RuntimeError("this NvmlSampler was not entered; use it in a `with` block")
            self._summary = self._unavailable
            return
        window.end_us = int(self._wall_clock() * 1e6)
        window.stop.set()
        window.thread.join(self._timeout)
        if window.thread.is_alive():
            # The thread shuts NVML down itself if the call ever returns; its results are not waited for.
            window.abandoned = True
            self._summary = self._stuck()
            return
        if window.error is not None:
            if exc is None:
                raise RuntimeError("the NVML sampling thread failed") from window.error
            # The block's own exception propagates; keep the sampler's failure visible on it (3.11+).
            if hasattr(exc, "add_note"):
                exc.add_note(f"NVML sampling thread also failed: {window.error!r}")
        self._summary = NvmlSummary(
            target=str(self._target),
            duration_s=end - self._start,
            interval_s=self._interval,
            utilization_pct=window.metric("utilization_pct"),
            memory_used_mib=window.metric("memory_used_mib"),
            power_w=window.metric("power_w"),
            sm_clock_mhz=window.metric("sm_clock_mhz"),
            nvml_utilization_pct=window.driver,
            failure=window.failure,
        )

    def _stuck(self) -> Unavailable:
        return Unavailable(f"NVML call did not return within {self._timeout:g} s")

    @property
    def summary(self) -> NvmlSummary | Unavailable:
        """The summary of the last completed `with` block, or `Unavailable` with the reason NVML was unusable."""
        if self._summary is None:
            raise RuntimeError("no summary yet: use the sampler in a `with` block and read summary after it")
        return self._summary


def nvml_windows(call: Callable[[], Any], devices: Sequence[torch.device], seconds: float, *, nvml: Any = None,
                 sync: Callable[[], None] | None = None) -> list[NvmlSummary | Unavailable]:
    """Loop ``call`` for ``seconds`` while NVML samples each of ``devices``' GPUs: one summary each.

    The calls are queued without a synchronize between them, as a training loop queues its steps; the devices are
    synchronized once at the end, inside the window, so the last calls' work is sampled too.

    Args:
        call: one call of the case (a step, a batch).
        devices: the CUDA devices it runs on (a case whose replicas or ranks use several: all of them).
        seconds: the window's length.
        nvml: the NVML binding; None imports pynvml.
        sync: waits for the queued work (default: a synchronize of each device).

    Returns:
        NVML's summary of each device's window, or why NVML could not read it.
    """
    with contextlib.ExitStack() as stack:
        samplers = [stack.enter_context(NvmlSampler(device, nvml=nvml)) for device in devices]
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline:
            call()
        if sync is not None:
            sync()
        else:
            for device in devices:
                synchronize(device)
    return [sampler.summary for sampler in samplers]
