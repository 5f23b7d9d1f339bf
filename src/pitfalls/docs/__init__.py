"""The documentation's generated parts: every table that restates the registry or the committed results.

``python -m pitfalls.docs --write`` fills the pages' generated blocks and draws the README's picture; ``python -m
pitfalls.docs`` says what is stale and which relative link does not resolve (docs/testing.md).
"""

from pitfalls.docs.generate import Docs, pages
from pitfalls.docs.links import broken_links

__all__ = ["Docs", "broken_links", "pages"]
