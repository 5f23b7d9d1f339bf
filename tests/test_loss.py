"""The loss variants: each equals naive in value and gradient, and naive is the loss the article defines."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from pitfalls.families import loss
from pitfalls.registry import baseline, variants

OPTIMIZED = [v for v in variants("loss") if v != baseline("loss")]


def value_and_grad(variant: str, pred: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # clone() keeps the caller's layout (channels_last, strides), which is part of what is tested.
    leaf = pred.detach().clone().requires_grad_(True)
    value = loss.make_loss(variant, pred.shape[1])(leaf, target)
    (grad,) = torch.autograd.grad(value, leaf)
    return value.detach(), grad


def reference(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The article's definition, written plainly: background ignored, zero under two distinct labels."""
    c = pred.shape[1]
    remapped = target.clone()
    remapped[remapped == c - 1] = -1
    if len(set(remapped.flatten().tolist())) < 2:
        return torch.tensor(0.0, dtype=pred.dtype)
    return F.cross_entropy(pred.float(), remapped, ignore_index=-1)


@st.composite
def loss_inputs(draw):
    """Random shapes, label mixes (a random subset of [-1, C)) and memory layouts."""
    b = draw(st.integers(1, 3))
    c = draw(st.integers(2, 6))
    h = draw(st.integers(1, 7))
    w = draw(st.integers(1, 7))
    allowed = draw(st.lists(st.integers(-1, c - 1), min_size=1, max_size=c + 1, unique=True))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    pred = torch.randn(b, c, h, w, generator=generator)
    choice = torch.randint(0, len(allowed), (b, h, w), generator=generator)
    target = torch.tensor(allowed)[choice]
    layout = draw(st.sampled_from(["contiguous", "channels_last", "transposed"]))
    if layout == "channels_last":
        pred = pred.contiguous(memory_format=torch.channels_last)
    elif layout == "transposed":
        # Non-contiguous views of both tensors: the spatial dims swapped.
        pred = pred.transpose(2, 3)
        target = target.transpose(1, 2)
    return pred, target


@pytest.mark.parametrize("variant", OPTIMIZED)
@settings(max_examples=200, deadline=None)
@given(inputs=loss_inputs())
def test_variant_equals_naive_in_value_and_gradient(variant, inputs):
    pred, target = inputs
    want_value, want_grad = value_and_grad(baseline("loss"), pred, target)
    value, grad = value_and_grad(variant, pred, target)
    torch.testing.assert_close(value, want_value)
    torch.testing.assert_close(grad, want_grad)


@settings(max_examples=100, deadline=None)
@given(inputs=loss_inputs())
def test_naive_is_the_articles_loss(inputs):
    pred, target = inputs
    value, grad = value_and_grad("naive", pred, target)
    torch.testing.assert_close(value, reference(pred, target))
    assert torch.isfinite(grad).all()


def edge_case(name: str) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    pred = torch.randn(2, 10, 6, 5, generator=generator)
    labels = torch.randint(-1, 10, (2, 6, 5), generator=generator)
    if name == "one distinct label":
        labels = torch.full_like(labels, 4)
    elif name == "only ignore and background":
        labels = torch.where(labels < 5, -1, 9)
    elif name == "all ignored":
        labels = torch.full_like(labels, -1)
    elif name == "no background":
        labels = labels.clamp(max=8)
    elif name == "batch of one":
        pred, labels = pred[:1], labels[:1]
    elif name == "channels_last":
        pred = pred.contiguous(memory_format=torch.channels_last)
    elif name == "non-contiguous":
        pred, labels = pred[:, :, ::2], labels[:, ::2]
    return pred, labels


EDGE_CASES = [
    "one distinct label",
    "only ignore and background",
    "all ignored",
    "no background",
    "batch of one",
    "channels_last",
    "non-contiguous",
]


@pytest.mark.parametrize("variant", variants("loss"))
@pytest.mark.parametrize("case", EDGE_CASES)
def test_edge_cases_match_naive_and_reference(variant, case):
    pred, target = edge_case(case)
    value, grad = value_and_grad(variant, pred, target)
    want_value, want_grad = value_and_grad("naive", pred, target)
    torch.testing.assert_close(value, want_value)
    torch.testing.assert_close(grad, want_grad)
    torch.testing.assert_close(value, reference(pred, target))
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("variant", variants("loss"))
@pytest.mark.parametrize("case", ["one distinct label", "only ignore and background", "all ignored"])
def test_zeroed_loss_is_zero_with_zero_gradient(variant, case):
    # Fewer than two distinct labels (after the background remap, -1 counted) zeroes the loss; an all-ignored
    # batch must give 0 and a zero gradient, not NaN (a plain mean over no pixels is 0/0).
    pred, target = edge_case(case)
    value, grad = value_and_grad(variant, pred, target)
    assert value.item() == 0.0
    assert not grad.any()


