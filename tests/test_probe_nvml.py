"""The NVML sampler against a fake NVML module, and against the real binding where a GPU exists."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from types import SimpleNamespace

import pytest
import torch
from fakes import (
    FakeClock,
    FakeNVML,
    NVMLError,
    NVMLError_GpuIsLost,
    NVMLError_LibraryNotFound,
    NVMLError_NotFound,
    NVMLError_Unknown,
)

from pitfalls.probes.nvml import MetricSummary, NvmlSampler, NvmlSummary, NvmlTarget, nvml_target
from pitfalls.result import Unavailable

FAST = 0.001  # seconds between samples in tests: many samples, quick tests


def sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "pitfalls-nvml-sampler"]


def wait_for(predicate, timeout: float = 5.0) -> None:
    """Wait until the sampling thread has done something; a guard against a hang, not a timing assertion."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("the sampler made no progress")
        time.sleep(0.001)


def test_normal_sampling_summarises_every_metric_in_its_unit() -> None:
    nvml = FakeNVML(utilization=[10.0, 30.0, 50.0], memory_used=3 * 1024**3, power_mw=250_500, sm_clock=1755)
    clock = FakeClock(start=10.0)
    with NvmlSampler(0, interval_s=FAST, nvml=nvml, clock=clock) as sampler:
        wait_for(lambda: nvml.calls >= 12)  # at least three full samples of four metrics
        clock.advance(2.5)
    s = sampler.summary
    assert isinstance(s, NvmlSummary)
    assert s.failure is None
    assert s.duration_s == 2.5
    assert s.interval_s == FAST
    assert s.target == "NVML index 0"
    n = s.utilization_pct.samples
    assert n >= 3
    # the fake returns 10, 30, then 50 forever
    assert s.utilization_pct.max == 50.0
    assert s.utilization_pct.mean == pytest.approx((10 + 30 + 50 * (n - 2)) / n)
    assert s.memory_used_mib == MetricSummary(mean=3072.0, max=3072.0, samples=s.memory_used_mib.samples, unit="MiB")
    assert s.power_w.mean == pytest.approx(250.5) and s.power_w.unit == "W"
    assert s.sm_clock_mhz.max == 1755.0 and s.sm_clock_mhz.unit == "MHz"
    assert nvml.inits == 1 and nvml.shutdowns == 1
    assert not sampler_threads()


def test_driver_samples_inside_the_window_are_summarised() -> None:
    wall = FakeClock(start=1000.0)  # seconds; NVML timestamps are microseconds
    nvml = FakeNVML(driver_samples=[(999_000_000, 99), (1_000_100_000, 40), (1_000_200_000, 80),
                                    (1_009_000_000, 7)])
    with NvmlSampler(0, interval_s=FAST, nvml=nvml, wall_clock=wall) as sampler:
        wall.advance(1.0)
    s = sampler.summary
    assert nvml.samples_since == [1_000_000_000]
    # 99 is before the window, 7 after it
    assert s.nvml_utilization_pct == MetricSummary(mean=60.0, max=80.0, samples=2, unit="%")


def test_no_driver_samples_is_unavailable_not_zero() -> None:
    nvml = FakeNVML(driver_samples=None)
    with NvmlSampler(0, interval_s=FAST, nvml=nvml) as sampler:
        pass
    assert sampler.summary.nvml_utilization_pct == Unavailable("no driver utilization samples in the window")


def test_missing_library_is_unavailable_and_the_block_still_runs() -> None:
    nvml = FakeNVML(init_error=NVMLError_LibraryNotFound(12))
    ran = []
    with NvmlSampler(0, nvml=nvml) as sampler:
        ran.append(True)
    assert ran == [True]
    assert sampler.summary == Unavailable("NVML library not found")
    assert str(sampler.summary) == "unavailable: NVML library not found"
    assert nvml.shutdowns == 0  # never initialised, so never shut down
    assert not sampler_threads()


def test_a_missing_device_is_unavailable_with_the_target_named() -> None:
    nvml = FakeNVML(handle_error=NVMLError_NotFound(6))
    with NvmlSampler(NvmlTarget(pci_bus_id="00000000:3B:00.0"), nvml=nvml) as sampler:
        pass
    assert sampler.summary == Unavailable("GPU not found (PCI 00000000:3B:00.0)")
    assert nvml.inits == 1 and nvml.shutdowns == 1


