"""Sync-hazard counting (any device) and CUDA sync counting (logic with a fake, figures on a GPU)."""

from __future__ import annotations

import warnings

import pytest
import torch
from fakes import FakeCuda

from pitfalls.probes._cuda import cuda_unavailable_reason
from pitfalls.probes.syncs import (
    HazardCounts,
    SyncCount,
    SyncHazardCounter,
    count_cuda_syncs,
    count_hazards,
    hazard_label,
    syncs_per_call,
)
from pitfalls.result import Unavailable

aten = torch.ops.aten


class OnDevice(torch.Tensor):
    """A data-less tensor that claims to live on an accelerator, to test the copy rules without one."""

    @staticmethod
    def __new__(cls, device: str, dtype: torch.dtype = torch.float32) -> OnDevice:
        return torch.Tensor._make_wrapper_subclass(cls, (2,), dtype=dtype, device=torch.device(device))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN206
        raise NotImplementedError(f"{func} is not needed by these tests")


# -- which ops are hazards ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "args", "kwargs", "expected"),
    [
        (aten.nonzero.default, (torch.ones(3),), {}, "aten.nonzero.default"),
        (aten._local_scalar_dense.default, (torch.ones(()),), {}, "aten._local_scalar_dense.default"),
        (aten.equal.default, (torch.ones(2), torch.ones(2)), {}, "aten.equal.default"),
        (aten.masked_select.default, (torch.ones(2), torch.ones(2, dtype=torch.bool)), {},
         "aten.masked_select.default"),
        (aten.sum.default, (torch.ones(3),), {}, None),
        (aten.count_nonzero.default, (torch.ones(3),), {}, None),
        (aten.nonzero_static.default, (torch.ones(3),), {"size": 3}, None),
        # Integer advanced indexing is asynchronous although the op is tagged as a whole.
        (aten.index.Tensor, (torch.ones(4), [torch.tensor([0, 2])]), {}, None),
        (aten.index.Tensor, (torch.ones(4), [torch.tensor([True, False, True, False])]), {},
         "aten.index.Tensor (bool mask)"),
        (aten.index.Tensor, (torch.ones(2, 2), [None, torch.tensor([1, 0], dtype=torch.uint8)]), {},
         "aten.index.Tensor (bool mask)"),
        # index_put_ carries no tag, yet with a mask it runs nonzero inside the kernel.
        (aten.index_put_.default, (torch.ones(4), [torch.tensor([True, False, True, False])], torch.zeros(())),
         {}, "aten.index_put_.default (bool mask)"),
        (aten.index_put_.default, (torch.ones(4), [torch.tensor([0, 2])], torch.zeros(())), {}, None),
        (aten.repeat_interleave.Tensor, (torch.tensor([1, 2]),), {}, "aten.repeat_interleave.Tensor"),
        (aten.repeat_interleave.Tensor, (torch.tensor([1, 2]),), {"output_size": 3}, None),
    ],
)
def test_hazard_label(op, args, kwargs, expected) -> None:
    assert hazard_label(op, args, kwargs) == expected


def test_blocking_copies_between_host_and_device_are_hazards_both_ways_and_others_are_not() -> None:
    # Without non_blocking CUDA's copy kernel ends with memcpy_and_sync whichever way it copies.
    gpu, cpu = OnDevice("cuda"), torch.empty(2)
    to_cpu, to_gpu = {"device": torch.device("cpu")}, {"device": torch.device("cuda")}
    assert hazard_label(aten._to_copy.default, (gpu,), to_cpu) == "aten._to_copy.default (device to host)"
    assert hazard_label(aten._to_copy.default, (gpu,), {**to_cpu, "non_blocking": True}) is None
    assert hazard_label(aten._to_copy.default, (cpu,), to_gpu) == "aten._to_copy.default (host to device)"
    assert hazard_label(aten._to_copy.default, (cpu,), {**to_gpu, "non_blocking": True}) is None
    assert hazard_label(aten._to_copy.default, (cpu,), to_cpu) is None
    assert hazard_label(aten._to_copy.default, (gpu,), {"dtype": torch.float64}) is None
    assert hazard_label(aten.copy_.default, (cpu, gpu), {}) == "aten.copy_.default (device to host)"
    assert hazard_label(aten.copy_.default, (cpu, gpu, True), {}) is None
    assert hazard_label(aten.copy_.default, (gpu, cpu), {}) == "aten.copy_.default (host to device)"
    assert hazard_label(aten.copy_.default, (gpu, cpu), {"non_blocking": True}) is None
    assert hazard_label(aten.copy_.default, (cpu, torch.empty(2)), {}) is None