def test_no_background_equals_plain_cross_entropy_with_ignore_index():
    pred, target = edge_case("no background")
    value, _ = value_and_grad("naive", pred, target)
    torch.testing.assert_close(value, F.cross_entropy(pred, target, ignore_index=-1))


@pytest.mark.parametrize("variant", variants("loss"))
def test_callers_target_is_never_modified(variant):
    pred, target = edge_case("no background")
    target[0, 0, 0] = 9  # background, which the article's naive form overwrites in place
    before = target.clone()
    loss.make_loss(variant)(pred, target)
    assert torch.equal(target, before)


def test_segnet_has_the_articles_layers_and_keeps_the_image_size():
    net = loss.SegNet(num_classes=7)
    convs = [m for m in net.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 12
    assert (convs[0].in_channels, convs[0].out_channels) == (3, 10)
    assert all((m.in_channels, m.out_channels) == (10, 10) for m in convs[1:-1])
    assert (convs[-1].in_channels, convs[-1].out_channels) == (10, 7)
    assert all(m.kernel_size == (3, 3) and m.padding == "same" for m in convs)
    assert sum(isinstance(m, torch.nn.ReLU) for m in net.hidden) == 10
    assert net(torch.randn(2, 3, 9, 11)).shape == (2, 7, 9, 11)


@pytest.mark.parametrize("variant", variants("loss"))
@pytest.mark.parametrize("labels", ["random", "all ignored", "one distinct label"])
def test_training_step_leaves_finite_parameters(variant, labels):
    step = loss.make_train_step(loss.TrainConfig(variant=variant, batch=2, image_size=16))
    if labels == "all ignored":
        step.labels.fill_(-1)
    elif labels == "one distinct label":
        step.labels.fill_(3)
    before = [p.detach().clone() for p in step.model.parameters()]
    for _ in range(3):
        value = step()
    assert math.isfinite(value.item())
    assert all(torch.isfinite(p).all() for p in step.model.parameters())
    moved = any(not torch.equal(a, b) for a, b in zip(before, step.model.parameters(), strict=True))
    # Momentum SGD moves the weights unless the loss is zeroed on every step.
    assert moved == (labels == "random")


def test_training_steps_agree_across_variants():
    losses = {}
    for variant in variants("loss"):
        step = loss.make_train_step(loss.TrainConfig(variant=variant, batch=2, image_size=16, seed=3))
        losses[variant] = torch.stack([step() for _ in range(3)])
    for variant in OPTIMIZED:
        torch.testing.assert_close(losses[variant], losses["naive"])


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["naive", "ignore_index"])
def test_compiled_step_matches_eager(variant):
    config = loss.TrainConfig(variant=variant, batch=2, image_size=12, seed=5)
    eager = loss.make_train_step(config)
    compiled = loss.make_train_step(loss.TrainConfig(**{**config.__dict__, "compiled": True}))
    for _ in range(2):
        torch.testing.assert_close(compiled(), eager(), rtol=1e-4, atol=1e-5)


def test_unknown_variant_is_refused_with_the_allowed_names():
    with pytest.raises(ValueError, match=r"variant='median' is not known; allowed: naive, where, sort_count"):
        loss.make_loss("median")


@pytest.mark.parametrize(
    ("pred", "target", "error", "message"),
    [
        (torch.randn(1, 10, 4, 4), torch.zeros(1, 4, 4, dtype=torch.int32), TypeError, "target has dtype int32"),
        (torch.randn(1, 10, 4, 4), torch.zeros(1, 4, 4), TypeError, "target has dtype float32"),
        (torch.randn(1, 10, 4, 4), torch.zeros(1, 4, 5, dtype=torch.long), ValueError, r"expected \(1, 4, 4\)"),
        (torch.randn(1, 8, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long), ValueError, "num_classes=10"),
        (torch.randn(10, 4, 4), torch.zeros(1, 4, 4, dtype=torch.long), ValueError, r"expected \[B, C, H, W\]"),
        ([[0.0]], torch.zeros(1, 4, 4, dtype=torch.long), TypeError, "pred must be a torch.Tensor"),
        (
            torch.randn(1, 10, 4, 4, device="meta"),
            torch.zeros(1, 4, 4, dtype=torch.long),
            ValueError,
            "pred on meta, target on cpu",
        ),
    ],
)
def test_bad_input_gets_a_clear_error(pred, target, error, message):
    with pytest.raises(error, match=message):
        loss.make_loss("ignore_index")(pred, target)


@pytest.mark.parametrize(
    ("field", "value"), [("variant", "fast"), ("batch", 0), ("image_size", -4), ("batch", 2.5)]
)
def test_bad_train_config_is_refused(field, value):
    with pytest.raises((ValueError, TypeError), match=field):
        loss.TrainConfig(**{field: value})
