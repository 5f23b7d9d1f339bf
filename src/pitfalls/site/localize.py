"""Make asv's published site self-contained: vendored libraries instead of CDN addresses, hashes kept.

``python -m pitfalls.site.localize [asv publish arguments]`` runs ``asv publish`` and then localizes the folder
it wrote; :func:`publish` localizes a folder ``asv publish`` already wrote.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pitfalls.site import assets
from pitfalls.site.markup import external_resources, replace_url

VENDOR_FOLDER = "vendor"


@dataclass(frozen=True)
class PublishReport:
    """What :func:`publish` did.

    Attributes:
        html_dir: the site folder.
        pages: the HTML pages looked at, relative to ``html_dir``.
        rewritten: ``(page, cdn_url, local_url)`` for every address replaced by this call; empty on a re-run.
        vendored: number of files copied into ``html_dir/vendor`` (libraries, licences, fonts, manifest).
    """

    html_dir: Path
    pages: tuple[str, ...]
    rewritten: tuple[tuple[str, str, str], ...]
    vendored: int


def _site_dir(html_dir: str | os.PathLike[str]) -> Path:
    if not isinstance(html_dir, (str, os.PathLike)):
        raise TypeError(f"html_dir must be a path (str or os.PathLike), got {type(html_dir).__name__}")
    path = Path(html_dir)
    if not (path / "index.html").is_file():
        raise ValueError(
            f"html_dir={str(path)!r} has no index.html; pass the folder `asv publish` wrote "
            "(asv.conf.json's html_dir, 'html' by default)"
        )
    return path


def publish(html_dir: str | os.PathLike[str]) -> PublishReport:
    """Localize a site written by ``asv publish`` so it renders with no network.

    Copies the vendored libraries into ``html_dir/vendor/`` and points every CDN ``<script src>`` and
    ``<link href>`` of every page at the local copy. The ``integrity`` attributes stay: the local bytes are the
    bytes they pin. Running it again changes nothing.

    Args:
        html_dir: the folder ``asv publish`` wrote (it holds index.html).

    Returns:
        What was done.

    Raises:
        ValueError: ``html_dir`` holds no index.html, or a page loads an address with no vendored copy, or pins a
            hash the vendored copy does not have; nothing is changed then.
    """
    site = _site_dir(html_dir)
    by_url = {item.url: item for item in assets.load_manifest() if item.url is not None}
    pages = sorted(path for path in site.rglob("*.html") if VENDOR_FOLDER not in path.relative_to(site).parts[:1])
    # Plan every change first, so a page we cannot localize leaves the whole folder untouched.
    plans: list[tuple[Path, str]] = []
    rewritten: list[tuple[str, str, str]] = []
    problems: list[str] = []
    for page in pages:
        name = page.relative_to(site).as_posix()
        text = page.read_text(encoding="utf-8")
        new_text = text
        # From the end backwards, so earlier offsets stay valid while later tags are rewritten.
        for resource in reversed(external_resources(text)):
            item = by_url.get(resource.url)
            if item is None:
                problems.append(
                    f"{name}: <{resource.tag} {resource.attribute}={resource.url!r}> has no vendored copy; "
                    "add it to pitfalls/site/vendor/MANIFEST.json and run python -m pitfalls.site.assets --refresh"
                )
                continue
            if resource.integrity is not None and resource.integrity != item.integrity:
                problems.append(
                    f"{name}: {resource.url} is pinned to {resource.integrity!r} but the vendored "
                    f"{item.file} has {item.integrity!r}; the browser would refuse it"
                )
                continue
            local = os.path.relpath(site / VENDOR_FOLDER / item.file, page.parent).replace(os.sep, "/")
            new_text = replace_url(new_text, resource, local)
            rewritten.append((name, resource.url, local))
        if new_text != text:
            plans.append((page, new_text))
    if problems:
        raise ValueError(f"cannot make the site in {str(site)!r} self-contained:\n" + "\n".join(problems))
    copied = assets.copy_to(site / VENDOR_FOLDER)
    for page, new_text in plans:
        page.write_text(new_text, encoding="utf-8")
    return PublishReport(
        html_dir=site,
        pages=tuple(page.relative_to(site).as_posix() for page in pages),
        rewritten=tuple(reversed(rewritten)),
        vendored=len(copied) + 1,
    )


def _asv_html_dir(asv_args: list[str]) -> Path:
    """Find the folder ``asv publish`` writes, the way asv itself reads its arguments and configuration."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--html-dir", "-o", default=None)
    parser.add_argument("--config", default="asv.conf.json")
    known, _ = parser.parse_known_args(asv_args)
    # asv changes into the config file's folder before it writes, so a relative html_dir (from the command
    # line or the config) is relative to that folder.
    base = Path(known.config).resolve().parent
    if known.html_dir is not None:
        return base / known.html_dir
    from asv.config import Config  # asv's own loader: it accepts the comments asv.conf.json may hold

    return base / Config.load(known.config).html_dir


def main(argv: Iterable[str] | None = None) -> int:
    """Run ``asv publish`` with the given arguments, then make the site it wrote self-contained."""
    asv_args = list(sys.argv[1:] if argv is None else argv)
    if any(arg in ("-h", "--help") for arg in asv_args):
        print(
            "usage: python -m pitfalls.site.localize [asv publish arguments]\n\n"
            "Runs `asv publish` with these arguments, then copies the vendored JavaScript/CSS into the site's\n"
            "vendor/ folder and rewrites every CDN address to it, so the site renders with no network.\n"
            "View it with: python -m pitfalls.site.server HTML_DIR"
        )
        return 0
    done = subprocess.run([sys.executable, "-m", "asv", "publish", *asv_args], check=False)
    if done.returncode != 0:
        print(f"asv publish failed with exit code {done.returncode}; the site was not localized", file=sys.stderr)
        return done.returncode
    report = publish(_asv_html_dir(asv_args))
    print(
        f"localized {report.html_dir}: {len(report.rewritten)} CDN addresses now point to "
        f"{VENDOR_FOLDER}/ ({report.vendored} files); no page loads anything from another host"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
