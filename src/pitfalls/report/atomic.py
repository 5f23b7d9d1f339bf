"""Files of the report are written whole or not at all."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

__all__ = ["atomic_write"]


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
        # mkstemp makes the file private (0600); a report is meant to be read like any other file.
        os.chmod(temporary, 0o644)
        write(Path(temporary))
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    return path
