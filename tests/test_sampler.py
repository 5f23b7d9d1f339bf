"""The sampler variants: exact class counts, distinct picks of the right class, uniform subsets, random order."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from pitfalls.families import sampler
from pitfalls.families.sampler import class_counts, sample_violations
from pitfalls.registry import variants


def expected_counts(p: int, q: int, k: int) -> tuple[int, int]:
    """The rule, written out: K/2 each, topped up from the other class, never more than there are."""
    half = k // 2
    pos, neg = min(p, half), min(q, half)
    if neg < half:
        pos = min(p, k - neg)
    elif pos < half:
        neg = min(q, k - pos)
    return pos, neg


def labelled_row(generator: torch.Generator, n: int, p: int, q: int) -> torch.Tensor:
    """N labels with exactly P positives, Q negatives and the rest -1, shuffled."""
    labels = torch.full((n,), -1)
    labels[:p] = 1
    labels[p : p + q] = 0
    return labels[torch.randperm(n, generator=generator)]


@st.composite
def row_mix(draw, n: int):
    p = draw(st.integers(0, n))
    q = draw(st.integers(0, n - p))
    return p, q


@st.composite
def sampler_inputs(draw):
    """One row or a batch of rows, each with its own mix; K may exceed N or P + Q."""
    n = draw(st.integers(1, 120))
    k = 2 * draw(st.integers(1, 40))
    batch = draw(st.sampled_from([None, 1, 2, 5]))
    d = draw(st.integers(1, 4))
    mixes = draw(st.lists(row_mix(n), min_size=batch or 1, max_size=batch or 1))
    dtype = draw(st.sampled_from([torch.int64, torch.int32, torch.int8]))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    labels = torch.stack([labelled_row(generator, n, p, q) for p, q in mixes]).to(dtype)
    features = torch.randn(len(mixes), n, d, generator=generator)
    if batch is None:
        labels, features = labels[0], features[0]
    return features, labels, k, mixes


@pytest.mark.parametrize("variant", variants("sampler"))
@settings(max_examples=300, deadline=None)
@given(inputs=sampler_inputs())
def test_valid_picks_have_exact_counts_and_obey_the_rules(variant, inputs):
    features, labels, k, mixes = inputs
    result = sampler.sample(variant, features, labels, k)
    want = torch.tensor([expected_counts(p, q, k) for p, q in mixes])
    assert torch.equal(class_counts(result, (len(mixes),)), want)
    assert sample_violations(result, features, labels) == []
    if variant == "static" or labels.ndim == 2:
        assert result.labels.shape[-1] == k
    else:
        assert result.labels.shape == (int(want.sum()),)
    # Empty slots are marked, zeroed and labelled -1; never passed off as a pick.
    assert bool((result.labels[~result.valid] == -1).all())
    assert not result.features[~result.valid].any()


def test_the_rule_check_tells_items_with_equal_features_apart_by_label_and_count():
    # Items 0 and 1 share a feature vector and differ in label, as random normal features sometimes do.
    features = torch.tensor([[0.5], [0.5], [2.0], [3.0]])
    labels = torch.tensor([1, 0, 1, -1])

    def picks(items: list[int], picked_labels: list[int], vectors: torch.Tensor | None = None) -> list[str]:
        chosen = features[items] if vectors is None else vectors
        result = sampler.SampleResult(chosen, torch.tensor(picked_labels), torch.ones(len(items), dtype=torch.bool))
        return sample_violations(result, features, labels)

    assert picks([0, 1], [1, 0]) == []  # both twins, each with its own label
    assert picks([1, 2], [0, 1]) == []
    assert picks([2], [0]) == ["row 0: labels do not match the picked features"]
    assert picks([2, 2], [1, 1]) == ["row 0: an item was picked twice"]
    assert picks([0, 0], [1, 1]) == ["row 0: an item was picked twice"]  # one positive twin, taken twice
    assert picks([3], [-1]) == ["row 0: an item of neither class was picked"]
    assert picks([0], [1], torch.tensor([[9.0]])) == ["row 0: a picked feature vector is not in the input"]


@pytest.mark.parametrize("variant", variants("sampler"))
def test_each_eligible_item_is_picked_with_equal_probability(variant):
    # 6 positives, 10 negatives, 4 ignored; K = 8 takes 4 of each: 2/3 of positives, 2/5 of negatives each time.
    generator = torch.Generator().manual_seed(7)
    labels = labelled_row(generator, 20, 6, 10)
    features = torch.arange(20.0).unsqueeze(-1)
    trials = 3000
    torch.manual_seed(11)
    hits = torch.zeros(20)
    for _ in range(trials):
        result = sampler.sample(variant, features, labels, 8)
        hits[result.features[result.valid, 0].long()] += 1
    assert hits[labels == -1].sum() == 0
    for cls, share in ((1, 4 / 6), (0, 4 / 10)):
        observed = hits[labels == cls]
        assert observed.sum() == trials * 4
        assert chisquare(observed.numpy(), torch.full_like(observed, trials * share).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("variant", variants("sampler"))
def test_output_order_is_random(variant):
    # 100 positives, 10 negatives, K = 20: the negatives must not bunch at either end of the output.
    generator = torch.Generator().manual_seed(3)
    labels = labelled_row(generator, 110, 100, 10)
    features = torch.randn(110, 2, generator=generator)
    trials = 2000
    torch.manual_seed(5)
    positive_at = torch.zeros(20)
    for _ in range(trials):
        positive_at += (sampler.sample(variant, features, labels, 20).labels == 1).float()
    assert chisquare(positive_at.numpy(), torch.full((20,), trials / 2).numpy()).pvalue > 1e-3


def test_static_takes_a_batch_in_one_call_like_rows_one_by_one():
    generator = torch.Generator().manual_seed(0)
    mixes = [(50, 50), (3, 90), (0, 20), (0, 0), (70, 1)]
    labels = torch.stack([labelled_row(generator, 100, p, q) for p, q in mixes])
    features = torch.randn(5, 100, 3, generator=generator)
    batched = class_counts(sampler.sample("static", features, labels, 30), (5,))
    one_by_one = torch.cat([class_counts(sampler.sample("static", features[i], labels[i], 30), (1,)) for i in range(5)])
    assert torch.equal(batched, one_by_one)
    assert torch.equal(batched, torch.tensor([expected_counts(p, q, 30) for p, q in mixes]))


@pytest.mark.slow
def test_static_compiles_into_one_graph_and_nonzero_cannot():
    generator = torch.Generator().manual_seed(0)
    labels = torch.stack([labelled_row(generator, 200, p, q) for p, q in [(120, 60), (5, 100)]])
    features = torch.randn(2, 200, 4, generator=generator)
    compiled = torch.compile(sampler.static_sample, fullgraph=True)
    result = compiled(features, labels, 40)
    assert torch.equal(class_counts(result, (2,)), torch.tensor([[20, 20], [5, 35]]))
    assert sample_violations(result, features, labels) == []
    # The naive form branches in Python on counts only the device knows: no single graph exists.
    with pytest.raises(torch._dynamo.exc.TorchDynamoException):
        torch.compile(sampler.nonzero_sample, fullgraph=True)(features[0], labels[0], 40)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"variant": "dense"}, ValueError, "variant='dense' is not known; allowed: nonzero, static"),
        ({"num_samples": 7}, ValueError, "num_samples=7 is not allowed; num_samples must be a positive even int"),
        ({"num_samples": -2}, ValueError, "num_samples=-2"),
        ({"num_samples": 4.0}, TypeError, "num_samples must be an int"),
        ({"labels": torch.zeros(10)}, TypeError, "labels has dtype float32"),
        ({"labels": torch.zeros(10, dtype=torch.uint8)}, TypeError, "labels has dtype uint8"),
        ({"labels": torch.zeros(9, dtype=torch.long)}, ValueError, "features must be labels' shape plus a feature dim"),
        ({"features": torch.randn(10)}, ValueError, r"expected \[N, D\]"),
        ({"labels": torch.zeros(2, 3, 10, dtype=torch.long)}, ValueError, r"expected \[N\] or a batch \[B, N\]"),
        ({"features": torch.randn(10, 3, device="meta")}, ValueError, "features on meta, labels on cpu"),
    ],
)
def test_bad_input_gets_a_clear_error(kwargs, error, message):
    args = {"variant": "static", "features": torch.randn(10, 3), "labels": torch.zeros(10, dtype=torch.long)}
    args["num_samples"] = 4
    args.update(kwargs)
    with pytest.raises(error, match=message):
        sampler.sample(**args)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("variant", "fast", "variant='fast' is not known"),
        ("n", 0, "n=0 is not allowed"),
        ("num_samples", 5, "num_samples=5 is not allowed; num_samples must be a positive even int"),
        ("batch", -1, "batch=-1 is not allowed"),
    ],
)
def test_bad_sampler_config_is_refused(field, value, message):
    with pytest.raises(ValueError, match=message):
        sampler.SamplerConfig(**{field: value})


@pytest.mark.parametrize(
    ("n", "k"), [(1_000, 100), (150, 14), (50, 4), (30, 2), (10, 2), (1, 2), (10_000_000, 1_000_000)]
)
def test_k_defaults_to_n_over_ten_rounded_down_to_an_even_number_of_at_least_two(n, k):
    # An odd K cannot be split into halves; N // 10 is odd for N = 50, 150 (5, 15) and 0 for N < 10.
    assert sampler.SamplerConfig(n=n).num_samples == k
    assert sampler.default_num_samples(n) == k


def test_an_explicit_k_is_kept():
    assert sampler.SamplerConfig(n=1_000, num_samples=30).num_samples == 30