def test_a_failure_mid_run_keeps_the_samples_taken_and_records_the_reason() -> None:
    # calls 1-8 succeed (two full samples of four metrics); the 9th and all later fail
    nvml = FakeNVML(fail_on_call=(9, NVMLError_Unknown(999)))
    with NvmlSampler(0, interval_s=FAST, nvml=nvml) as sampler:
        wait_for(lambda: nvml.calls >= 9)
        wait_for(lambda: not sampler_threads())  # the thread stops by itself after a failure
    s = sampler.summary
    assert s.failure == "NVML error: Unknown Error (mid-run, after 2 samples)"
    for metric in (s.utilization_pct, s.memory_used_mib, s.power_w, s.sm_clock_mhz):
        assert isinstance(metric, MetricSummary) and metric.samples == 2
    # the driver buffer is not read from a device that just failed
    assert s.nvml_utilization_pct == Unavailable(s.failure)
    assert nvml.shutdowns == 1


def test_a_gpu_lost_before_the_first_full_sample_reports_why_per_metric() -> None:
    nvml = FakeNVML(fail_on_call=(2, NVMLError_GpuIsLost(15)))
    with NvmlSampler(0, interval_s=FAST, nvml=nvml) as sampler:
        wait_for(lambda: nvml.calls >= 2)
    s = sampler.summary
    assert s.failure == "GPU is lost (mid-run, after 1 sample)"
    assert s.utilization_pct.samples == 1
    assert s.memory_used_mib == Unavailable("GPU is lost (mid-run, after 1 sample)")
    assert s.power_w == Unavailable("GPU is lost (mid-run, after 1 sample)")
    assert not sampler_threads()


def test_an_unsupported_metric_is_unavailable_while_the_others_go_on() -> None:
    nvml = FakeNVML(power_not_supported=True)
    with NvmlSampler(0, interval_s=FAST, nvml=nvml) as sampler:
        wait_for(lambda: nvml.calls >= 9)
    s = sampler.summary
    assert s.failure is None
    assert s.power_w == Unavailable("not supported on this GPU")
    assert s.utilization_pct.samples >= 3


class NVMLError_NoPermission(NVMLError):  # noqa: N801 (pynvml's names)
    def __str__(self) -> str:
        return "Insufficient Permissions"