def test_on_an_accelerator_a_host_made_tensor_copied_to_the_device_is_a_hazard() -> None:
    # `.cuda()` has no rule at the Python API: on a GPU its _to_copy is seen by the dispatch rules, and a tensor the
    # program made on the host must not make it "an op the CUDA program runs on the CPU".
    with SyncHazardCounter() as counter:
        host = torch.tensor([1.0, 2.0])
        label = counter._label(aten._to_copy.default, (host,), {"device": torch.device("cuda")})
        same_side = counter._label(aten._to_copy.default, (host,), {"dtype": torch.float64})
    assert label == "aten._to_copy.default (host to device)" and same_side is None


def test_an_index_put_of_a_host_scalar_copies_it_to_the_device_unless_it_takes_masked_fill() -> None:
    gpu, host_scalar, mask = OnDevice("cuda"), torch.zeros(()), OnDevice("cuda", torch.bool)
    integer = OnDevice("cuda", torch.long)
    put = aten.index_put_.default
    # _index_put_impl_: value.to(self.device()) for a one-element 0-dim value on another device.
    assert hazard_label(put, (gpu, [integer], host_scalar), {}) == f"{put} (host value to device)"
    assert syncs_per_call(f"{put} (host value to device)") == 1
    # One mask and a host scalar: masked_fill_, no copy, no nonzero.
    assert hazard_label(put, (gpu, [mask], host_scalar), {}) is None
    # accumulate=True skips masked_fill_: the mask's nonzero and the copy, two syncs in one call.
    both = hazard_label(put, (gpu, [mask], host_scalar, True), {})
    assert both == f"{put} (bool mask + host value to device)" and syncs_per_call(both) == 2
    # A value already on the device: no copy.
    assert hazard_label(put, (gpu, [integer], OnDevice("cuda")), {}) is None
    assert syncs_per_call("aten.bincount.default") == 2 and syncs_per_call("aten.nonzero.default") == 1
    # One nonzero per mask (ATen's expandTensors), reads and writes alike.
    masks = [OnDevice("cuda", torch.bool), None, OnDevice("cuda", torch.bool)]
    assert hazard_label(aten.index.Tensor, (gpu, masks), {}) == "aten.index.Tensor (2 bool masks)"
    assert syncs_per_call("aten.index.Tensor (2 bool masks)") == 2
    assert syncs_per_call(f"{put} (2 bool masks + host value to device)") == 3


# -- counting -------------------------------------------------------------------------------------------------


def test_python_level_operations_dispatch_to_the_expected_hazards() -> None:
    x = torch.arange(6.0)
    mask = x > 2

    def work() -> None:
        x[mask]  # index.Tensor with a bool mask
        x[torch.tensor([0, 1])]  # integer index: no hazard
        y = x.clone()
        y[mask] = 0.0  # a Python scalar: ATen's masked_fill_ path, no hazard
        y[mask] = y.max()  # a one-element value made on the device: index_put_ with the mask
        torch.unique(x)  # _unique2
        x.sum().item()  # _local_scalar_dense
        bool(x.sum() > 0)  # _local_scalar_dense as well
        torch.where(mask)  # single-argument where is nonzero
        torch.count_nonzero(mask)  # no hazard

    counts = count_hazards(work)
    assert counts.as_dict() == {
        "aten.index.Tensor (bool mask)": 1,
        "aten.index_put_.default (bool mask)": 1,
        "aten._unique2.default": 1,
        "aten._local_scalar_dense.default": 2,
        "aten.nonzero.default": 1,
    }
    assert counts.total == 6
    assert counts.get("aten.nonzero.default") == 1
    assert counts.get("aten.masked_select.default") == 0


