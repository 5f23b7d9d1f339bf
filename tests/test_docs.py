"""The documentation: every generated block and the README's picture are what the registry and the committed
results give (HEAD's results/ and proof/: tests/committed.py), every relative link resolves, and the README is the
short page its readers need first."""

from __future__ import annotations

import json
import math
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from committed import generation_root

from pitfalls.cli import build_parser
from pitfalls.docs import Docs, broken_links, pages
from pitfalls.docs.blocks import END, blocks, opening
from pitfalls.docs.picture import chart_of, draw, fingerprint, png_fingerprint
from pitfalls.docs.results_index import results_lines
from pitfalls.registry import BUILTIN
from pitfalls.report.loading import file_rows

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


@pytest.fixture(scope="module")
def docs(tmp_path_factory: pytest.TempPathFactory, committed_inputs: Path) -> Docs:
    """The working tree's pages, generated from the committed results and proofs (read, never written)."""
    return Docs(generation_root(tmp_path_factory.mktemp("docs"), committed_inputs))


def test_every_committed_page_and_picture_is_what_generation_gives(docs: Docs) -> None:
    assert docs.stale() == [], ("run `python -m pitfalls.docs --write` and commit the pages with the results and "
                                "proofs they are generated from: this test reads HEAD's results/ and proof/")
    assert docs.charts, "the README's picture is a generated block"


def test_every_relative_link_and_anchor_of_the_readme_and_docs_resolves() -> None:
    assert Docs(ROOT).broken_links() == []


def test_every_built_in_family_has_a_page_with_its_generated_tables() -> None:
    for entry in BUILTIN:
        page = ROOT / "docs" / "families" / f"{entry.name}.md"
        found = {(b.kind, b.args) for b in blocks(page.read_text().split("\n"), str(page))}
        assert ("family", (entry.name,)) in found and ("benchmarks", (entry.name,)) in found, page


def test_a_stale_block_is_named_and_written_back_with_the_prose_around_it_kept(tmp_path: Path,
                                                                            committed_inputs: Path) -> None:
    root = generation_root(tmp_path, committed_inputs)
    page = root / "docs" / "families" / "loss.md"
    text = page.read_text()
    marker = opening("family", "loss")
    edited = text.replace(marker + "\n", marker + "\n| a row typed by hand |\n").replace(
        "# loss (article 000)", "# loss (article 000), prose edited by hand")
    page.write_text(edited)
    assert Docs(root).stale() == ["docs/families/loss.md: differs from what generation gives"]
    assert Docs(root).write() == [Path("docs/families/loss.md")]
    assert page.read_text() == text.replace("# loss (article 000)", "# loss (article 000), prose edited by hand")
    assert Docs(root).stale() == []


def test_a_picture_drawn_from_other_data_is_stale_and_is_drawn_again(tmp_path: Path, docs: Docs,
                                                                   committed_inputs: Path) -> None:
    root = generation_root(tmp_path, committed_inputs)
    [(png, chart)] = docs.charts.items()
    assert png_fingerprint(ROOT / png) == fingerprint(chart)
    first = chart.panels[0]
    moved = replace(first.series[0], points=tuple((x, y * 2) for x, y in first.series[0].points))
    other = replace(chart, panels=(replace(first, series=(moved, *first.series[1:])), *chart.panels[1:]))
    draw(other, root / png)
    assert png_fingerprint(root / png) == fingerprint(other) != fingerprint(chart)
    fresh = Docs(root)
    assert fresh.stale() == [f"{png}: not drawn from the data the committed results give"]
    assert fresh.write() == [png] and png_fingerprint(root / png) == fingerprint(chart)


def test_the_pictures_bars_are_the_committed_speedups_and_a_figure_not_measured_is_no_bar(
        committed_inputs: Path) -> None:
    results_file = committed_inputs / "results/cpu-intel-xeon-processor-2cpu/90675b0c-installed-py3.11-torch2.13.0.json"
    benchmark = "bench_loader.Speedup.track_speedup"
    chart = chart_of(results_file, benchmark)
    rows = [r for r in file_rows(results_file) if r.benchmark == benchmark and r.params["device"] == "cpu"]
    bars = {(p.title, s.variant, x): y for p in chart.panels for s in p.series for x, y in s.points}
    gaps = {(p.title, s.variant, x) for p in chart.panels for s in p.series for x in s.missing}
    workers = sorted({r.params["num_workers"] for r in rows})
    assert chart.kind == "bar" and len(bars) >= 10
    for row in rows:
        if row.params["variant"] == "naive":
            continue  # the reference line, not a bar
        key = (f"image_format=png, storage=list, pin_memory=False, cache={row.params['cache']}, device=cpu",
               row.params["variant"], float(workers.index(row.params["num_workers"])))
        if row.measured:
            assert bars[key] == row.value
        else:
            assert key in gaps and key not in bars


