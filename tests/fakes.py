"""Stand-ins for NVML, CUDA and the clock, so probe logic is tested on a machine without a GPU."""

from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass, field
from types import SimpleNamespace


class FakeClock:
    """A clock that advances only when told to, so timing tests can assert exact figures."""

    def __init__(self, start: float = 100.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


# -- NVML ------------------------------------------------------------------------------------------------------


class NVMLError(Exception):
    """Base class, as in pynvml."""

    def __init__(self, value: int = 999) -> None:
        super().__init__(value)
        self.value = value


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 (pynvml's names)
    def __str__(self) -> str:
        return "NVML Shared Library Not Found"


class NVMLError_GpuIsLost(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "GPU is lost"


class NVMLError_NotFound(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "Not Found"


class NVMLError_NotSupported(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "Not Supported"


class NVMLError_Unknown(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "Unknown Error"


@dataclass
class FakeSample:
    timeStamp: int  # noqa: N815 (pynvml's field name)
    sampleValue: SimpleNamespace  # noqa: N815


@dataclass
class FakeNVML:
    """An object shaped like the pynvml module for the calls the sampler makes.

    Attributes:
        init_error: raised by nvmlInit when set.
        handle_error: raised when a handle is looked up, when set.
        utilization: values returned in turn by the utilization reader (the last one repeats).
        memory_used: bytes reported used.
        power_mw: milliwatts reported.
        sm_clock: MHz reported.
        fail_on_call: (n, error) makes the n-th sampling call of any metric (1-based) and every later one raise.
        power_not_supported: the power reader raises NotSupported.
        driver_samples: (timestamp_us, value) pairs returned by nvmlDeviceGetSamples; None makes it raise
            NotFound as NVML does when nothing is newer than the timestamp.
        driver_version: what nvmlSystemGetDriverVersion returns.
        hang: (name, event) makes the NVML call of that name wait until the event is set, as a call into a wedged
            driver does; `stuck` is set once a call is waiting.
    """

    init_error: Exception | None = None
    handle_error: Exception | None = None
    utilization: list[float] = field(default_factory=lambda: [50.0])
    memory_used: int = 2 * 1024 * 1024 * 1024
    power_mw: int = 150_000
    sm_clock: int = 1980
    fail_on_call: tuple[int, Exception] | None = None
    power_not_supported: bool = False
    driver_samples: list[tuple[int, int]] | None = None
    driver_version: str = "550.54.15"
    hang: tuple[str, threading.Event] | None = None

    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound
    NVMLError_GpuIsLost = NVMLError_GpuIsLost
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_CLOCK_SM = 1
    NVML_GPU_UTILIZATION_SAMPLES = 1
    NVML_VALUE_TYPE_DOUBLE = 0
    NVML_VALUE_TYPE_UNSIGNED_INT = 1

    def __post_init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.inits = 0
        self.shutdowns = 0
        self.handles: list[object] = []
        self.samples_since: list[int] = []
        self.stuck = threading.Event()

    def _maybe_hang(self, name: str) -> None:
        if self.hang is not None and self.hang[0] == name:
            self.stuck.set()
            self.hang[1].wait()

    def nvmlInit(self) -> None:  # noqa: N802 (pynvml's names)
        self._maybe_hang("nvmlInit")
        if self.init_error is not None:
            raise self.init_error
        self.inits += 1

    def nvmlShutdown(self) -> None:  # noqa: N802
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:  # noqa: N802
        return self.driver_version

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:  # noqa: N802
        self._maybe_hang("nvmlDeviceGetHandleByIndex")
        if self.handle_error is not None:
            raise self.handle_error
        self.handles.append(("index", index))
        return ("index", index)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> object:  # noqa: N802
        if self.handle_error is not None:
            raise self.handle_error
        self.handles.append(("pci", bus_id))
        return ("pci", bus_id)

    def _tick(self) -> None:
        with self.lock:
            self.calls += 1
            n = self.calls
        if self.fail_on_call is not None and n >= self.fail_on_call[0]:
            raise self.fail_on_call[1]

    def nvmlDeviceGetUtilizationRates(self, _handle: object) -> SimpleNamespace:  # noqa: N802
        self._maybe_hang("nvmlDeviceGetUtilizationRates")
        self._tick()
        value = self.utilization.pop(0) if len(self.utilization) > 1 else self.utilization[0]
        return SimpleNamespace(gpu=value, memory=0)

    def nvmlDeviceGetMemoryInfo(self, _handle: object) -> SimpleNamespace:  # noqa: N802
        self._tick()
        return SimpleNamespace(used=self.memory_used, total=self.memory_used * 4, free=self.memory_used * 3)

    def nvmlDeviceGetPowerUsage(self, _handle: object) -> int:  # noqa: N802
        if self.power_not_supported:
            raise NVMLError_NotSupported(3)
        self._tick()
        return self.power_mw

    def nvmlDeviceGetClockInfo(self, _handle: object, kind: int) -> int:  # noqa: N802
        assert kind == self.NVML_CLOCK_SM
        self._tick()
        return self.sm_clock

    def nvmlDeviceGetSamples(self, _handle: object, kind: int, since_us: int):  # noqa: N802, ANN201
        assert kind == self.NVML_GPU_UTILIZATION_SAMPLES
        self._maybe_hang("nvmlDeviceGetSamples")
        self.samples_since.append(since_us)
        if self.driver_samples is None:
            raise NVMLError_NotFound(6)
        samples = [FakeSample(t, SimpleNamespace(uiVal=v)) for t, v in self.driver_samples if t > since_us]
        return self.NVML_VALUE_TYPE_UNSIGNED_INT, samples


# -- CUDA ------------------------------------------------------------------------------------------------------


class FakeEvent:
    """A CUDA event whose record() reads a shared fake clock (in seconds)."""

    def __init__(self, clock: FakeClock) -> None:
        self._clock = clock
        self.at: float | None = None

    def record(self) -> None:
        self.at = self._clock()

    def elapsed_time(self, end: FakeEvent) -> float:
        assert self.at is not None and end.at is not None, "events must be recorded first"
        return (end.at - self.at) * 1000.0


class FakeCuda:
    """The parts of torch.cuda the sync and event probes use."""

    def __init__(self, clock: FakeClock | None = None) -> None:
        self.clock = clock or FakeClock()
        self.mode = 0
        self.mode_history: list[object] = []
        self.synchronized = 0

    def Event(self, enable_timing: bool = False) -> FakeEvent:  # noqa: N802 (torch's name)
        assert enable_timing
        return FakeEvent(self.clock)

    def synchronize(self) -> None:
        self.synchronized += 1

    def get_sync_debug_mode(self) -> int:
        return self.mode

    def set_sync_debug_mode(self, mode: object) -> None:
        self.mode_history.append(mode)
        self.mode = {"default": 0, "warn": 1, "error": 2}.get(mode, mode)  # type: ignore[arg-type]

    def sync_point(self) -> None:
        """What a synchronizing op does under the sync debug mode: warn when the mode is "warn"."""
        if self.mode == 1:
            warnings.warn("called a synchronizing CUDA operation", UserWarning, stacklevel=2)
