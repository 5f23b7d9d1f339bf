"""The browser libraries asv's site loads from CDNs, vendored with their integrity hashes, checked and rebuilt.

``python -m pitfalls.site.assets --check`` (against the manifest and the installed asv's template) or ``--refresh``
(rebuilt from npm and PyPI): docs/asv.md, "Publishing and viewing offline".
"""

from __future__ import annotations

import argparse
import shutil
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from pitfalls.site import manifest
from pitfalls.site.manifest import VENDOR_DIR, VendoredFile, load_manifest

__all__ = ["check", "copy_to", "main"]


def check(vendor_dir: Path = VENDOR_DIR, template: Mapping[str, str] | None = None) -> list[str]:
    """Verify the vendored files: their bytes, and their match with the asv template's addresses and hashes.

    Args:
        vendor_dir: the folder holding the files and MANIFEST.json.
        template: ``{url: integrity}`` of the template; by default read from the installed asv.

    Returns:
        One line per problem, each naming the file or address; empty when everything matches.
    """
    vendor_dir = Path(vendor_dir)
    template = manifest.template_assets() if template is None else template
    problems = []
    files = load_manifest(vendor_dir)
    for item in files:
        path = vendor_dir / item.file
        if not path.is_file():
            problems.append(f"{item.file}: missing from {vendor_dir}")
        elif not manifest.matches_integrity(path.read_bytes(), item.integrity):
            problems.append(f"{item.file} ({item.package} {item.version}): bytes do not match {item.integrity}")
        if item.url is not None:
            wanted = template.get(item.url)
            if wanted is None:
                problems.append(f"{item.file}: {item.url} is no longer loaded by asv's template (asv upgraded?); "
                                "update MANIFEST.json")
            elif wanted != item.integrity:
                problems.append(f"{item.file}: asv's template pins {item.url} to {wanted!r}, the manifest has "
                                f"{item.integrity!r}; update MANIFEST.json and run --refresh")
    vendored_urls = {item.url for item in files}
    for url in sorted(set(template) - vendored_urls):
        problems.append(f"{url}: loaded by asv's template but not vendored; add it to MANIFEST.json")
    return problems


def copy_to(target: Path) -> tuple[VendoredFile, ...]:
    """Copy the vendored files and their manifest into ``target`` (made if missing), verifying each file's hash on the
    way; returns the files copied."""
    target = Path(target)
    files = load_manifest()
    for item in files:
        data = (VENDOR_DIR / item.file).read_bytes()
        if not manifest.matches_integrity(data, item.integrity):
            raise RuntimeError(f"vendored {item.file} does not match {item.integrity}; the package's copy is damaged "
                               "(python -m pitfalls.site.assets --refresh rebuilds it)")
        path = target / item.file
        path.parent.mkdir(parents=True, exist_ok=True)
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
    shutil.copyfile(VENDOR_DIR / manifest.MANIFEST_NAME, target / manifest.MANIFEST_NAME)
    return files


def main(argv: Iterable[str] | None = None) -> int:
    """Command line: ``--check`` (default) verifies the vendored files, ``--refresh`` rebuilds them."""
    parser = argparse.ArgumentParser(prog="python -m pitfalls.site.assets", description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--check", action="store_true", help="verify the committed files (default; no network)")
    action.add_argument("--refresh", action="store_true",
                        help="rebuild every file from npm/PyPI, verify it, then write it")
    parser.add_argument("--dest", type=Path, default=None,
                        help="with --refresh: write there instead of the package's vendor folder")
    args = parser.parse_args(None if argv is None else list(argv))
    if args.refresh:
        from pitfalls.site.rebuild import refresh  # only this path needs npm, node, java and the network

        written = refresh(dest=args.dest)
        print(f"rebuilt and verified {len(written)} files into {args.dest or VENDOR_DIR}")
        return 0
    problems = check()
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        return 1
    count = len(load_manifest())
    print(f"{count} vendored files match their hashes and the template of asv at {manifest.asv_www_dir()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
