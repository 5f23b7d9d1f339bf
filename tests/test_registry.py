"""The registry is the one list of families: every consumer must cover exactly what it lists."""

from __future__ import annotations

import pytest

from pitfalls import cases, equivalence, registry
from pitfalls.families import loss, sampler
from pitfalls.family import FLOOR, Family


def test_the_built_in_families_and_their_naive_variants():
    assert registry.family_names()[:2] == ("loss", "sampler")
    assert registry.baseline("loss") == "naive"
    assert registry.baseline("sampler") == "nonzero"


def test_registry_lists_exactly_the_variants_each_family_module_implements():
    assert registry.variants("loss") == tuple(loss.VARIANTS)
    assert registry.variants("sampler") == tuple(sampler.VARIANTS)


@pytest.mark.parametrize("name", registry.family_names())
def test_every_family_is_one_entry_with_its_floor_after_its_variants(name):
    entry = registry.family(name)
    assert isinstance(entry, Family) and entry.name == name
    assert entry.cases == (*entry.variants, FLOOR) if entry.floor else entry.variants
    assert set(entry.smoke) <= set(entry.param_names)


def test_check_all_covers_every_registered_variant_and_not_the_floor():
    rows = equivalence.check_all(("cpu",))
    covered = {(row.family, row.variant) for row in rows}
    assert covered == {(f, v) for f in registry.family_names() for v in registry.variants(f)}
    failures = [row for row in rows if not row.matches and not row.skipped]
    assert failures == []
    # What cannot run on this machine is said, with the reason, never passed off as a match.
    for row in rows:
        if row.skipped:
            assert not row.matches and row.max_abs_diff != row.max_abs_diff, row


def test_the_gate_refuses_to_compare_the_floor():
    with pytest.raises(ValueError, match=r"loss variant='floor' is not known; allowed: naive, where"):
        registry.family("loss").compare(FLOOR)


def test_unknown_family_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"family='nope' is not known; allowed: loss, sampler"):
        registry.variants("nope")


@pytest.mark.parametrize("family", registry.family_names())
def test_every_variant_and_the_floor_build_a_runnable_case_at_the_smoke_size(family):
    entry = registry.family(family)
    for variant in entry.cases:
        try:
            case = cases.smoke_case(family, variant)
        except cases.SkipCase as skip:
            # A variant may need what this machine lacks (loader's gpu_decode: CUDA and torchvision); the naive
            # variant and the floor must run anywhere.
            assert variant not in (entry.baseline, entry.cases[-1]) and skip.reason, (variant, skip.reason)
            continue
        assert (case.family, case.variant, case.device.type, case.compiled) == (family, variant, "cpu", False)
        with case:
            case()


def test_case_builder_refuses_unknown_parameters_and_skips_what_cannot_run():
    with pytest.raises(ValueError, match="loss has no parameter n; allowed: batch, image_size"):
        cases.build_case("loss", "naive", n=10)
    with pytest.raises(ValueError, match="batch=0 is not allowed; batch must be an int >= 1"):
        cases.build_case("loss", "naive", batch=0)
    with pytest.raises(TypeError, match="image_size must be an int, got '8'"):
        cases.build_case("loss", "naive", image_size="8")
    with pytest.raises(cases.SkipCase, match="needs about .* GiB on cpu"):
        cases.build_case("sampler", "static", n=10**9, batch=10**4)


def test_the_floor_does_the_familys_job_with_no_sync_hazard():
    from pitfalls.probes import count_hazards

    for family in registry.family_names():
        if "hazards" in registry.family(family).figures:
            assert count_hazards(cases.smoke_case(family, FLOOR)).total == 0, family


def test_the_loss_floor_trains_on_labels_remapped_before_the_step():
    step = cases.build_case("loss", FLOOR, batch=2, image_size=8).call
    assert not bool((step.labels == 9).any())  # background (class C-1) is already the ignore label
    naive = cases.build_case("loss", "naive", batch=2, image_size=8).call
    assert torch_equal_where_not_background(naive.labels, step.labels)


def torch_equal_where_not_background(original, remapped) -> bool:
    keep = original != 9
    return bool((original[keep] == remapped[keep]).all()) and bool((remapped[~keep] == -1).all())


def test_the_sampler_floor_picks_k_distinct_items_of_each_row():
    result = cases.build_case("sampler", FLOOR, n=100, batch=3).call()
    assert result.labels.shape == (3, 10) and bool(result.valid.all())
    for row in result.features:
        assert row.unique(dim=0).shape[0] == 10
