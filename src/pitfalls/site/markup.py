"""Find the resources an HTML page makes the browser fetch, with their exact place in the text."""

from __future__ import annotations

from dataclasses import dataclass
from html.parser import HTMLParser

# Tags whose attribute makes the browser fetch something as the page loads. Anchors (<a href>) are left out on
# purpose: a link is only followed when someone clicks it, so it needs no network to render the page.
FETCHING_ATTRIBUTES: dict[str, str] = {"script": "src", "link": "href", "img": "src", "iframe": "src", "source": "src",
                                       "embed": "src", "audio": "src", "video": "src", "track": "src", "object": "data"}


@dataclass(frozen=True)
class Resource:
    """One fetched resource of a page.

    Attributes:
        tag: the element's name, e.g. ``"script"``.
        attribute: the attribute holding the address (``"src"``, ``"href"``, ``"data"``).
        url: the address as written in the page.
        integrity: the element's ``integrity`` attribute (subresource integrity), or None.
        start: offset of the element's start tag in the page text.
        end: offset just past the start tag.
    """

    tag: str
    attribute: str
    url: str
    integrity: str | None
    start: int
    end: int

    @property
    def external(self) -> bool:
        """True when the address points off the serving host (http, https or protocol-relative)."""
        lowered = self.url.strip().lower()
        return lowered.startswith(("http://", "https://", "//"))


class _Collector(HTMLParser):
    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.resources: list[Resource] = []
        # getpos() gives (line, column); offsets of line starts turn it into an index into the text.
        self._line_starts = [0, *(index + 1 for index, char in enumerate(text) if char == "\n")]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attribute = FETCHING_ATTRIBUTES.get(tag)
        if attribute is None:
            return
        values = dict(attrs)
        url = values.get(attribute)
        if not url:
            return
        line, column = self.getpos()
        start = self._line_starts[line - 1] + column
        raw = self.get_starttag_text() or ""
        self.resources.append(Resource(tag, attribute, url, values.get("integrity"), start, start + len(raw)))

    handle_startendtag = handle_starttag


def resources(text: str) -> tuple[Resource, ...]:
    """The resources, local and external, that ``text`` (an HTML page) makes the browser fetch, in document order."""
    if not isinstance(text, str):
        raise TypeError(f"text must be a str of HTML, got {type(text).__name__}")
    collector = _Collector(text)
    collector.feed(text)
    collector.close()
    return tuple(collector.resources)


def external_resources(text: str) -> tuple[Resource, ...]:
    """List only the resources of ``text`` that would be fetched from another host."""
    return tuple(resource for resource in resources(text) if resource.external)


def replace_url(text: str, resource: Resource, new_url: str) -> str:
    """Return ``text`` with ``resource``'s address replaced by ``new_url``, every other byte kept.

    Args:
        text: the page the resource was found in (unchanged since).
        resource: a resource returned by :func:`resources` for this very text.
        new_url: the address to write instead.

    Returns:
        The new page text.
    """
    tag_text = text[resource.start : resource.end]
    if resource.url not in tag_text:
        raise ValueError(f"resource {resource.url!r} is not at offset {resource.start} of the text; "
                         "pass the text the resource was found in")
    return text[: resource.start] + tag_text.replace(resource.url, new_url, 1) + text[resource.end :]
