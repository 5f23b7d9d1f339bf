"""Make asv's published site self-contained: vendored libraries instead of CDN addresses, hashes kept.

``python -m pitfalls.site.localize [asv publish arguments]`` publishes and localizes; :func:`publish` localizes a
folder ``asv publish`` already wrote.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pitfalls.site import assets
from pitfalls.site.manifest import load_manifest
from pitfalls.site.markup import external_resources, replace_url

VENDOR_FOLDER = "vendor"


@dataclass(frozen=True)
class PublishReport:
    """What :func:`publish` did.

    Attributes:
        rewritten: ``(page, cdn_url, local_url)`` for every address replaced by this call; empty on a re-run.
        vendored: number of files copied into ``html_dir/vendor`` (libraries, licences, fonts, manifest).
    """

    rewritten: tuple[tuple[str, str, str], ...]
    vendored: int


def _site_dir(html_dir: str | os.PathLike[str]) -> Path:
    if not isinstance(html_dir, (str, os.PathLike)):
        raise TypeError(f"html_dir must be a path (str or os.PathLike), got {type(html_dir).__name__}")
    path = Path(html_dir)
    if not (path / "index.html").is_file():
        raise ValueError(f"html_dir={str(path)!r} has no index.html; pass the folder `asv publish` wrote "
                         "(asv.conf.json's html_dir, 'html' by default)")
    return path


def publish(html_dir: str | os.PathLike[str]) -> PublishReport:
    """Localize a site written by ``asv publish`` so it renders with no network (docs/asv.md); running it again
    changes nothing.

    Args:
        html_dir: the folder ``asv publish`` wrote (it holds index.html).

    Returns:
        What was done.

    Raises:
        ValueError: ``html_dir`` holds no index.html, or a page loads an address with no vendored copy, or pins a
            hash the vendored copy does not have; nothing is changed then.
    """
    site = _site_dir(html_dir)
    by_url = {item.url: item for item in load_manifest() if item.url is not None}
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
                problems.append(f"{name}: <{resource.tag} {resource.attribute}={resource.url!r}> has no vendored copy; "
                                "add it to pitfalls/site/vendor/MANIFEST.json and run python -m pitfalls.site.assets "
                                "--refresh")
                continue
            if resource.integrity is not None and resource.integrity != item.integrity:
                problems.append(f"{name}: {resource.url} is pinned to {resource.integrity!r} but the vendored "
                                f"{item.file} has {item.integrity!r}; the browser would refuse it")
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
    return PublishReport(rewritten=tuple(reversed(rewritten)), vendored=len(copied) + 1)


def _publish_arguments(asv_args: list[str]) -> tuple[Path, list[str]]:
    """Split ``asv publish`` arguments into the site folder and the other arguments.

    The folder is found the way asv itself reads its arguments and configuration; the other arguments keep the
    configuration file, so asv reads the same one.
    """
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--html-dir", "-o", default=None)
    parser.add_argument("--config", default="asv.conf.json")
    known, rest = parser.parse_known_args(asv_args)
    # asv changes into the config file's folder before it writes, so a relative html_dir (from the command
    # line or the config) is relative to that folder.
    base = Path(known.config).resolve().parent
    if known.html_dir is not None:
        html_dir = base / known.html_dir
    else:
        from asv.config import Config  # asv's own loader: it accepts the comments asv.conf.json may hold

        html_dir = base / Config.load(known.config).html_dir
    return html_dir, ["--config", known.config, *rest]


def replace_contents(source: Path, target: Path) -> None:
    """Make ``target`` hold exactly what ``source`` holds, emptying ``source``; ``target`` itself is kept.

    The folder is never removed, only its contents, so it can be a mount point (a container's volume) or the
    folder a server is serving.

    Args:
        source: a complete site.
        target: the site folder; made if missing.
    """
    target.mkdir(parents=True, exist_ok=True)
    for old in target.iterdir():
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    for new in source.iterdir():
        shutil.move(str(new), str(target / new.name))


def main(argv: Iterable[str] | None = None) -> int:
    """Run ``asv publish`` with the given arguments, make the site self-contained, then put it in the site folder.

    asv deletes and recreates the folder it writes, which fails when that folder is a mount point (``Device or
    resource busy``), so it writes into a temporary folder instead, and only a complete, localized site replaces
    the contents of the site folder.
    """
    asv_args = list(sys.argv[1:] if argv is None else argv)
    if any(arg in ("-h", "--help") for arg in asv_args):
        print(
            "usage: python -m pitfalls.site.localize [asv publish arguments]\n\n"
            "Runs `asv publish` with these arguments into a temporary folder, copies the vendored JavaScript/CSS\n"
            "into its vendor/ folder and rewrites every CDN address to it, so the site renders with no network,\n"
            "then replaces the contents of the site folder (asv.conf.json's html_dir, or --html-dir) with it.\n"
            "View it with: python -m pitfalls.site.server HTML_DIR"
        )
        return 0
    html_dir, other_args = _publish_arguments(asv_args)
    with tempfile.TemporaryDirectory(prefix="pitfalls-site-") as scratch:
        staging = Path(scratch) / "html"
        command = [sys.executable, "-m", "asv", "publish", *other_args, "--html-dir", str(staging)]
        done = subprocess.run(command, check=False)
        if done.returncode != 0:
            print(f"asv publish failed with exit code {done.returncode}; {html_dir} was left as it was",
                  file=sys.stderr)
            return done.returncode
        report = publish(staging)
        replace_contents(staging, html_dir)
    print(f"published {html_dir}: {len(report.rewritten)} CDN addresses now point to {VENDOR_FOLDER}/ "
          f"({report.vendored} files); no page loads anything from another host")
    return 0


if __name__ == "__main__":
    sys.exit(main())
