"""The layers table of docs/layout.md, from the import-linter contract in pyproject.toml that holds them."""

from __future__ import annotations

from pathlib import Path

from pitfalls.markdown import code, table

__all__ = ["layer_lines"]


def layer_lines(pyproject: Path) -> list[str]:
    """The layers of the contract with id "layers", from the bottom: one line per layer, its modules.

    Raises:
        ValueError: the file holds no such contract.
    """
    # import-linter reads its own configuration (TOML on every Python the suite supports); it is a test
    # dependency, as the docs' generation is a checkout's tool.
    from importlinter.api import read_configuration

    contracts = read_configuration(str(pyproject))["contracts_options"]
    found = [c for c in contracts if c.get("id") == "layers"]
    if not found:
        raise ValueError(f"{pyproject}: no import-linter contract with id 'layers'")
    layers = list(reversed(found[0]["layers"]))
    body = [[str(number), ", ".join(code(name.strip()) for name in layer.split(":"))]
            for number, layer in enumerate(layers, start=1)]
    return table(("layer, from the bottom", "modules and packages of `pitfalls`"), body)
