"""The one registry of pitfall families and their variants; it feeds the asv params, the tests and the CLI."""

from __future__ import annotations

from dataclasses import dataclass

from pitfalls.families import loss, sampler
from pitfalls._checks import check_choice


@dataclass(frozen=True)
class Family:
    """A pitfall family: its variants in registry order, the naive one first."""

    name: str
    variants: tuple[str, ...]
    article: str
    summary: str

    @property
    def baseline(self) -> str:
        return self.variants[0]


FAMILIES: dict[str, Family] = {
    "loss": Family(
        "loss",
        tuple(loss.VARIANTS),
        "000",
        "masked cross-entropy: nonzero, unique and boolean masks sync the host with the device",
    ),
    "sampler": Family(
        "sampler",
        tuple(sampler.VARIANTS),
        "004",
        "balanced sampler: nonzero (dynamic shapes) vs count_nonzero/topk/gather (static shapes)",
    ),
}


def families() -> tuple[str, ...]:
    """Return the family names."""
    return tuple(FAMILIES)


def family(name: str) -> Family:
    """Return one family, or raise ValueError listing the known ones."""
    return FAMILIES[check_choice("family", name, FAMILIES)]


def variants(name: str) -> tuple[str, ...]:
    """Return the variant names of a family, the naive one first."""
    return family(name).variants


def baseline(name: str) -> str:
    """Return the name of a family's naive variant, the one every other is compared with."""
    return family(name).baseline


def check_variant(family_name: str, variant: str) -> str:
    """Return ``variant`` if the family has it, else raise ValueError listing the family's variants."""
    return check_choice(f"{family_name} variant", variant, variants(family_name))