def test_backward_ops_inside_the_counted_region_are_counted() -> None:
    x = torch.arange(6.0, requires_grad=True)
    mask = torch.tensor([True, False] * 3)

    forward_only = count_hazards(lambda: x[mask].sum())
    with_backward = count_hazards(lambda: x[mask].sum().backward())

    assert forward_only.as_dict() == {"aten.index.Tensor (bool mask)": 1}
    # index's backward scatters the gradient with index_put and the same boolean mask.
    assert with_backward.as_dict() == {
        "aten.index.Tensor (bool mask)": 1,
        "aten.index_put.default (bool mask)": 1,
    }


def test_a_function_without_hazards_counts_zero() -> None:
    x = torch.randn(8)
    counts = count_hazards(lambda: torch.where(x > 0, x, 0.0).sum())
    assert counts == HazardCounts()
    assert counts.total == 0
    assert str(counts) == "0 sync hazards"


def test_counts_are_immutable_and_sorted() -> None:
    ones = torch.ones(2)  # made before the counted region: device data, as the program's inputs are
    counts = count_hazards(lambda: (torch.nonzero(ones), ones.sum().item()))
    assert counts.counts == (("aten._local_scalar_dense.default", 1), ("aten.nonzero.default", 1))
    with pytest.raises(AttributeError):
        counts.counts = ()  # type: ignore[misc]
    counts.as_dict()["aten.nonzero.default"] = 99
    assert counts.get("aten.nonzero.default") == 1


def test_counter_accumulates_across_calls_and_resets_on_reentry() -> None:
    counter = SyncHazardCounter()
    ones = torch.ones(2)
    with counter:
        for _ in range(3):
            torch.nonzero(ones)
    assert counter.result.get("aten.nonzero.default") == 3
    with counter:
        pass
    assert counter.result.total == 0


def test_count_hazards_passes_arguments_and_rejects_non_callables() -> None:
    counts = count_hazards(torch.nonzero, torch.ones(3))
    assert counts.get("aten.nonzero.default") == 1
    with pytest.raises(TypeError, match="fn must be callable"):
        count_hazards(42)  # type: ignore[arg-type]


def test_a_compiled_function_is_counted_as_its_eager_program_and_compiles_normally_after() -> None:
    # Dynamo will not run compiled code under a dispatch mode; the counter forces eager so the count is the
    # eager program's on every torch version, instead of a silent 0 for a compiled region.
    torch._dynamo.reset()

    def fn(x: torch.Tensor) -> torch.Tensor:
        return torch.nonzero(x > 0).sum() + x.sum()

    compiled = torch.compile(fn, backend="eager")
    x = torch.randn(16)
    assert count_hazards(compiled, x) == count_hazards(fn, x)
    assert count_hazards(compiled, x).get("aten.nonzero.default") == 1
    assert count_hazards(compiled, x).eager is True

    from torch._dynamo.utils import counters

    counters.clear()
    compiled(x)  # the stance is restored: this call is traced by dynamo
    assert counters["stats"]["unique_graphs"] >= 1
    torch._dynamo.reset()


def test_the_counter_leaves_no_mode_active_after_an_exception() -> None:
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    with pytest.raises(ZeroDivisionError):
        with SyncHazardCounter():
            torch.nonzero(torch.ones(2))
            raise ZeroDivisionError
    assert _get_current_dispatch_mode() is None


# -- real CUDA syncs ------------------------------------------------------------------------------------------


def test_cuda_sync_count_without_cuda_is_unavailable_with_the_reason() -> None:
    reason = cuda_unavailable_reason()
    if reason is None:
        pytest.skip("CUDA is usable here; the unavailable path is not reachable")
    result = count_cuda_syncs(lambda: None)
    assert result == Unavailable(reason)
    assert not result
    assert str(result) == f"unavailable: {reason}"


def test_cuda_sync_count_counts_the_warnings_of_the_counted_calls_only() -> None:
    cuda = FakeCuda()
    cuda.mode = 2  # whatever mode was set before must come back

    def step() -> None:
        cuda.sync_point()
        cuda.sync_point()
        if cuda.mode == 1:
            warnings.warn("an unrelated warning", UserWarning, stacklevel=1)

    with pytest.warns(UserWarning, match="an unrelated warning") as passed_on:
        result = count_cuda_syncs(step, calls=3, warmup=2, cuda=cuda)
    # the code's own warnings are passed on, the sync warnings are not
    assert [str(w.message) for w in passed_on] == ["an unrelated warning"] * 3
    assert result == SyncCount(total=6, calls=3, method="sync debug mode")
    assert result.per_call == 2.0
    assert cuda.mode_history == ["warn", 2]
    assert cuda.mode == 2


