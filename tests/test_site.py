"""asv's published site: vendored libraries, localization, loopback server, and an offline browser check."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import site_browser as browser
from site_browser import serving

from pitfalls.site import assets, localize, manifest, rebuild
from pitfalls.site.localize import VENDOR_FOLDER, publish
from pitfalls.site.markup import external_resources, replace_url, resources
from pitfalls.site.server import check_loopback, make_server

# asv's error.html says "One or more external (JavaScript) dependencies ... failed to load".
FAILED_TO_LOAD = "failed to load"


def _template_site(target: Path) -> Path:
    """Copy the installed asv's page templates into ``target``: a site as `asv publish` writes it, minus data."""
    target.mkdir(parents=True, exist_ok=True)
    for page in manifest.asv_www_dir().glob("*.html"):
        shutil.copy(page, target / page.name)
    return target


# --- subresource integrity ----------------------------------------------------------------------------------


def test_sri_matches_the_browsers_format():
    data = b"alert(1)"
    token = manifest.sri(data, "sha256")
    assert token.startswith("sha256-") and token.endswith("=")
    assert manifest.matches_integrity(data, token)
    assert not manifest.matches_integrity(data + b" ", token)


def test_integrity_uses_only_the_strongest_algorithm_listed():
    data = b"x"
    good_256, bad_512 = manifest.sri(data, "sha256"), manifest.sri(b"other", "sha512")
    # A browser ignores the weaker sha256 when a sha512 is given: the mismatching sha512 decides.
    assert not manifest.matches_integrity(data, f"{good_256} {bad_512}")
    assert manifest.matches_integrity(data, f"{bad_512} {manifest.sri(data, 'sha512')}")


def test_bad_integrity_and_algorithm_are_refused():
    with pytest.raises(ValueError, match="integrity='md5-abc'"):
        manifest.matches_integrity(b"x", "md5-abc")
    with pytest.raises(ValueError, match="algorithm='md5'"):
        manifest.sri(b"x", "md5")


# --- vendored files against the installed asv ---------------------------------------------------------------


def test_every_cdn_asset_of_the_installed_asv_is_vendored_with_its_exact_bytes():
    template = manifest.template_assets()
    assert len(template) == 10, f"asv's template loads {len(template)} CDN files: {sorted(template)}"
    by_url = {item.url: item for item in manifest.load_manifest() if item.url}
    assert set(by_url) == set(template)
    for url, integrity in template.items():
        item = by_url[url]
        data = (manifest.VENDOR_DIR / item.file).read_bytes()
        assert manifest.matches_integrity(data, integrity), f"{item.file} does not match {url}'s {integrity}"


def test_check_passes_on_the_committed_files():
    assert assets.check() == []
    assert assets.main(["--check"]) == 0


def test_check_names_a_damaged_file(tmp_path):
    vendor = tmp_path / "vendor"
    shutil.copytree(manifest.VENDOR_DIR, vendor)
    (vendor / "jquery/3.3.1/jquery.min.js").write_bytes(b"/* tampered */")
    problems = assets.check(vendor)
    assert len(problems) == 1 and problems[0].startswith("jquery/3.3.1/jquery.min.js")


def test_check_names_the_asset_an_asv_upgrade_changed():
    template = manifest.template_assets()
    jquery = "https://code.jquery.com/jquery-3.3.1.min.js"
    changed = dict(template, **{jquery: "sha256-" + "A" * 43 + "="})
    problems = assets.check(template=changed)
    assert len(problems) == 1 and jquery in problems[0] and "jquery/3.3.1/jquery.min.js" in problems[0]

    newer = {url: v for url, v in template.items() if url != jquery}
    newer["https://code.jquery.com/jquery-3.7.1.min.js"] = "sha256-x"
    problems = assets.check(template=newer)
    assert any("jquery-3.3.1" in line and "no longer loaded" in line for line in problems)
    assert any(line.startswith("https://code.jquery.com/jquery-3.7.1.min.js") for line in problems)


