"""The main job's staging folder: TMPDIR short enough for asv's forkserver socket, and nothing left behind."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import pytest

from pitfalls.runner import staging


def _bind_socket_in(folder: Path) -> None:
    """What asv's forkserver does in TMPDIR: a folder, and a Unix socket bound in it."""
    place = folder / "asv-forkserver-abcdefgh"
    place.mkdir()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(place / "socket"))


def test_a_shallow_stage_keeps_its_tmp_inside() -> None:
    with tempfile.TemporaryDirectory(prefix="st-") as short, staging.Stage(Path(short) / "s") as stage:
        assert stage.tmp == stage.path / "tmp" and stage.tmp.is_dir()
        assert not (stage.path / staging.ELSEWHERE).exists()
        _bind_socket_in(stage.tmp)
    assert not stage.path.exists()


def test_a_deep_stage_puts_tmp_where_a_socket_fits_and_removes_it(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    with staging.Stage(deep) as stage:
        assert stage.tmp != stage.path / "tmp" and stage.tmp.name.startswith("pitfalls-run-")
        assert (stage.path / staging.ELSEWHERE).read_text().strip() == str(stage.tmp)
        _bind_socket_in(stage.tmp)  # in the staging folder this path would be too long to bind
        elsewhere = stage.tmp
    assert not elsewhere.exists() and not stage.path.exists()


def test_the_next_job_removes_a_killed_jobs_tmp_elsewhere(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    stage = staging.Stage(deep).__enter__()
    elsewhere = stage.tmp
    # The job dies: its lock goes with it, its folders stay.
    assert stage._lock_fd is not None
    os.close(stage._lock_fd)
    (stage.path / staging.ALIVE).touch()
    logged: list[str] = []
    assert staging.remove_stale(deep, logged.append) == [stage.path]
    assert not elsewhere.exists() and not stage.path.exists() and logged


def test_a_deep_stage_under_a_deep_tmpdir_still_binds_its_socket(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # A Slurm task's TMPDIR is its scratch folder under the test's own: 83 bytes with pytest's numbering here, where
    # a TMPDIR kept elsewhere of the system's temporary directory left no room for the socket.
    deep_tmpdir = tmp_path / ("t" * 80)
    deep_tmpdir.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep_tmpdir))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    with staging.Stage(deep_tmpdir / "suite" / "staging") as stage:
        assert not stage.tmp.is_relative_to(deep_tmpdir), stage.tmp
        _bind_socket_in(stage.tmp)
        elsewhere = stage.tmp
    assert not elsewhere.exists()


def test_no_short_temporary_directory_is_one_clear_error(tmp_path: Path) -> None:
    deep = str(tmp_path / ("t" * 100))
    with pytest.raises(RuntimeError, match=f"tried {deep} \\({len(deep)} bytes\\): set TMPDIR to a short writable"):
        staging.short_temporary_root((deep,))
    missing = "/no-such-folder"
    with pytest.raises(RuntimeError, match="tried /no-such-folder"):
        staging.short_temporary_root((missing,))
    assert staging.short_temporary_root((missing, "/tmp")) == "/tmp"
