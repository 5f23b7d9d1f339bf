"""The checkout the package runs from, for the tools that need one: the asv suite, its results, its git history.

``pitfalls check``, ``probe``, ``calibrate``, ``scan``, ``scan-loader`` and ``doctor`` work from an installed wheel;
the series guard, the suite's description, the docs' generator and the budgeted GPU run read the checkout's files
and say so in one line when the package was installed without one.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["ROOT", "NoCheckout", "require_checkout"]

# src/pitfalls/checkout.py -> the checkout (an editable install or a run from the source tree).
ROOT = Path(__file__).resolve().parents[2]


class NoCheckout(RuntimeError):
    """The package is installed without its checkout."""


def require_checkout(tool: str) -> Path:
    """The checkout holding this package, or `NoCheckout` naming ``tool`` and what it needs.

    Args:
        tool: the command that needs it, as the user typed it.

    Returns:
        The checkout's root folder.
    """
    if (ROOT / "asv.conf.json").is_file() and (ROOT / "benchmarks").is_dir():
        return ROOT
    raise NoCheckout(f"{tool} works in a checkout of the suite (asv.conf.json, benchmarks/, results/), and this "
                     f"package is installed without one ({Path(__file__).parent}): run it from a clone of the "
                     "repository")
