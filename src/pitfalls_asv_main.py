"""asv's command line, with its machine file written whole and under a lock, so that two runs can start at once.

asv rewrites ``~/.asv-machine.json`` whenever a run loads its machine (``Machine.load`` saves what it read back),
by truncating the file and writing it again. A second asv run that reads the file at that moment sees half of it,
logs "Error parsing JSON" and exits 1; two runs that save different machines can also lose one's entry. Here each
save is a read-modify-write under an exclusive ``flock`` on ``<file>.lock``, and the new content replaces the old by
an atomic rename, so a reader sees the old file or the new one, never a part. Every asv command the suite starts
goes through `command` (``python -m pitfalls_asv_main ...``), and the suite's own machine record through
`save_machine`. `atomic_write`, the rename, is the suite's one way to write a file whole (``pitfalls.report``
re-exports it).

Kept outside the ``pitfalls`` package, as ``pitfalls_asv`` is: importing ``pitfalls`` would import torch into asv's
own process.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "command", "install", "main", "save_machine"]


def command(python: str) -> list[str]:
    """The argv prefix that runs asv's command line through this module with the interpreter ``python``."""
    return [python, "-m", "pitfalls_asv_main"]


def atomic_write(path: Path, write: Callable[[Path], object]) -> Path:
    """Create ``path`` through a temporary file in the same folder renamed into place, so no reader (and no
    interrupted run) ever sees a half-written file.

    Args:
        path: the final file.
        write: called with the temporary path; must write the whole file there.

    Returns:
        ``path``.
    """
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    os.close(handle)
    try:
        # mkstemp makes the file private (0600); a report or a machine file is read like any other file.
        os.chmod(temporary, 0o644)
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def save_machine(name: str, info: Mapping[str, Any], path: str | os.PathLike[str] | None = None) -> None:
    """Set the entry ``name`` of asv's machine file to ``info``, keeping the other entries, whole and under a lock.

    Args:
        name: the machine name.
        info: its facts, as asv's ``MachineCollection.save`` takes them.
        path: the machine file (default asv's own, ``~/.asv-machine.json``).
    """
    from asv import util
    from asv.machine import MachineCollection

    target = Path(path if path is not None else MachineCollection.get_machine_file_path())
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target):
        machines = util.load_json(str(target)) if target.is_file() else {}
        machines[name] = dict(info)
        # asv's own layout (indent 4, sorted keys, the api version), so that asv and its users read it as before.
        text = json.dumps({**machines, "version": MachineCollection.api_version}, indent=4, sort_keys=True)
        atomic_write(target, lambda partial: partial.write_text(text, encoding="utf-8"))


def _save(_cls: type, machine_name: str, machine_info: Mapping[str, Any], _path: str | None = None) -> None:
    save_machine(machine_name, machine_info, _path)


def install() -> None:
    """Make asv save its machine file through `save_machine`, in this process."""
    from asv.machine import MachineCollection

    MachineCollection.save = classmethod(_save)


def main() -> None:
    """Run asv's command line (``sys.argv``) with `save_machine` in place of asv's machine-file save."""
    from asv.main import main as asv_main

    install()
    asv_main()


if __name__ == "__main__":
    main()