def test_every_vendored_library_carries_a_licence():
    items = manifest.load_manifest()
    packages = {item.package for item in items}
    licensed = {item.package for item in items if "LICENSE" in Path(item.file).name}
    # flot-orderbars states its MIT licence in the vendored file's own header (the package ships no file).
    assert packages - licensed == {"flot-orderbars"}
    header = (manifest.VENDOR_DIR / "flot-orderbars/1.0.0/jquery.flot.orderBars.js").read_text(encoding="utf-8")
    assert "MIT license" in header


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("PITFALLS_REFRESH_TEST") != "1",
    reason="rebuilds every vendored file from the npm registry and PyPI (about 15 s, needs npm, node and java); "
    "set PITFALLS_REFRESH_TEST=1 to run it",
)
def test_refresh_rebuilds_the_committed_bytes_from_the_registries(tmp_path):
    written = rebuild.refresh(dest=tmp_path, log=lambda _line: None)
    assert len(written) == len(manifest.load_manifest())
    for path in written:
        relative = path.relative_to(tmp_path)
        assert path.read_bytes() == (manifest.VENDOR_DIR / relative).read_bytes(), relative


# --- finding and rewriting resources ------------------------------------------------------------------------


def test_resources_finds_fetched_addresses_but_not_links():
    page = (
        '<html><head><script src="https://cdn.example/a.js" integrity="sha256-x"></script>\n'
        '<link rel="stylesheet" href="//cdn.example/b.css"><link href="local.css" rel="stylesheet">\n'
        '</head><body><img src="http://img.example/c.png"/><a href="https://example.org/">home</a></body></html>'
    )
    found = resources(page)
    assert [(r.tag, r.url) for r in found] == [
        ("script", "https://cdn.example/a.js"),
        ("link", "//cdn.example/b.css"),
        ("link", "local.css"),
        ("img", "http://img.example/c.png"),
    ]
    assert [r.url for r in external_resources(page)] == [
        "https://cdn.example/a.js",
        "//cdn.example/b.css",
        "http://img.example/c.png",
    ]
    assert found[0].integrity == "sha256-x"
    script = found[0]
    assert page[script.start : script.end].startswith("<script src=")
    rewritten = replace_url(page, script, "vendor/a.js")
    assert rewritten == page.replace("https://cdn.example/a.js", "vendor/a.js")


def test_publish_rewrites_every_cdn_address_and_keeps_the_hashes(tmp_path):
    site = _template_site(tmp_path / "html")
    before = (site / "index.html").read_text(encoding="utf-8")
    pinned = {r.url: r.integrity for r in external_resources(before)}
    assert len(pinned) == 10

    report = publish(site)

    after = (site / "index.html").read_text(encoding="utf-8")
    assert external_resources(after) == ()
    assert {url for _, url, _ in report.rewritten} == set(pinned)
    by_url = {item.url: item for item in manifest.load_manifest() if item.url}
    local = {r.url: r.integrity for r in resources(after) if r.url.startswith(VENDOR_FOLDER + "/")}
    assert len(local) == 10
    for page, url, new in report.rewritten:
        assert page == "index.html"
        assert new == f"{VENDOR_FOLDER}/{by_url[url].file}"
        assert local[new] == pinned[url]  # the integrity attribute is kept as asv wrote it
        assert manifest.matches_integrity((site / new).read_bytes(), pinned[url])
    # Only the addresses changed: the rest of the page is asv's, byte for byte.
    restored = after
    for _, url, new in report.rewritten:
        restored = restored.replace(f'"{new}"', f'"{url}"')
    assert restored == before
    assert (site / VENDOR_FOLDER / "MANIFEST.json").is_file()
    assert (site / VENDOR_FOLDER / "bootstrap/3.1.1/dist/fonts/glyphicons-halflings-regular.woff").is_file()


