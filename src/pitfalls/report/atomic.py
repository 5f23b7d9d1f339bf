"""Files of the report are written whole or not at all.

The writer lives in ``pitfalls_asv_main``, outside the package, so that asv's own process (which must not import
torch) writes its machine file the same way.
"""

from pitfalls_asv_main import atomic_write

__all__ = ["atomic_write"]
