"""A result file changed after asv wrote it says so: results/EDITS.md lists every such change, and it holds."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"


def edits() -> list[dict[str, str]]:
    """The rows of results/EDITS.md's table."""
    rows = []
    for line in (RESULTS / "EDITS.md").read_text().splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip().strip("|").split("|")]
        if line.startswith("| `") and len(cells) == 5:
            rows.append(dict(zip(("file", "field", "old", "new", "why"), cells, strict=True)))
    return rows


def field(data: dict, name: str) -> object:
    value: object = data
    for part in name.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def test_each_listed_edit_holds_its_new_value():
    rows = edits()
    assert len(rows) == 4
    for row in rows:
        path = RESULTS / row["file"]
        assert path.is_file(), row["file"]
        data = json.loads(path.read_text())
        if row["field"] == "file name":
            assert path.name == row["new"] and not (path.parent / row["old"]).exists()
            continue
        for name in row["field"].replace("`", "").split(", "):
            assert field(data, name) == row["new"], (row["file"], name)
        assert row["why"]


def test_no_committed_result_was_changed_after_the_commit_that_added_it_unless_listed():
    listed = {row["file"] for row in edits()}
    changed = subprocess.run(["git", "-C", str(ROOT), "log", "--format=", "--name-only", "--diff-filter=MR",
                              "--", "results/*/*.json"], capture_output=True, text=True, check=True).stdout
    edited = {Path(line).relative_to("results").as_posix() for line in changed.split() if line}
    edited = {name for name in edited if not name.endswith("machine.json")}
    assert edited <= listed, f"result files changed after asv wrote them, missing from results/EDITS.md: " \
                             f"{sorted(edited - listed)}"


def test_the_results_page_points_at_the_list():
    page = (ROOT / "docs" / "results" / "README.md").read_text()
    assert "none is edited by hand" not in page
    assert "`results/EDITS.md` lists each field changed" in page