def test_publish_twice_changes_nothing(tmp_path):
    site = _template_site(tmp_path / "html")
    publish(site)
    first = {p: p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()}
    again = publish(site)
    assert again.rewritten == ()
    assert {p: p.read_bytes() for p in sorted(site.rglob("*")) if p.is_file()} == first


def test_publish_names_the_folder_without_index_html(tmp_path):
    with pytest.raises(ValueError, match=re.escape(f"html_dir='{tmp_path}' has no index.html")):
        publish(tmp_path)
    with pytest.raises(TypeError, match="html_dir must be a path"):
        publish(42)


def test_publish_refuses_an_address_it_has_no_copy_of_and_changes_nothing(tmp_path):
    site = _template_site(tmp_path / "html")
    extra = '<script src="https://cdn.example.org/new-lib.js"></script>'
    text = (site / "index.html").read_text(encoding="utf-8").replace("</head>", extra + "</head>")
    (site / "index.html").write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape("https://cdn.example.org/new-lib.js")) as caught:
        publish(site)
    assert "MANIFEST.json" in str(caught.value)
    assert (site / "index.html").read_text(encoding="utf-8") == text
    assert not (site / VENDOR_FOLDER).exists()


def test_publish_refuses_a_hash_the_vendored_copy_does_not_have(tmp_path):
    site = _template_site(tmp_path / "html")
    jquery = "https://code.jquery.com/jquery-3.3.1.min.js"
    text = (site / "index.html").read_text(encoding="utf-8")
    pinned = next(r.integrity for r in external_resources(text) if r.url == jquery)
    (site / "index.html").write_text(text.replace(pinned, "sha256-" + "B" * 43 + "="), encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape("jquery-3.3.1.min.js is pinned to")):
        publish(site)


# --- the loopback server ------------------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "10.0.0.1", "example.org", ""])
def test_server_refuses_hosts_other_machines_can_reach(host, tmp_path):
    (tmp_path / "index.html").write_text("<html></html>")
    with pytest.raises(ValueError, match=re.escape(f"host={host!r} is not allowed")):
        make_server(tmp_path, host=host)


def test_loopback_names_are_accepted():
    assert check_loopback("127.0.0.1") == "127.0.0.1"
    assert check_loopback("127.0.0.2") == "127.0.0.2"
    assert check_loopback("localhost") == "127.0.0.1"
    assert check_loopback("::1") == "::1"
    with pytest.raises(TypeError, match="host must be a str"):
        check_loopback(None)


def test_server_binds_loopback_and_picks_a_free_port(tmp_path):
    (tmp_path / "index.html").write_text("<html></html>")
    server = make_server(tmp_path, port=0)
    try:
        host, port = server.server_address[:2]
        assert host == "127.0.0.1" and port > 0
        assert server.socket.getsockname()[0] == "127.0.0.1"
    finally:
        server.server_close()


@pytest.mark.parametrize("port, error", [(-1, ValueError), (70000, ValueError), ("80", TypeError), (True, TypeError)])
def test_server_refuses_bad_ports(port, error, tmp_path):
    (tmp_path / "index.html").write_text("<html></html>")
    with pytest.raises(error, match="port"):
        make_server(tmp_path, port=port)


def test_server_refuses_a_folder_without_a_site(tmp_path):
    with pytest.raises(ValueError, match=re.escape("has no index.html")):
        make_server(tmp_path)


def test_server_keeps_serving_a_folder_that_was_published_again(tmp_path):
    site = tmp_path / "html"
    site.mkdir()
    (site / "index.html").write_text("first")
    with serving(site) as url:
        assert url.startswith("http://127.0.0.1:")
        with urllib.request.urlopen(url + "index.html", timeout=10) as answer:
            assert answer.read() == b"first"
        # `asv publish` deletes and rewrites the folder; asv preview stops serving then, this server does not.
        shutil.rmtree(site)
        site.mkdir()
        (site / "index.html").write_text("second")
        with urllib.request.urlopen(url + "index.html", timeout=10) as answer:
            assert answer.read() == b"second"
    with socket.socket() as probe:  # the port is released when the block ends
        assert probe.connect_ex(("127.0.0.1", int(url.rsplit(":", 1)[1].strip("/")))) != 0


