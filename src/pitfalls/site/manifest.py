"""The vendored browser libraries' manifest (``vendor/MANIFEST.json``), their subresource-integrity hashes checked as
a browser checks them, and the asv template they match; ``assets`` and ``rebuild`` build on it.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from pitfalls.site.markup import external_resources

VENDOR_DIR = Path(__file__).with_name("vendor")
MANIFEST_NAME = "MANIFEST.json"

# Subresource integrity accepts these three; a browser uses only the strongest one an attribute lists.
SRI_ALGORITHMS = ("sha256", "sha384", "sha512")

REGISTRIES = ("npm", "pypi")
BUILD_TOOLS = ("copy", "uglify-js", "closure-compiler", "leading-comment")


@dataclass(frozen=True)
class Source:
    """Where a vendored file's input comes from: one member of one registry package.

    Attributes:
        registry: ``"npm"`` (fetched with ``npm pack``) or ``"pypi"`` (a source distribution, ``pip download``).
        package: the package name.
        version: the exact version.
        member: the path of the input inside the package archive.
    """

    registry: str
    package: str
    version: str
    member: str


@dataclass(frozen=True)
class Build:
    """How a vendored file is made from its source.

    Attributes:
        tool: ``"copy"`` (the bytes as they are), ``"uglify-js"`` or ``"closure-compiler"`` (the minifier the
            CDN used, at the version that reproduces the CDN's bytes), or ``"leading-comment"`` (the licence
            comment at the top of the source, for a minified file that dropped it).
        version: the tool's npm version, or None for the built-in tools.
        args: extra command-line arguments for the tool.
    """

    tool: str
    version: str | None = None
    args: tuple[str, ...] = ()


@dataclass(frozen=True)
class VendoredFile:
    """One file under ``vendor/``.

    Attributes:
        file: path relative to the vendor folder, e.g. ``"jquery/3.3.1/jquery.min.js"``.
        package: the library's name (for people; the source names the registry package).
        version: the library's version.
        integrity: subresource-integrity hash of the file's bytes, e.g. ``"sha256-..."``.
        source: where the input comes from.
        build: how the file is made from it.
        url: the CDN address asv's template loads this file from; None for support files (licences, fonts).
        note: why this file is built the way it is, when that is not obvious.
    """

    file: str
    package: str
    version: str
    integrity: str
    source: Source
    build: Build
    url: str | None = None
    note: str | None = None


def sri(data: bytes, algorithm: str = "sha384") -> str:
    """Return the subresource-integrity string of ``data``.

    Args:
        data: the bytes to hash.
        algorithm: one of sha256, sha384, sha512.

    Returns:
        ``"<algorithm>-<base64 digest>"``, as written in an ``integrity`` attribute.
    """
    if algorithm not in SRI_ALGORITHMS:
        raise ValueError(f"algorithm={algorithm!r} is not allowed; allowed: {', '.join(SRI_ALGORITHMS)}")
    digest = hashlib.new(algorithm, data).digest()
    return f"{algorithm}-{base64.b64encode(digest).decode('ascii')}"


def matches_integrity(data: bytes, integrity: str) -> bool:
    """Tell whether ``data`` satisfies an ``integrity`` attribute the way a browser decides it.

    Args:
        data: the file's bytes.
        integrity: the attribute's value: one or more ``alg-base64`` tokens separated by spaces.

    Returns:
        True if one of the tokens of the strongest algorithm listed matches the bytes.
    """
    tokens = [token.split("?", 1)[0] for token in integrity.split()]
    by_algorithm: dict[str, set[str]] = {}
    for token in tokens:
        algorithm, _, value = token.partition("-")
        if algorithm in SRI_ALGORITHMS and value:
            by_algorithm.setdefault(algorithm, set()).add(token)
    if not by_algorithm:
        raise ValueError(f"integrity={integrity!r} has no sha256/sha384/sha512 token; expected e.g. 'sha384-<base64>'")
    strongest = max(by_algorithm, key=SRI_ALGORITHMS.index)
    return sri(data, strongest) in by_algorithm[strongest]


def load_manifest(vendor_dir: Path = VENDOR_DIR) -> tuple[VendoredFile, ...]:
    """The vendored files that ``vendor_dir/MANIFEST.json`` lists, in its order."""
    path = Path(vendor_dir) / MANIFEST_NAME
    raw = json.loads(path.read_text(encoding="utf-8"))
    files = []
    for entry in raw["files"]:
        source = Source(**entry["source"])
        build = Build(**{**entry["build"], "args": tuple(entry["build"].get("args", ()))})
        if source.registry not in REGISTRIES:
            raise ValueError(f"{path}: {entry['file']} has registry={source.registry!r}; allowed: {REGISTRIES}")
        if build.tool not in BUILD_TOOLS:
            raise ValueError(f"{path}: {entry['file']} has build tool={build.tool!r}; allowed: {BUILD_TOOLS}")
        files.append(VendoredFile(**{**entry, "source": source, "build": build}))
    return tuple(files)


def asv_www_dir() -> Path:
    """Return the ``www`` folder of the installed asv (the template ``asv publish`` copies)."""
    spec = importlib.util.find_spec("asv")
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError("asv is not installed; install asv==0.6.6 (the project's [bench] extra)")
    return Path(spec.origin).parent / "www"


def template_assets() -> dict[str, str]:
    """``{url: integrity}`` of every CDN address in the HTML pages of the installed asv's template folder; an address
    without an integrity attribute maps to ``""``."""
    found: dict[str, str] = {}
    for page in sorted(asv_www_dir().glob("*.html")):
        for resource in external_resources(page.read_text(encoding="utf-8")):
            found[resource.url] = resource.integrity or ""
    return found
