"""The main job's staging folder: TMPDIR short enough for asv's forkserver socket, and nothing left behind."""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

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