# --- the browser helper, without a browser ------------------------------------------------------------------


def test_render_page_refuses_other_schemes():
    with pytest.raises(ValueError, match="url='ftp://x/' is not allowed"):
        browser.render_page("ftp://x/")


def test_render_page_says_how_to_get_chromium(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="apt-get install -y chromium"):
        browser.render_page("http://127.0.0.1:1/")


# --- end to end: a real asv project, published, localized, served, rendered offline -------------------------

BENCHMARKS = """
class Suite:
    params = [[10, 1000]]
    param_names = ["n"]

    def time_sum(self, n):
        sum(range(n))

    def track_length(self, n):
        return len(list(range(n)))
"""

CONFIG = {
    "version": 1,
    "project": "tiny",
    "project_url": "",
    "repo": ".",
    "branches": ["main"],
    "environment_type": "existing",
    "benchmark_dir": "benchmarks",
    "results_dir": "results",
    "html_dir": "html",
}


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, f"{' '.join(command)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def asv_site(tmp_path_factory):
    """A tiny asv project with results for two commits, published; returns (raw site, localized site)."""
    root = tmp_path_factory.mktemp("asv_e2e")
    project = root / "project"
    (project / "benchmarks").mkdir(parents=True)
    (project / "benchmarks" / "__init__.py").write_text("")
    (project / "benchmarks" / "bench_tiny.py").write_text(BENCHMARKS)
    (project / "asv.conf.json").write_text(json.dumps(CONFIG, indent=2))
    home = root / "home"  # asv keeps its machine file in $HOME: keep it out of the real one
    home.mkdir()
    env = dict(
        os.environ,
        HOME=str(home),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.invalid",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.invalid",
    )
    git = ["git", "-c", "commit.gpgsign=false", "-c", "core.hooksPath=/dev/null"]
    asv = [sys.executable, "-m", "asv"]
    _run([*git, "init", "-q", "-b", "main"], project, env)
    _run([*asv, "machine", "--yes", "--machine", "e2e"], project, env)
    for day, message in (("2026-01-01T12:00:00", "first"), ("2026-01-02T12:00:00", "second")):
        (project / "NOTES").write_text(message)
        _run([*git, "add", "-A"], project, env)
        dated = dict(env, GIT_AUTHOR_DATE=day, GIT_COMMITTER_DATE=day)
        _run([*git, "commit", "-q", "-m", message], project, dated)
        commit = _run([*git, "rev-parse", "HEAD"], project, env).strip()
        # --python=same saves results only with --set-commit-hash (and times one sample with --quick).
        _run([*asv, "run", "--python=same", "--quick", "--machine", "e2e", "--set-commit-hash", commit], project, env)
    _run([*asv, "publish"], project, env)
    raw = root / "raw"
    shutil.copytree(project / "html", raw)
    publish(project / "html")
    return raw, project / "html"


def test_publish_command_fills_the_site_folder_in_place(asv_site, tmp_path, monkeypatch):
    """The site folder is kept, only its contents replaced: it may be a container's volume (a mount point)."""
    _, site = asv_site
    project = site.parent
    target = tmp_path / "mounted-html"
    target.mkdir()
    (target / "stale.txt").write_text("from an older publish")
    (target / "old-graphs").mkdir()
    folder = target.stat()
    monkeypatch.setenv("HOME", str(project.parent / "home"))
    monkeypatch.chdir(project)
    assert localize.main(["--html-dir", str(target)]) == 0
    after = target.stat()
    assert (after.st_ino, after.st_dev) == (folder.st_ino, folder.st_dev), "the folder itself was replaced"
    assert not (target / "stale.txt").exists() and not (target / "old-graphs").exists()
    assert sorted(p.name for p in target.iterdir()) == sorted(p.name for p in site.iterdir())
    index = (target / "index.html").read_text(encoding="utf-8")
    assert external_resources(index) == ()
    assert (target / VENDOR_FOLDER / "MANIFEST.json").is_file()


