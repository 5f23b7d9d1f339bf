"""Rebuild the vendored browser libraries from their registry packages (`pitfalls.site.manifest` says how each is
built), and verify them against the manifest's and asv's template's hashes before writing.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

from pitfalls.site import manifest
from pitfalls.site.manifest import VENDOR_DIR, Build, Source, VendoredFile


class _Workshop:
    """Fetches registry packages and minifier tools into one scratch folder, each at most once."""

    def __init__(self, root: Path, log: Callable[[str], None]) -> None:
        self.root = root
        self.log = log
        self._archives: dict[tuple[str, str, str], Path] = {}
        self._tools: dict[tuple[str, str], Path] = {}

    def _run(self, command: list[str], cwd: Path) -> str:
        self.log("$ " + " ".join(command))
        done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed with exit code {done.returncode}:\n{done.stderr.strip()}")
        return done.stdout

    def archive(self, source: Source) -> Path:
        key = (source.registry, source.package, source.version)
        if key not in self._archives:
            folder = self.root / "archives" / f"{source.registry}-{source.package}-{source.version}"
            folder.mkdir(parents=True)
            if source.registry == "npm":
                name = self._run([_need("npm"), "pack", f"{source.package}@{source.version}"], folder)
                path = folder / name.strip().splitlines()[-1]
            else:
                self._run([sys.executable, "-m", "pip", "download", f"{source.package}=={source.version}",
                           "--no-deps", "--no-binary", ":all:", "--dest", str(folder)], folder)
                found = sorted(folder.glob("*.tar.gz"))
                if not found:
                    raise FileNotFoundError(f"pip download {source.package}=={source.version} gave no source archive")
                path = found[0]
            self._archives[key] = path
        return self._archives[key]

    def read(self, source: Source) -> bytes:
        with tarfile.open(self.archive(source)) as archive:
            member = archive.extractfile(source.member)
            if member is None:
                raise FileNotFoundError(f"{source.member} is not a file in {source.package} {source.version}")
            return member.read()

    def tool(self, build: Build) -> Path:
        key = (build.tool, build.version or "")
        if key not in self._tools:
            folder = self.root / "tools" / f"{build.tool}-{build.version}"
            folder.mkdir(parents=True)
            if build.tool == "uglify-js":
                self._run([_need("npm"), "install", "--no-audit", "--no-fund", "--prefix", str(folder),
                           f"uglify-js@{build.version}"], folder)
                self._tools[key] = folder / "node_modules" / "uglify-js" / "bin" / "uglifyjs"
            else:
                jar_source = Source("npm", "google-closure-compiler", build.version or "", "package/compiler.jar")
                jar = folder / "compiler.jar"
                jar.write_bytes(self.read(jar_source))
                self._tools[key] = jar
        return self._tools[key]

    def make(self, item: VendoredFile) -> bytes:
        data = self.read(item.source)
        build = item.build
        if build.tool == "copy":
            return data
        if build.tool == "leading-comment":
            return _leading_comment(data, item.source.member)
        scratch = self.root / "build" / item.file
        scratch.mkdir(parents=True)
        source_path = scratch / Path(item.source.member).name
        source_path.write_bytes(data)
        output = scratch / "out.js"
        tool = self.tool(build)
        if build.tool == "uglify-js":
            command = [_need("node"), str(tool), str(source_path), *build.args, "-o", str(output)]
        else:
            command = [_need("java"), "-jar", str(tool), *build.args, "--js", str(source_path), "--js_output_file",
                       str(output)]
        self._run(command, scratch)
        return output.read_bytes()


def _need(program: str) -> str:
    path = shutil.which(program)
    if path is None:
        raise FileNotFoundError(f"{program} is needed to rebuild the vendored files but is not on PATH "
                                "(Debian: apt-get install nodejs npm default-jre-headless)")
    return path


def _leading_comment(data: bytes, member: str) -> bytes:
    """Return the body of the first /* ... */ comment, one line per line, without the comment markers."""
    text = data.decode("utf-8")
    start = text.find("/*")
    end = text.find("*/", start + 2)
    if start < 0 or end < 0:
        raise ValueError(f"{member} has no leading /* ... */ comment to take a licence from")
    lines = [line.rstrip() for line in text[start + 2 : end].strip("\n").splitlines()]
    return ("\n".join(lines).strip("\n") + "\n").encode("utf-8")


def refresh(dest: Path | None = None, log: Callable[[str], None] = print) -> list[Path]:
    """Rebuild every vendored file from its registry package and verify it before writing anything.

    Needs the npm registry and PyPI, plus ``npm``, ``node`` and ``java`` on PATH.

    Args:
        dest: where to write the rebuilt files (and a copy of the manifest); defaults to the package's vendor
            folder.
        log: receives one line per step.

    Returns:
        The paths written.

    Raises:
        RuntimeError: a rebuilt file does not match its hash, or the template pins another hash; nothing is
            written then.
    """
    dest = VENDOR_DIR if dest is None else Path(dest)
    template = manifest.template_assets()
    files = manifest.load_manifest()
    built: dict[str, bytes] = {}
    problems = []
    with tempfile.TemporaryDirectory(prefix="pitfalls-vendor-") as scratch:
        workshop = _Workshop(Path(scratch), log)
        for item in files:
            data = workshop.make(item)
            if not manifest.matches_integrity(data, item.integrity):
                problems.append(f"{item.file}: rebuilt from {item.source.registry} {item.source.package} "
                                f"{item.source.version} ({item.build.tool}) gives "
                                f"{manifest.sri(data, item.integrity.split('-')[0])}, not {item.integrity}")
            if item.url is not None and template.get(item.url) != item.integrity:
                problems.append(f"{item.file}: asv's template pins {item.url} to {template.get(item.url)!r}, "
                                f"not {item.integrity!r}")
            built[item.file] = data
            log(f"ok {item.file} ({len(data)} bytes) matches {item.integrity[:20]}...")
    if problems:
        raise RuntimeError("refresh found mismatches; nothing was written:\n" + "\n".join(problems))
    written = []
    for name, data in built.items():
        path = dest / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        written.append(path)
    if dest.resolve() != VENDOR_DIR.resolve():
        shutil.copyfile(VENDOR_DIR / manifest.MANIFEST_NAME, dest / manifest.MANIFEST_NAME)
    return written
