"""The byte unit every figure of memory is read in, and bytes written for a reader."""

MIB = 2**20


def human_bytes(size: float) -> str:
    """Bytes in the largest binary unit that keeps the figure at 1 or more."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:,.1f} {unit}" if unit != "B" else f"{size:,.0f} B"
        size /= 1024
    return f"{size:,.1f} GiB"
