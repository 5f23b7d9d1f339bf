"""The one reader of asv's results folder (pitfalls.asv_files), on folders written by asv's own API."""

from __future__ import annotations

from pathlib import Path

import pytest
from asv_results import FACTS, add, benchmark, results, write_machine, write_suite

from pitfalls import asv_files

HAZARDS = benchmark("bench_loss.SyncHazards.track_sync_hazards", [["'naive'", "'ignore_index'"]])


def folder_with_one_run(root: Path) -> Path:
    """A results folder with the suite, one machine and one results file; returns that file."""
    write_suite(root, [HAZARDS])
    write_machine(root, "box")
    res = results("box", "a" * 40)
    add(res, HAZARDS, [5, 0])
    res.set_setup_cache_duration("bench_loss:12", 30.0)
    res.set_setup_cache_duration("bench_loss:40", 6.0)
    res.save(str(root))
    return root / asv_files.file_name("box", "a" * 40, res.env_name)


def test_the_folder_s_machines_files_and_suite_are_what_asv_wrote(tmp_path: Path) -> None:
    path = folder_with_one_run(tmp_path)
    assert asv_files.machines(tmp_path) == ["box"]
    assert asv_files.result_files(tmp_path) == asv_files.result_files(tmp_path, "box") == ["box/" + path.name]
    assert asv_files.result_files(tmp_path, "other") == []
    assert asv_files.read_json(tmp_path / "box" / asv_files.MACHINE, asv_files.MACHINE_API) == \
        {**FACTS, "machine": "box"}  # asv's version key is not a fact
    assert asv_files.read_json(tmp_path / asv_files.BENCHMARKS, asv_files.SUITE_API) == {HAZARDS["name"]: HAZARDS}
    loaded = asv_files.load(path, "box")
    assert loaded.commit_hash == "a" * 40 and loaded.get_result_value(HAZARDS["name"], HAZARDS["params"]) == [5, 0]
    benchmarks, caches = asv_files.durations(loaded)
    assert list(benchmarks) == [] and caches == {"bench_loss": 36.0}  # add() records no duration; caches sum


def test_a_file_asv_cannot_read_says_why_in_one_line_without_its_path(tmp_path: Path) -> None:
    path = folder_with_one_run(tmp_path)
    with pytest.raises(asv_files.Unreadable) as other_machine:
        asv_files.load(path, "elsewhere")
    assert other_machine.value.reason == "Error loading results file: machine name is not 'elsewhere'"
    path.write_text(path.read_text()[:600])
    with pytest.raises(asv_files.Unreadable) as truncated:
        asv_files.load(path)
    assert truncated.value.reason.startswith("Error parsing JSON: ") and str(tmp_path) not in truncated.value.reason
    assert str(truncated.value).startswith(f"{path}: cannot be read: Error parsing JSON: ")
    assert "\n" not in str(truncated.value)
    # What the damaged file still says about itself, from its first bytes.
    assert asv_files.header(path) == {"commit": "a" * 40, "env": "installed-py3.11-torch2.13.0",
                                      "date": 1_700_000_000_000}
    with pytest.raises(asv_files.Unreadable, match="cannot be opened: No such file"):
        asv_files.load(tmp_path / "box" / "missing.json")
    for text, reason in (("[1]", "No version specified"), ('["version"]', "not an asv list.json (TypeError")):
        (tmp_path / "list.json").write_text(text)
        with pytest.raises(asv_files.Unreadable) as unreadable:
            asv_files.read_json(tmp_path / "list.json", asv_files.MACHINE_API)
        assert unreadable.value.reason.startswith(reason) and str(tmp_path) not in unreadable.value.reason
