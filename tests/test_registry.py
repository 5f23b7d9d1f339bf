"""The registry is the one list of variants: every consumer must cover exactly what it lists."""

from __future__ import annotations

import pytest

from pitfalls import cases, equivalence, registry
from pitfalls.families import loss, sampler


def test_families_and_their_naive_variants():
    assert registry.families() == ("loss", "sampler")
    assert registry.baseline("loss") == "naive"
    assert registry.baseline("sampler") == "nonzero"


def test_registry_lists_exactly_the_variants_each_family_module_implements():
    assert registry.variants("loss") == tuple(loss.VARIANTS)
    assert registry.variants("sampler") == tuple(sampler.VARIANTS)


def test_every_family_has_an_equivalence_check_and_case_builder():
    assert set(equivalence.COMPARERS) == set(registry.families())
    assert set(cases.DEFAULT_PARAMS) == set(registry.families())


def test_check_all_covers_every_registered_variant():
    rows = equivalence.check_all(("cpu",))
    covered = {(row.family, row.variant) for row in rows}
    assert covered == {(f, v) for f in registry.families() for v in registry.variants(f)}
    failures = [row for row in rows if not row.matches]
    assert failures == []


def test_unknown_family_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"family='loader' is not known; allowed: loss, sampler"):
        registry.variants("loader")


@pytest.mark.parametrize("family", registry.families())
def test_every_variant_builds_a_runnable_case(family):
    small = {"loss": {"batch": 1, "image_size": 8}, "sampler": {"n": 100}}[family]
    for variant in registry.variants(family):
        case = cases.build_case(family, variant, **small)
        assert (case.family, case.variant, case.device.type, case.compiled) == (family, variant, "cpu", False)
        case()


def test_case_builder_refuses_unknown_sizes_and_skips_what_cannot_run():
    with pytest.raises(ValueError, match="loss has no parameter n; allowed: batch, image_size"):
        cases.build_case("loss", "naive", n=10)
    with pytest.raises(cases.SkipCase, match="needs about .* GiB on cpu"):
        cases.build_case("sampler", "static", n=10**9, batch=10**4)
