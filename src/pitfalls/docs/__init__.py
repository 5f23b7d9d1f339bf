"""The documentation's generated parts: every table that restates the registry or the committed results.

README.md and the pages under docs/ are prose with generated blocks (`pitfalls.docs.blocks`). ``python -m
pitfalls.docs --write`` fills them from the registry (families, parameters, grids, checks), the committed results
(the ladder, the calibration errors, the results index) and the GPU runs under proof/, and draws the README's
picture; ``python -m pitfalls.docs`` says what is stale and which relative link does not resolve.
"""

from pitfalls.docs.generate import Docs, pages
from pitfalls.docs.links import broken_links

__all__ = ["Docs", "broken_links", "pages"]