def test_publish_command_leaves_the_site_folder_alone_when_asv_fails(tmp_path, monkeypatch):
    target = tmp_path / "html"
    target.mkdir()
    (target / "index.html").write_text("the previous site")
    (tmp_path / "asv.conf.json").write_text(json.dumps({**CONFIG, "repo": "does-not-exist"}))
    monkeypatch.chdir(tmp_path)
    assert localize.main(["--html-dir", str(target)]) != 0
    assert (target / "index.html").read_text() == "the previous site"


needs_chromium = pytest.mark.skipif(
    browser.find_chromium() is None,
    reason="no chromium on PATH: install the Debian package `chromium` (scripts/test does, as root)",
)


@pytest.mark.slow
@needs_chromium
def test_published_site_renders_benchmarks_and_graph_with_no_network(asv_site, tmp_path):
    _, site = asv_site
    for page in site.glob("*.html"):
        assert external_resources(page.read_text(encoding="utf-8")) == (), page.name
    with serving(site) as url:
        grid = browser.render_page(url + "index.html")
        listing = browser.render_page(url + "index.html#summarylist")
        shot = tmp_path / "graph.png"
        graph = browser.render_page(url + "index.html#bench_tiny.Suite.time_sum", screenshot_path=shot)
        tracked = browser.render_page(url + "index.html#bench_tiny.Suite.track_length")

    for dom in (grid, listing, graph, tracked):
        assert FAILED_TO_LOAD not in dom
        assert "airspeed velocity of an unladen tiny" in dom  # index.json arrived by XHR
    # The grid: one tile per benchmark, each with a small flot plot.
    for name in ("bench_tiny.Suite.time_sum", "bench_tiny.Suite.track_length"):
        assert f'class="btn benchmark-container" href="#{name}"' in grid
    assert grid.count('class="flot-base"') >= 2
    # The list: a table sorted by stupidtable (it adds sorting-asc; asv's handler adds asc after the sort).
    assert 'id="summarylist-table-0"' in listing
    assert 'class="sorting-asc asc"' in listing
    for row in ("bench_tiny.Suite.time_sum</a>", "bench_tiny.Suite.track_length</a>", "> (10)</a>", "> (1000)</a>"):
        assert row in listing
    # The graph page: flot drew into #main-graph, with tick labels and a legend for each parameter value.
    main_graph = graph[graph.index('id="main-graph"') : graph.index('id="overview"')]
    assert '<canvas class="flot-base"' in main_graph
    assert "flot-tick-label" in main_graph
    assert "n-10" in main_graph and "n-1000" in main_graph
    assert '<canvas class="flot-base"' in tracked[tracked.index('id="main-graph"') :]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@needs_chromium
def test_without_localizing_the_site_fails_offline(asv_site):
    """The control: with the CDN unreachable, asv's own output shows only its error page."""
    raw, _ = asv_site
    with serving(raw) as url:
        dom = browser.render_page(url + "index.html#summarylist")
    assert FAILED_TO_LOAD in dom
    assert "summarylist-table" not in dom


@pytest.mark.slow
@needs_chromium
def test_the_browser_refuses_a_vendored_file_that_does_not_match_its_hash(asv_site, tmp_path):
    """The kept integrity attributes are enforced: a changed local file is blocked like a changed CDN file."""
    _, site = asv_site
    copy = tmp_path / "html"
    shutil.copytree(site, copy)
    target = copy / VENDOR_FOLDER / "stupidtable/1.0.1/stupidtable.min.js"
    target.write_bytes(target.read_bytes() + b"\n")
    with serving(copy) as url:
        dom = browser.render_page(url + "index.html#summarylist")
    assert FAILED_TO_LOAD in dom