def test_cuda_sync_count_restores_the_mode_when_the_call_raises() -> None:
    cuda = FakeCuda()

    def broken() -> None:
        if cuda.mode == 1:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        count_cuda_syncs(broken, cuda=cuda)
    assert cuda.mode == 0


def test_cuda_sync_count_zero_is_a_real_measured_zero() -> None:
    cuda = FakeCuda()
    result = count_cuda_syncs(lambda: None, calls=2, warmup=0, cuda=cuda)
    assert result == SyncCount(total=0, calls=2, method="sync debug mode")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"calls": 0}, "calls must be an int >= 1, got 0"),
    ({"calls": 1.5}, "calls must be an int >= 1, got 1.5"),
    ({"warmup": -1}, "warmup must be an int >= 0, got -1"),
])
def test_cuda_sync_count_rejects_bad_counts(kwargs, message) -> None:
    with pytest.raises(ValueError, match=message):
        count_cuda_syncs(lambda: None, cuda=FakeCuda(), **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_cuda_syncs_nonzero_syncs_and_where_does_not() -> None:
    x = torch.randn(1 << 16, device="cuda")
    with_sync = count_cuda_syncs(lambda: torch.nonzero(x > 0), calls=3)
    without = count_cuda_syncs(lambda: torch.where(x > 0, x, 0.0), calls=3)
    assert isinstance(with_sync, SyncCount) and with_sync.total >= 3
    assert without == SyncCount(total=0, calls=3, method="sync debug mode")
    assert torch.cuda.get_sync_debug_mode() == 0


# -- provenance: what the CUDA program would hold on the host ---------------------------------------------------


def test_a_mask_assignment_of_a_host_made_scalar_takes_atens_masked_fill_path() -> None:
    # A fixed mask: the two-index case below needs as many True in mask[:2] as in mask[:4] (a random one made this
    # test depend on the generator's state, so on the tests that ran before it).
    x = torch.tensor([0.5, 1.5, -1.0, -2.0, 0.25, -0.5, 3.0, -4.0])
    mask = x > 0

    def assign(value_of: object) -> HazardCounts:
        def work() -> None:
            y = x.clone()
            y[mask] = value_of(y)  # type: ignore[operator]
        return count_hazards(work)

    assert assign(lambda y: -1).total == 0
    # Built from a Python number with no device: on the host in the CUDA program too.
    assert assign(lambda y: torch.tensor(2.0)).total == 0
    # Made on the host and copied to the device (1), then a device value: no masked_fill_ path (1).
    assert assign(lambda y: torch.tensor(2.0, device=y.device)).as_dict() == {
        "torch.tensor (host to device)": 1, "aten.index_put_.default (bool mask)": 1
    }
    assert assign(lambda y: y.max()).as_dict() == {"aten.index_put_.default (bool mask)": 1}
    assert assign(lambda y: y[mask] * 2).total == 2  # the read, and a many-element value
    # Two indices, or accumulate=True, leave ATen's masked_fill_ path whatever the value: each mask's nonzero, and
    # the host scalar's copy to the device.
    two = count_hazards(lambda: x.clone().view(2, 4).__setitem__((mask[:2], mask[:4]), 0.0))
    assert two.as_dict() == {"aten.index_put_.default (2 bool masks + host value to device)": 3}
    accumulated = count_hazards(lambda: x.clone().index_put_((mask,), torch.tensor(1.0), accumulate=True))
    assert accumulated.as_dict() == {"aten.index_put_.default (bool mask + host value to device)": 2}
    device_value = count_hazards(lambda: x.clone().index_put_((mask,), x.max(), accumulate=True))
    assert device_value.as_dict() == {"aten.index_put_.default (bool mask)": 1}


def test_host_copies_are_counted_at_the_python_api_once_each() -> None:
    x = torch.randn(4)

    def work() -> None:
        host = x.cpu()  # a copy to the host
        x.to("cpu")
        x.to(device="cpu")
        x.to("cpu", non_blocking=True)  # not a blocking copy
        x.tolist()
        host.tolist()  # already on the host: no copy
        host.sum().item()  # host data: no sync
        x.to(torch.float64)  # a dtype: no copy
        f"{x.sum():.2f}"  # formatting a device scalar reads it once

    counts = count_hazards(work)
    assert counts.as_dict() == {
        "Tensor.cpu (device to host)": 1,
        "Tensor.to (device to host)": 2,
        "Tensor.tolist (device to host)": 1,
        "Tensor.__format__ (device to host)": 1,
    }


def test_numpy_of_device_data_is_flagged_as_an_error_on_cuda() -> None:
    x = torch.randn(3)
    assert count_hazards(lambda: x.numpy()).as_dict() == {
        "Tensor.numpy (of a device tensor: a TypeError on CUDA)": 1
    }
    assert count_hazards(lambda: x.cpu().numpy()).as_dict() == {"Tensor.cpu (device to host)": 1}


def test_a_device_object_is_the_programs_device_and_printing_reads_device_data() -> None:
    x = torch.randn(4)
    device = x.device  # torch.device("cpu") here, the GPU in the same program on CUDA

    def work() -> None:
        x.to(device)  # the program's device: no copy on CUDA either
        torch.zeros(2, device=device).sum().item()  # made on the program's device: a read
        print(x)  # printing reads the data
        copy = x.cpu()
        assert copy is not x  # the copy is another tensor, as on CUDA
        copy.sum().item()  # host data

    counts = count_hazards(work)
    assert counts.as_dict() == {
        "Tensor.__repr__ (device to host)": 1,
        "Tensor.cpu (device to host)": 1,
        "aten._local_scalar_dense.default": 1,
    }


def test_provenance_holds_tensors_weakly_and_by_identity() -> None:
    from pitfalls.probes.hostcopy import Provenance

    provenance = Provenance()
    host, other = torch.ones(2), torch.ones(2)  # equal values, different tensors
    provenance.add([host])
    assert provenance.on_host(host) and not provenance.on_host(other)
    del host
    assert provenance._refs == {}  # freed with its tensor: a long step does not grow the table


def _adam_step() -> tuple[torch.optim.Optimizer, list[torch.Tensor]]:
    params = [torch.randn(4, 3, requires_grad=True), torch.randn(3, requires_grad=True)]
    for param in params:
        param.grad = torch.randn_like(param)
    return torch.optim.AdamW(params, lr=1e-3, foreach=False), params


def test_a_host_made_tensor_keeps_its_provenance_across_calls_when_the_warm_up_keeps_it() -> None:
    from pitfalls.probes.hostcopy import Provenance, keep_provenance

    # AdamW makes state["step"] with torch.tensor(0.0, device="cpu") at its first step and reads it with .item()
    # at every later one: a read of host memory on CUDA too.
    optimizer, params = _adam_step()
    optimizer.step()  # made outside any counted region: taken for the device's, as before
    assert count_hazards(optimizer.step).get("aten._local_scalar_dense.default") == len(params)

    optimizer, params = _adam_step()
    provenance = Provenance()
    with keep_provenance(provenance):
        optimizer.step()
    assert all(provenance.on_host(optimizer.state[p]["step"]) for p in params)
    with SyncHazardCounter(provenance=provenance) as counter:
        optimizer.step()
        optimizer.step()
        torch.nonzero(params[0])  # device data stays device data
    assert counter.result.as_dict() == {"aten.nonzero.default": 1}
    with SyncHazardCounter(provenance=provenance) as counter:  # kept, not reset, by the next region
        optimizer.step()
    assert counter.result.total == 0


def test_keeping_provenance_counts_nothing_runs_compiled_code_eagerly_and_leaves_no_mode() -> None:
    from torch.overrides import _get_current_function_mode_stack

    from pitfalls.probes.hostcopy import Provenance, keep_provenance

    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = torch.compile(lambda x: torch.nonzero(x > 0).sum(), backend="eager")
    provenance = Provenance()
    with keep_provenance(provenance):
        made = torch.zeros(3)
        compiled(torch.randn(8))
    assert provenance.on_host(made)
    assert counters["stats"]["unique_graphs"] == 0  # nothing was compiled under the keeper
    assert _get_current_function_mode_stack() == []
    torch._dynamo.reset()
