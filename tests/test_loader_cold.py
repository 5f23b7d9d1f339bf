"""The loader's cache axis: a cold rung reads every file from the disk, delivers what the warm one delivers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from pitfalls.families.loader import FAMILY, datasets, steps
from pitfalls.family import SkipCase
from pitfalls.probes import pagecache

SMOKE = {**FAMILY.smoke, "model_step": False}


def delivered(variant: str, cache: str, batches: int = 2, **sizes: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    with FAMILY.build(variant, cache=cache, **{**SMOKE, **sizes}) as case:
        return [case.call.inputs() for _ in range(batches)]


@pytest.mark.parametrize("variant", ["naive", "offline"])
def test_a_cold_rung_delivers_exactly_what_its_warm_one_delivers(variant: str) -> None:
    for (cold_images, cold_masks), (warm_images, warm_masks) in zip(delivered(variant, "cold"),
                                                                    delivered(variant, "warm"), strict=True):
        assert torch.equal(cold_images, warm_images) and torch.equal(cold_masks, warm_masks)


def test_every_file_is_dropped_from_the_page_cache_just_before_it_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[tuple[str, Path]] = []
    read = datasets.read

    def spy() -> None:
        monkeypatch.setattr(datasets.pagecache, "drop", lambda path: events.append(("drop", Path(path))))
        monkeypatch.setattr(datasets, "read",
                            lambda path, *rest: (events.append(("read", Path(path))), read(path, *rest))[1])

    for cache in ("cold", "warm"):
        with FAMILY.build("offline", cache=cache, **SMOKE) as case:
            spy()  # once built: the build checks, with the real drop, that dropping works here
            case.call.inputs()
        monkeypatch.undo()
        reads = [path for kind, path in events if kind == "read"]
        assert len(reads) == 2 * SMOKE["batch"]  # an image and a mask per item
        if cache == "cold":
            assert events == [event for path in reads for event in (("drop", path), ("read", path))]
        else:
            assert all(kind == "read" for kind, _ in events)
        events.clear()


def test_a_dropped_file_leaves_the_page_cache_here() -> None:
    with FAMILY.build("offline", cache="cold", **SMOKE) as case:
        files = case.call.loader.dataset.files
        path = files.image(0)
        path.read_bytes()
        pagecache.drop(path)
        assert pagecache.resident_pages(path)[0] == 0


@pytest.mark.parametrize("variant", ["ram_encoded", "ram_decoded", "uint8", "floor"])
def test_cold_applies_only_to_the_rungs_that_read_files(variant: str) -> None:
    with pytest.raises(SkipCase, match="cache='cold' applies to the rungs that read files"):
        FAMILY.build(variant, cache="cold", **SMOKE)


def test_a_drop_that_does_not_take_is_a_skip_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pagecache, "drop", lambda path: None)
    with pytest.raises(SkipCase, match="a cold read cannot be made here"):
        steps.make_step("offline", torch.device("cpu"), FAMILY.resolve({**SMOKE, "cache": "cold"}))


def test_a_bad_cache_value_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="warm, cold|'warm', 'cold'"):
        FAMILY.resolve({**SMOKE, "cache": "lukewarm"})
