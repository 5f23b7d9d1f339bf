"""A user's main job writes its own results into the working tree: the tests of the committed pages read HEAD's
results/ and proof/ (tests/committed.py) and stay green, while `python -m pitfalls.docs` reads the working tree,
names the pages those results make stale, and its `--write` adds the user's machine to them."""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from committed import NotACheckout, head_inputs
from conftest import DURATIONS_ENV, SERIAL_LIST_ENV
from sandbox import make_sandbox

from pitfalls.report import claims

pytestmark = pytest.mark.slow

# The tests that hold the committed pages to what generation gives.
PAGE_TESTS = (
    "tests/test_docs.py::test_every_committed_page_and_picture_is_what_generation_gives",
    "tests/test_docs.py::test_a_picture_drawn_from_other_data_is_stale_and_is_drawn_again",
    "tests/test_docs.py::test_a_stale_block_is_named_and_written_back_with_the_prose_around_it_kept",
    "tests/test_claims.py::test_the_readme_table_is_what_the_committed_results_give",
)
USERS = "cpu-users-box"
KNOWN = "cpu-amd-epyc-2cpu"  # a committed machine the user's run adds a file to
COMMIT = "0123abcd" * 5


def _newest(folder: Path) -> Path:
    files = [p for p in folder.glob("*-*.json")]
    return max(files, key=lambda p: json.loads(p.read_text())["date"])