class NVMLError_DriverNotLoaded(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "Driver Not Loaded"


class NVMLError_Uninitialized(NVMLError):  # noqa: N801
    def __str__(self) -> str:
        return "Uninitialized"


@dataclass
class PowerFailing(FakeNVML):
    """A fake NVML whose power reader raises ``power_error`` on every read, as a sandboxed GPU's does."""

    power_error: Exception = field(default_factory=NVMLError_Unknown)

    NVMLError_NoPermission = NVMLError_NoPermission
    NVMLError_DriverNotLoaded = NVMLError_DriverNotLoaded
    NVMLError_Uninitialized = NVMLError_Uninitialized

    def nvmlDeviceGetPowerUsage(self, _handle: object) -> int:  # noqa: N802
        self._tick()
        raise self.power_error


@pytest.mark.parametrize(("error", "reason"), [(NVMLError_NoPermission(4), "no permission"),
                                               (NVMLError_Unknown(999), "NVML error: Unknown Error")])
def test_a_metric_that_fails_its_first_read_is_unavailable_while_the_others_go_on(error, reason) -> None:
    nvml = PowerFailing(power_error=error)
    with NvmlSampler(0, interval_s=FAST, nvml=nvml) as sampler:
        wait_for(lambda: nvml.calls >= 12)  # three rounds of the four readers
    s = sampler.summary
    assert s.failure is None
    assert s.power_w == Unavailable(reason) and str(s.power_w) == f"unavailable: {reason}"  # never 0 W
    for metric in (s.utilization_pct, s.memory_used_mib, s.sm_clock_mhz):
        assert isinstance(metric, MetricSummary) and metric.samples >= 3
    assert nvml.shutdowns == 1


@pytest.mark.parametrize(("error", "reason"), [(NVMLError_GpuIsLost(15), "GPU is lost"),
                                               (NVMLError_DriverNotLoaded(9), "NVIDIA driver not loaded"),
                                               (NVMLError_Uninitialized(1), "NVML error: Uninitialized")])
def test_a_gone_gpu_or_driver_on_a_first_read_still_ends_the_window(error, reason) -> None:
    nvml = PowerFailing(power_error=error)
    with NvmlSampler(0, interval_s=FAST, nvml=nvml) as sampler:
        wait_for(lambda: not sampler_threads())  # the thread stops by itself
    s = sampler.summary
    assert s.failure == f"{reason} (mid-run, after 1 sample)"
    assert s.power_w == Unavailable(s.failure) and s.sm_clock_mhz == Unavailable(s.failure)
    assert s.utilization_pct.samples == 1 and s.memory_used_mib.samples == 1
    assert s.nvml_utilization_pct == Unavailable(s.failure)


def test_the_thread_stops_and_the_error_propagates_when_the_block_raises() -> None:
    nvml = FakeNVML()
    sampler = NvmlSampler(0, interval_s=FAST, nvml=nvml)
    with pytest.raises(KeyError, match="measured code failed"):
        with sampler:
            wait_for(lambda: nvml.calls >= 1)
            raise KeyError("measured code failed")
    assert not sampler_threads()
    assert isinstance(sampler.summary, NvmlSummary)
    assert sampler.summary.utilization_pct.samples >= 1
    assert nvml.shutdowns == 1


def test_an_unexpected_error_in_the_thread_is_raised_not_hidden() -> None:
    nvml = FakeNVML(fail_on_call=(1, ZeroDivisionError("not an NVML error")))
    with pytest.raises(RuntimeError, match="NVML sampling thread failed") as info:
        with NvmlSampler(0, interval_s=FAST, nvml=nvml):
            wait_for(lambda: not sampler_threads())
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_a_plain_error_in_a_query_still_shuts_nvml_down() -> None:
    error = RuntimeError("the binding broke")
    nvml = FakeNVML(fail_on_call=(5, error))  # the first full sample works, the second fails
    with pytest.raises(RuntimeError, match="^the NVML sampling thread failed$") as info:
        with NvmlSampler(0, interval_s=FAST, nvml=nvml):
            wait_for(lambda: nvml.calls >= 5)
    assert info.value.__cause__ is error
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    assert not sampler_threads()


def test_a_plain_error_looking_up_the_device_still_shuts_nvml_down() -> None:
    error = RuntimeError("the binding broke")
    nvml = FakeNVML(handle_error=error)
    ran = []
    with pytest.raises(RuntimeError, match="^the NVML sampling thread failed$") as info:
        with NvmlSampler(0, interval_s=FAST, nvml=nvml):
            ran.append(True)
    assert info.value.__cause__ is error
    assert ran == []  # raised on entering: nothing was measured without its figures
    assert (nvml.inits, nvml.shutdowns) == (1, 1)
    assert not sampler_threads()


HANG_S = 1.0  # the sampler's timeout in the tests below
GUARD_S = 10.0  # how long a test lets the calling code run before it calls it hung (a guard, not a timing)


@pytest.mark.parametrize(
    "call", ["nvmlInit", "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetSamples"]
)
def test_an_nvml_call_that_never_returns_is_unavailable_and_the_code_goes_on(call: str) -> None:
    release = threading.Event()
    nvml = FakeNVML(hang=(call, release), driver_samples=[])
    sampler = NvmlSampler(0, interval_s=FAST, nvml=nvml, timeout_s=HANG_S)
    ran = []

    def measured_code() -> None:
        with sampler:
            if call == "nvmlDeviceGetUtilizationRates":
                wait_for(nvml.stuck.is_set)  # stuck mid-block; the others hang entering or leaving it
            ran.append(True)

    caller = threading.Thread(target=measured_code, daemon=True)
    try:
        caller.start()
        caller.join(GUARD_S)
        assert not caller.is_alive(), f"a hung {call} hung the calling code"
        assert ran == [True]
        assert nvml.stuck.is_set()
        assert sampler.summary == Unavailable("NVML call did not return within 1 s")
        assert str(sampler.summary) == "unavailable: NVML call did not return within 1 s"
        assert nvml.shutdowns == 0  # the stuck call still holds NVML: shutting down under it could hang too
    finally:
        release.set()
    # Once the call returns, its thread ends and shuts NVML down.
    wait_for(lambda: not sampler_threads())
    assert (nvml.inits, nvml.shutdowns) == (1, 1)


def test_a_sampler_given_up_on_samples_again_while_the_stuck_call_still_waits() -> None:
    release = threading.Event()
    nvml = FakeNVML(hang=("nvmlDeviceGetUtilizationRates", release))
    sampler = NvmlSampler(0, interval_s=FAST, nvml=nvml, timeout_s=HANG_S)

    def two_blocks() -> None:
        with sampler:
            wait_for(nvml.stuck.is_set)
        assert sampler.summary == Unavailable("NVML call did not return within 1 s")
        nvml.hang = None  # the stuck call goes on waiting; new calls return
        with sampler:
            wait_for(lambda: nvml.calls >= 8)  # the stuck call has not counted itself yet: all are this block's

    caller = threading.Thread(target=two_blocks, daemon=True)
    try:
        caller.start()
        caller.join(GUARD_S)
        assert not caller.is_alive(), "a hung NVML call hung the calling code"
        assert isinstance(sampler.summary, NvmlSummary)
        assert sampler.summary.utilization_pct.samples >= 2
        assert len(sampler_threads()) == 1  # the first block's, still stuck
        assert (nvml.inits, nvml.shutdowns) == (2, 1)
    finally:
        release.set()
    wait_for(lambda: not sampler_threads())
    assert (nvml.inits, nvml.shutdowns) == (2, 2)


@pytest.mark.parametrize("interval", [0, -1.0, "fast", True])
def test_bad_interval_is_rejected(interval) -> None:
    with pytest.raises(ValueError, match="interval_s must be a number of seconds > 0"):
        NvmlSampler(0, interval_s=interval, nvml=FakeNVML())


@pytest.mark.parametrize("timeout", [0, -1.0, "10", True, float("inf")])
def test_bad_timeout_is_rejected(timeout) -> None:
    with pytest.raises(ValueError, match=f"timeout_s must be a number of seconds > 0, got {timeout!r}"):
        NvmlSampler(0, timeout_s=timeout, nvml=FakeNVML())


def test_sampling_by_pci_bus_id_uses_that_handle() -> None:
    nvml = FakeNVML()
    with NvmlSampler(NvmlTarget(pci_bus_id="00000000:9A:00.0"), interval_s=FAST, nvml=nvml):
        pass
    assert nvml.handles == [("pci", "00000000:9A:00.0")]


# -- mapping a torch device to NVML ---------------------------------------------------------------------------


def props(domain: int, bus: int, device: int) -> SimpleNamespace:
    return SimpleNamespace(pci_domain_id=domain, pci_bus_id=bus, pci_device_id=device)


def test_target_prefers_the_pci_bus_id() -> None:
    seen = []

    def get_properties(index: int) -> SimpleNamespace:
        seen.append(index)
        return props(0, 0x3B, 0)

    target = nvml_target("cuda:1", environ={"CUDA_VISIBLE_DEVICES": "5,7"}, get_properties=get_properties)
    assert target == NvmlTarget(pci_bus_id="00000000:3B:00.0")
    assert seen == [1]


def test_target_follows_a_plain_visible_devices_list_without_properties() -> None:
    assert nvml_target("cuda:1", environ={"CUDA_VISIBLE_DEVICES": "5, 7"}) == NvmlTarget(index=7)
    assert nvml_target("cuda", environ={"CUDA_VISIBLE_DEVICES": "3"}) == NvmlTarget(index=3)


def test_target_falls_back_to_the_index_when_visible_devices_are_not_integers() -> None:
    environ = {"CUDA_VISIBLE_DEVICES": "GPU-8f2e1c3a-0000-1111-2222-333344445555"}
    assert nvml_target("cuda:0", environ=environ) == NvmlTarget(index=0)
    assert nvml_target(torch.device("cuda", 2), environ={}) == NvmlTarget(index=2)


def test_target_rejects_what_cannot_be_mapped() -> None:
    with pytest.raises(ValueError, match=r"device index 2 is not in CUDA_VISIBLE_DEVICES=\[0, 1\]"):
        nvml_target("cuda:2", environ={"CUDA_VISIBLE_DEVICES": "0,1"})
    with pytest.raises(ValueError, match="must be a CUDA device for NVML, got 'cpu'"):
        nvml_target("cpu", environ={})
    with pytest.raises(TypeError, match="device must be a torch.device, a str or an int, got float"):
        nvml_target(1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="index must be an int >= 0, got -1"):
        NvmlTarget(index=-1)
    with pytest.raises(ValueError, match="exactly one of index and pci_bus_id"):
        NvmlTarget()


# -- the real binding -----------------------------------------------------------------------------------------


def test_real_binding_without_a_driver_is_unavailable() -> None:
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("NVML works here; the missing-driver path is not reachable")
    with NvmlSampler(0) as sampler:
        pass
    assert isinstance(sampler.summary, Unavailable)
    assert sampler.summary.reason in {"NVML library not found", "NVIDIA driver not loaded"}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device and its driver's NVML")
def test_real_binding_samples_a_busy_gpu() -> None:
    a = torch.randn(4096, 4096, device="cuda")
    with NvmlSampler(torch.device("cuda", 0), interval_s=0.02) as sampler:
        for _ in range(200):
            a @ a
        torch.cuda.synchronize()
    s = sampler.summary
    assert isinstance(s, NvmlSummary), s
    assert s.failure is None
    assert s.utilization_pct.samples >= 1
    assert s.utilization_pct.max > 0
    assert s.memory_used_mib.max > 0



def test_unavailable_reason_names_the_missing_library_and_none_when_nvml_works():
    from pitfalls.probes.nvml import nvml_unavailable_reason

    assert nvml_unavailable_reason(FakeNVML(init_error=NVMLError_LibraryNotFound())) == "NVML library not found"
    working = FakeNVML()
    assert nvml_unavailable_reason(working) is None
    assert (working.inits, working.shutdowns) == (1, 1)
