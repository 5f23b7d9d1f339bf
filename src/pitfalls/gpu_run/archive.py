"""A run packed into one file and back: a lent machine gives back a handful of files, not a results tree."""

from __future__ import annotations

import tarfile
from pathlib import Path

from pitfalls_asv_main import atomic_write

__all__ = ["ROOT_NAME", "UnsafeMember", "pack", "safe_members", "unpack"]

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

    def write(partial: Path) -> None:
        with tarfile.open(partial, "w:gz") as tar:
            tar.add(out, arcname=ROOT_NAME, filter=_kept)

    return atomic_write(archive, write)


class UnsafeMember(ValueError):
    """A member of an archive that would land outside its folder, or is no file, folder or link."""


def safe_members(tar: tarfile.TarFile, into: Path) -> list[tarfile.TarInfo]:
    """The members of ``tar``, each checked to land inside ``into`` as a plain file, folder or link within it.

    The check tarfile's ``filter="data"`` makes, for the Pythons that lack it (before 3.11.4 and 3.10.12): no
    absolute name, no ``..``, no link that points out of the folder, no device or pipe; the members come back
    with their owner dropped and their mode limited to the owner's write and everyone's read and execute.

    Raises:
        UnsafeMember: the first member that would land outside ``into`` or is not a file, folder or link.
    """
    root = into.resolve()
    members = []
    for member in tar.getmembers():
        where = (root / member.name).resolve()
        if Path(member.name).is_absolute() or ".." in Path(member.name).parts or not where.is_relative_to(root):
            raise UnsafeMember(f"{member.name!r} would be written outside {into}")
        if member.issym() or member.islnk():
            # A symbolic link is read from its own folder, a hard link from the archive's root.
            base = where.parent if member.issym() else root
            target = Path(member.linkname)
            if target.is_absolute() or not (base / target).resolve().is_relative_to(root):
                raise UnsafeMember(f"{member.name!r} links to {member.linkname!r}, outside {into}")
        elif not (member.isfile() or member.isdir()):
            raise UnsafeMember(f"{member.name!r} is neither a file, a folder nor a link")
        member.mode &= 0o755
        member.uid = member.gid = 0
        member.uname = member.gname = ""
        members.append(member)
    return members


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
            # Every member is checked before any is written; where tarfile has its own "data" filter (3.11.4,
            # 3.10.12) it checks again, and numeric_owner keeps the dropped owner dropped when root extracts.
            members = safe_members(tar, into)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(into, members=members, filter="data")
            else:
                tar.extractall(into, members=members, numeric_owner=True)
    except (OSError, tarfile.TarError) as error:
        raise ValueError(f"{archive} is not a gpu-run archive: {type(error).__name__}: {error}") from None
    except UnsafeMember as error:
        raise ValueError(f"{archive} is not a gpu-run archive: {error}") from None
    return into / ROOT_NAME