def test_the_results_index_counts_measured_skipped_and_failed_cases(tmp_path: Path, committed_inputs: Path) -> None:
    machine = tmp_path / "results" / "m"
    machine.mkdir(parents=True)
    shutil.copy(committed_inputs / "results/cpu-intel-xeon-processor-2cpu/machine.json", machine)
    source = committed_inputs / "results/cpu-intel-xeon-processor-2cpu/90675b0c-installed-py3.11-torch2.13.0.json"
    data = json.loads(source.read_text())
    data["results"] = {"bench_x.A.track_a": [[1.0, math.nan, None], *data["results"]["bench_loss.Step.time_step"][1:]]}
    (machine / source.name).write_text(json.dumps(data))
    lines = results_lines(tmp_path, Path("docs/results/README.md"))
    [row] = [line for line in lines if "`90675b0c`" in line]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[5:7] == ["1", "1 / 1 / 1"]
    assert "`scripts/run-suite`" in cells[3] and "torch 2.13.0" in cells[2]


def test_the_link_checker_finds_a_missing_file_a_missing_anchor_and_a_way_out(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A title\n\n## Its `second` part\n")
    page = tmp_path / "README.md"
    page.write_text("\n".join([
        "[fine](docs/a.md#its-second-part) [fine too](#top) [external](https://example.org/x.md)",
        "[gone](docs/b.md)", "[no such part](docs/a.md#third)", "[out](../elsewhere.md)",
        "`[in code](nowhere.md)`", "```", "[in a block](nowhere.md)", "```", "# Top"]))
    assert broken_links(tmp_path, [page]) == [
        "README.md:2: docs/b.md (no such file)",
        "README.md:3: docs/a.md#third (no heading with that anchor)",
        "README.md:4: ../elsewhere.md (outside the repository)",
    ]


def test_a_block_the_generator_does_not_know_is_one_line_and_exit_2(tmp_path: Path, committed_inputs: Path) -> None:
    root = generation_root(tmp_path, committed_inputs)
    (root / "docs" / "extra.md").write_text(f"{opening('nonsense', 'x')}\n{END}\n")
    done = subprocess.run([sys.executable, "-m", "pitfalls.docs", "--root", str(root)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert "docs/extra.md:1: unknown generated block 'nonsense'; allowed: families" in done.stderr
    assert "Traceback" not in done.stderr
    (root / "docs" / "extra.md").write_text(f"{opening('family', 'loss')}\n")
    with pytest.raises(ValueError, match="never closed"):
        Docs(root).stale()


def test_the_readme_is_short_and_leads_with_the_claims_and_the_two_commands() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 150
    headings = [line for line in lines if line.startswith("## ")]
    assert headings == ["## The articles' claims, measured here", "## The two commands", "## What you get",
                        "## The command line", "## Your own training script", "## Read on"]
    screen = "\n".join(lines[:50])
    assert "<!-- /claims -->" in screen and "`bash scripts/run-suite`" in screen and "`bash scripts/test`" in screen


def test_the_readme_reaches_the_loaders_speedup_and_a_new_family_in_one_click() -> None:
    text = README.read_text()
    assert "(docs/families/loader.md#steady-state)" in text and "(docs/extending.md)" in text
    assert "## Steady state" in (ROOT / "docs/families/loader.md").read_text()


def test_the_readmes_command_line_examples_parse_and_name_every_subcommand() -> None:
    text = README.read_text()
    block = text[text.index("## The command line"):]
    block = block[block.index("```") + 3:]
    examples = [line.split("  #")[0] for line in block[:block.index("```")].strip().splitlines()]
    assert len(examples) <= 12
    parser = build_parser()
    for example in examples:
        words = shlex.split(example)
        assert words[0] == "pitfalls", example
        parser.parse_args(words[1:])  # argparse exits 2 on a flag or value the command does not take
    subcommands = next(a for a in parser._actions if a.dest == "command").choices
    assert subcommands is not None
    assert {shlex.split(e)[1] for e in examples} == set(subcommands)


def test_the_pages_are_the_readme_and_the_docs_tree() -> None:
    found = pages(ROOT)
    assert found[0] == Path("README.md") and Path("docs/README.md") in found
    assert set(found) == {Path("README.md"), *(p.relative_to(ROOT) for p in (ROOT / "docs").rglob("*.md"))}


def test_a_main_job_time_block_of_a_file_without_durations_is_an_error_not_a_table_of_zeros(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "time.md").write_text(f"{opening('main-job-time', 'results/m/gone.json')}\n{END}\n")
    with pytest.raises(ValueError, match="results/m/gone.json holds no asv durations"):
        Docs(tmp_path).stale()
