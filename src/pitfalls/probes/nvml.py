"""Sample a GPU's utilization, memory, power and SM clock through NVML while code runs.

NVML's "utilization" is the share of a driver sampling period (1/6 s to 1 s) in which any kernel ran; it is not
SM occupancy, and a GPU running one tiny kernel at a time can read 100 %. The sampler reads it every
`interval_s` anyway (cheap), and also reads the driver's own utilization sample buffer
(`nvmlDeviceGetSamples`, NVML_GPU_UTILIZATION_SAMPLES) for the measured window, which has the driver's time
resolution rather than ours.

The sampling thread only calls NVML and appends to lists, and sleeps on an Event between samples, so it costs
the measured code one Python thread wake-up per interval and nothing else.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType, TracebackType
from typing import Any

import torch

from pitfalls.probes.result import Unavailable

__all__ = [
    "MetricSummary",
    "NvmlSampler",
    "NvmlSummary",
    "NvmlTarget",
    "nvml_error_reason",
    "nvml_target",
    "nvml_unavailable_reason",
]

_MIB = 1024 * 1024
_METRICS = ("utilization_pct", "memory_used_mib", "power_w", "sm_clock_mhz")


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
        cls = getattr(nvml, cls_name, None)
        if isinstance(cls, type) and isinstance(err, cls):
            return text
    return f"NVML error: {err}"


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


def nvml_unavailable_reason(nvml: ModuleType | Any | None = None) -> str | None:
    """Say why NVML cannot be used on this machine, or None when it can (it is initialised and shut down once).

    Args:
        nvml: the NVML binding module; None imports pynvml. Tests pass a fake.

    Returns:
        E.g. "NVML library not found", or None.
    """
    nvml = nvml if nvml is not None else _import_nvml()
    if isinstance(nvml, Unavailable):
        return nvml.reason
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        return nvml_error_reason(nvml, err)
    nvml.nvmlShutdown()
    return None


class NvmlSampler:
    """Context manager sampling one GPU through NVML in a background thread.

    Args:
        device: an `NvmlTarget`, an NVML index, or a CUDA torch.device/str (mapped with `nvml_target`).
        interval_s: seconds between samples (> 0; default 20 ms).
        nvml: the NVML binding module; None imports pynvml (nvidia-ml-py). Tests pass a fake.
        clock: monotonic seconds, for the window's duration.
        wall_clock: seconds since the epoch, to select the driver's utilization samples (µs timestamps).

    The block's code runs whatever NVML does; if NVML is missing, `summary` is an `Unavailable` with the reason.
    The thread is always stopped and joined on exit, also when the block raises.
    """

    def __init__(
        self,
        device: NvmlTarget | torch.device | str | int = 0,
        *,
        interval_s: float = 0.02,
        nvml: ModuleType | Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        if isinstance(interval_s, bool) or not isinstance(interval_s, (int, float)) or not interval_s > 0:
            raise ValueError(f"interval_s must be a number of seconds > 0, got {interval_s!r}")
        self._target = device if isinstance(device, NvmlTarget) else nvml_target(device)
        self._interval = float(interval_s)
        self._nvml = nvml
        self._clock = clock
        self._wall_clock = wall_clock
        self._summary: NvmlSummary | Unavailable | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> NvmlSampler:
        if self._thread is not None:
            raise RuntimeError("this NvmlSampler is already running; use one `with` block at a time")
        self._summary = None
        self._unavailable: Unavailable | None = None
        self._values: dict[str, list[float]] = {m: [] for m in _METRICS}
        self._disabled: dict[str, str] = {}
        self._failure: str | None = None
        self._thread_error: BaseException | None = None
        self._handle = None
        self._initialised = False
        self._stop.clear()
        self._start = self._clock()
        self._start_us = int(self._wall_clock() * 1e6)
        self._open()
        if self._unavailable is None:
            self._thread = threading.Thread(target=self._run, name="pitfalls-nvml-sampler", daemon=True)
            self._thread.start()
        return self

    def _open(self) -> None:
        nvml = self._nvml if self._nvml is not None else _import_nvml()
        if isinstance(nvml, Unavailable):
            self._unavailable = nvml
            return
        self._nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as err:
            self._unavailable = Unavailable(nvml_error_reason(nvml, err))
            return
        self._initialised = True
        try:
            if self._target.pci_bus_id is not None:
                self._handle = nvml.nvmlDeviceGetHandleByPciBusId(self._target.pci_bus_id)
            else:
                self._handle = nvml.nvmlDeviceGetHandleByIndex(self._target.index)
        except nvml.NVMLError as err:
            self._unavailable = Unavailable(f"{nvml_error_reason(nvml, err)} ({self._target})")

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        end = self._clock()
        end_us = int(self._wall_clock() * 1e6)
        try:
            if self._unavailable is not None:
                self._summary = self._unavailable
            else:
                self._summary = self._build_summary(end - self._start, end_us)
        finally:
            self._close()
        if self._thread_error is not None:
            if exc is None:
                raise RuntimeError("the NVML sampling thread failed") from self._thread_error
            # The block's own exception propagates; keep the sampler's failure visible on it.
            if hasattr(exc, "add_note"):
                exc.add_note(f"NVML sampling thread also failed: {self._thread_error!r}")

    def _close(self) -> None:
        if self._initialised:
            self._initialised = False
            # A lost GPU can make shutdown fail too; that failure is already in the summary.
            with contextlib.suppress(self._nvml.NVMLError):
                self._nvml.nvmlShutdown()

    # -- sampling --------------------------------------------------------------------------------------------

    def _readers(self) -> dict[str, Callable[[], float]]:
        nvml, h = self._nvml, self._handle
        return {
            "utilization_pct": lambda: float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
            "memory_used_mib": lambda: nvml.nvmlDeviceGetMemoryInfo(h).used / _MIB,
            "power_w": lambda: nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            "sm_clock_mhz": lambda: float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
        }

    def _sample_once(self, readers: dict[str, Callable[[], float]]) -> None:
        nvml = self._nvml
        for metric, read in readers.items():
            if metric in self._disabled:
                continue
            try:
                self._values[metric].append(read())
            except nvml.NVMLError as err:
                not_supported = getattr(nvml, "NVMLError_NotSupported", None)
                if isinstance(not_supported, type) and isinstance(err, not_supported):
                    self._disabled[metric] = nvml_error_reason(nvml, err)
                    continue
                n = self._sample_count()
                reason = nvml_error_reason(nvml, err)
                self._failure = f"{reason} (mid-run, after {n} sample{'' if n == 1 else 's'})"
                return

    def _sample_count(self) -> int:
        return max((len(v) for v in self._values.values()), default=0)

    def _run(self) -> None:
        try:
            readers = self._readers()
            while not self._stop.is_set():
                self._sample_once(readers)
                if self._failure is not None:
                    return
                self._stop.wait(self._interval)
        except BaseException as err:  # handed to the main thread in __exit__, never swallowed
            self._thread_error = err

    # -- results ---------------------------------------------------------------------------------------------

    def _metric(self, metric: str, unit: str) -> MetricSummary | Unavailable:
        values = self._values[metric]
        if values:
            return _summary(values, unit)
        if metric in self._disabled:
            return Unavailable(self._disabled[metric])
        if self._failure is not None:
            return Unavailable(self._failure)
        return Unavailable("no samples taken")

    def _driver_samples(self, end_us: int) -> MetricSummary | Unavailable:
        nvml = self._nvml
        if self._failure is not None:
            return Unavailable(self._failure)
        kind = getattr(nvml, "NVML_GPU_UTILIZATION_SAMPLES", None)
        if kind is None or not hasattr(nvml, "nvmlDeviceGetSamples"):
            return Unavailable("nvmlDeviceGetSamples not in this NVML binding")
        try:
            value_type, samples = nvml.nvmlDeviceGetSamples(self._handle, kind, self._start_us)
        except nvml.NVMLError as err:
            not_found = getattr(nvml, "NVMLError_NotFound", None)
            if isinstance(not_found, type) and isinstance(err, not_found):
                # NVML's answer when its buffer holds nothing newer than the timestamp.
                return Unavailable("no driver utilization samples in the window")
            return Unavailable(nvml_error_reason(nvml, err))
        values = [
            _sample_value(nvml, value_type, s.sampleValue)
            for s in samples
            if self._start_us <= s.timeStamp <= end_us
        ]
        if not values:
            return Unavailable("no driver utilization samples in the window")
        return _summary(values, "%")

    def _build_summary(self, duration_s: float, end_us: int) -> NvmlSummary:
        return NvmlSummary(
            target=str(self._target),
            duration_s=duration_s,
            interval_s=self._interval,
            utilization_pct=self._metric("utilization_pct", "%"),
            memory_used_mib=self._metric("memory_used_mib", "MiB"),
            power_w=self._metric("power_w", "W"),
            sm_clock_mhz=self._metric("sm_clock_mhz", "MHz"),
            nvml_utilization_pct=self._driver_samples(end_us),
            failure=self._failure,
        )

    @property
    def summary(self) -> NvmlSummary | Unavailable:
        """The summary of the last completed `with` block, or `Unavailable` with the reason NVML was unusable."""
        if self._summary is None:
            raise RuntimeError("no summary yet: use the sampler in a `with` block and read summary after it")
        return self._summary
