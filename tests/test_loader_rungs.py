"""One change per rung: where the JPEG is decoded is the only difference between host_decode and gpu_decode,
pinning is an axis no rung switches, and naive resizes from the article's 4x."""

from __future__ import annotations

import pytest
import torch

import pitfalls.families.loader.device
import pitfalls.families.loader.equivalence  # noqa: F401 - loader.<module> below
from pitfalls.families import loader
from pitfalls.families.loader.data import CACHE_ENV
from pitfalls.family import SkipCase

CPU = torch.device("cpu")
FAMILY = loader.FAMILY


@pytest.fixture(autouse=True)
def data_cache(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))


def test_host_decode_ships_uint8_decoded_in_the_workers_and_matches_naive():
    params = FAMILY.resolve({**FAMILY.smoke, "image_format": "jpeg", "num_workers": 1})
    step = loader.make_step("host_decode", CPU, params)
    try:
        images, masks = step.next_batch()
    finally:
        step.close()
    assert images.dtype == torch.uint8 and images.shape == (4, 3, 32, 32) and masks.dtype == torch.uint8
    row = FAMILY.compare("host_decode")
    assert row.matches and "png not run" in row.detail, row


def test_host_decode_and_gpu_decode_read_the_same_bytes_and_decode_them_alike():
    params = FAMILY.resolve({**FAMILY.smoke, "image_format": "jpeg"})
    host = loader.equivalence.delivered("host_decode", CPU, params)
    device = loader.equivalence.delivered("gpu_decode", CPU, params, decoder=loader.device.opencv_decoder(CPU))
    for (h_images, h_masks), (d_images, d_masks) in zip(host, device, strict=True):
        assert torch.equal(h_masks, d_masks)
        assert torch.allclose(h_images, d_images, atol=1e-5)


def test_host_decode_needs_jpeg():
    with pytest.raises(SkipCase, match="host_decode decodes JPEG"):
        FAMILY.build("host_decode", **FAMILY.smoke)


def test_no_rung_pins_unless_asked_and_naive_resizes_from_four_times():
    resolved = FAMILY.resolve({})
    assert resolved["pin_memory"] is False and resolved["source_scale"] == 4
    assert "pin_memory" in FAMILY.grids["full"]