def _scaled(value: Any) -> Any:
    if isinstance(value, list):
        return [_scaled(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value):
        return value * 1.7
    return value


def _a_run_of(source: Path, machine: str) -> tuple[str, str]:
    """A results file as the user's run writes it: ``source``'s benchmarks at a new commit, later, other numbers."""
    data = json.loads(source.read_text())
    result = data["result_columns"].index("result")
    data["commit_hash"], data["date"] = COMMIT, data["date"] + 86_400_000
    data["params"]["machine"] = machine
    for row in data["results"].values():
        row[result] = _scaled(row[result])
    return f"{COMMIT[:8]}-{data['env_name']}.json", json.dumps(data)


def plant_a_users_run(repo: Path) -> list[Path]:
    """Leave in ``repo``'s working tree what a user's main job leaves: a new machine's folder (its results file and
    machine.json), a new results file in a committed machine's folder and that machine's machine.json rewritten.

    Returns:
        The files written, untracked or changed.
    """
    results = repo / "results"
    (results / USERS).mkdir()
    machine = json.loads((results / KNOWN / "machine.json").read_text())
    written = [results / USERS / "machine.json", results / KNOWN / "machine.json"]
    written[0].write_text(json.dumps({**machine, "machine": USERS, "cpu": "a user's CPU"}, indent=4))
    written[1].write_text(json.dumps({**machine, "os": "Linux a-newer-kernel"}, indent=4))
    for machine_name in (USERS, KNOWN):
        name, text = _a_run_of(_newest(results / KNOWN), machine_name)
        written.append(results / machine_name / name)
        written[-1].write_text(text)
    return written


def _pytest_env() -> dict[str, str]:
    """This environment without what ties a pytest run to the run around it (xdist's worker, the durations file)."""
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_", "PITFALLS_STRICT")) and k not in (DURATIONS_ENV, SERIAL_LIST_ENV)}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clone of this checkout with a user's main job planted in its working tree."""
    repo = make_sandbox(tmp_path_factory.mktemp("users-checkout") / "repo")
    plant_a_users_run(repo)
    return repo


def _check(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pitfalls.docs", "--root", str(repo), *args], capture_output=True,
                          text=True, timeout=600, check=False)


def test_the_committed_inputs_are_heads_without_the_users_files(planted: Path, tmp_path: Path) -> None:
    status = subprocess.run(["git", "-C", str(planted), "status", "--porcelain", "results"], capture_output=True,
                            text=True, check=True).stdout.splitlines()
    assert len(status) == 3, status  # the new machine's folder, the new file, the rewritten machine.json
    inputs = head_inputs(tmp_path / "inputs", planted)
    assert not (inputs / "results" / USERS).exists()
    assert not (inputs / "results" / KNOWN / f"{COMMIT[:8]}-installed-py3.11-torch2.13.0.json").exists()
    shown = subprocess.run(["git", "-C", str(planted), "show", f"HEAD:results/{KNOWN}/machine.json"],
                           capture_output=True, check=True).stdout
    assert (inputs / "results" / KNOWN / "machine.json").read_bytes() == shown
    tracked = subprocess.run(["git", "-C", str(planted), "ls-files", "results", "proof"], capture_output=True,
                             text=True, check=True).stdout.split()
    assert sorted(str(p.relative_to(inputs)) for p in inputs.rglob("*") if p.is_file()) == sorted(tracked)


def test_a_sandbox_made_after_a_users_run_holds_heads_results_and_the_working_trees_code(planted: Path,
                                                                                       tmp_path: Path) -> None:
    # The tests that run scripts in a sandbox (the main job's, the merge's) make it from the checkout they run in:
    # after a user's main job, that checkout's working tree holds the user's results, which must not become the
    # sandbox's committed ones (the committed page tests in it would all read stale).
    edited = planted / "src" / "pitfalls" / "edited_here.py"
    edited.write_text('"""An uncommitted module."""\n')
    try:
        sandbox = make_sandbox(tmp_path / "sandbox", root=planted)
    finally:
        edited.unlink()
    inputs = head_inputs(tmp_path / "inputs", planted)

    def files(folder: Path) -> dict[str, bytes]:
        return {str(p.relative_to(folder)): p.read_bytes() for p in (folder / "results").rglob("*") if p.is_file()}

    assert files(sandbox) == files(inputs) and not (sandbox / "results" / USERS).exists()
    assert (sandbox / "src" / "pitfalls" / "edited_here.py").is_file()
    assert subprocess.run(["git", "-C", str(sandbox), "status", "--porcelain"], capture_output=True, text=True,
                          check=True).stdout == ""


def test_a_users_run_leaves_the_committed_page_tests_green_and_the_check_names_the_stale_pages(planted: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *PAGE_TESTS],
                          cwd=planted, env=_pytest_env(), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert f"{len(PAGE_TESTS)} passed" in done.stdout
    # The command line reads the working tree: the user's results make the claims table and the results index stale.
    check = _check(planted)
    stale = check.stderr.splitlines()
    assert check.returncode == 1, check.stderr
    assert {"README.md: differs from what generation gives",
            "docs/results/README.md: differs from what generation gives"} <= set(stale), stale
    assert "Traceback" not in check.stderr


def test_the_check_write_adds_the_users_machine_to_the_claims_and_the_results_index(planted: Path,
                                                                                   tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(planted, repo, symlinks=True, ignore=shutil.ignore_patterns(".git"))  # generation reads no git
    written = _check(repo, "--write")
    assert written.returncode == 0, written.stderr
    assert "wrote README.md" in written.stdout.splitlines()
    readme = (repo / "README.md").read_text()
    header = readme[readme.index(claims.MARK_BEGIN):].splitlines()[1]
    assert f"| {USERS} |" in header and f"| {KNOWN} |" in header
    assert f"`{COMMIT[:8]}`" in (repo / "docs" / "results" / "README.md").read_text()
    assert _check(repo).returncode == 0


def test_outside_a_git_checkout_the_committed_inputs_are_a_clear_error(tmp_path: Path) -> None:
    copied = tmp_path / "copied"
    (copied / "results").mkdir(parents=True)
    with pytest.raises(NotACheckout, match=r"is no git checkout with a commit \(git ls-tree: fatal: not a git "
                                           r"repository.*run the tests from a clone"):
        head_inputs(tmp_path / "inputs", copied)
