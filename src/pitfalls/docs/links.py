"""Every relative link of the Markdown pages must resolve: to a file or folder of the repository, and an
``#anchor`` to a heading of the page it points at (as a code host makes heading anchors)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import unquote

__all__ = ["anchors", "broken_links", "links"]

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"`+[^`]*`+")
# [text](target) and ![alt](target); the target ends at whitespace (a title may follow) or the closing paren.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def _unfenced(text: str) -> Iterable[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        elif not fenced:
            yield number, line


def links(text: str) -> list[tuple[int, str]]:
    """(line number, target) of every inline link and image of a page, outside code."""
    return [(number, match.group(1)) for number, line in _unfenced(text)
            for match in _LINK.finditer(_INLINE_CODE.sub("", line))]


def _slug(heading: str) -> str:
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors by its text
    text = re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower())
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors of a page's headings, numbered as a code host numbers repeats (``-1``, ``-2``)."""
    seen: dict[str, int] = {}
    found = set()
    for _, line in _unfenced(text):
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = _slug(match.group(1))
        found.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(root: Path, pages: Iterable[Path]) -> list[str]:
    """One line per relative link that does not resolve: ``page:line: target (why)``.

    Args:
        root: the repository's root; a link may not leave it.
        pages: the Markdown pages, as paths under ``root``.
    """
    broken = []
    top = root.resolve()
    for page in pages:
        text = page.read_text(encoding="utf-8")
        for number, target in links(text):
            if _EXTERNAL.match(target):
                continue
            path_part, _, anchor = target.partition("#")
            where = (page.parent / unquote(path_part)).resolve() if path_part else page.resolve()
            said = f"{page.relative_to(root)}:{number}: {target}"
            if where != top and top not in where.parents:
                broken.append(f"{said} (outside the repository)")
            elif not where.exists():
                broken.append(f"{said} (no such file)")
            elif anchor and where.suffix == ".md" and anchor not in anchors(where.read_text(encoding="utf-8")):
                broken.append(f"{said} (no heading with that anchor)")
    return broken
