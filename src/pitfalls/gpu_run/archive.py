"""A run packed into one file and back: a lent machine gives back a handful of files, not a results tree."""

from __future__ import annotations

import os
import tarfile
import tempfile
from pathlib import Path

__all__ = ["ROOT_NAME", "pack", "unpack"]

# Every path in the archive is under this folder.
ROOT_NAME = "gpu-run"


def _kept(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    # A slice's staging copy is asv's scratch, not the run's record.
    return None if any(part.startswith(".slice-") for part in Path(info.name).parts) else info


def pack(out: Path, archive: Path) -> Path:
    """Pack the run folder ``out`` into ``archive`` (a .tar.gz), whole, renamed into place.

    Returns:
        ``archive``.
    """
    archive.parent.mkdir(parents=True, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=archive.parent, prefix=f".{archive.name}.", suffix=".partial")
    os.close(handle)
    try:
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(out, arcname=ROOT_NAME, filter=_kept)
        os.chmod(partial, 0o644)
        os.replace(partial, archive)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
    return archive


def unpack(archive: Path, into: Path) -> Path:
    """Unpack a run's archive into ``into``; returns the run's folder there.

    Raises:
        ValueError: not a run's archive (one line naming it).
    """
    try:
        with tarfile.open(archive, "r:*") as tar:
            names = tar.getnames()
            if not names or any(Path(name).parts[0] != ROOT_NAME for name in names):
                raise ValueError(f"{archive} is not a gpu-run archive: its files are not under {ROOT_NAME}/")
            tar.extractall(into, filter="data")
    except (OSError, tarfile.TarError) as error:
        raise ValueError(f"{archive} is not a gpu-run archive: {type(error).__name__}: {error}") from None
    return into / ROOT_NAME
