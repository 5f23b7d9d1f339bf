"""`pitfalls scan-loader`: a user's own DataLoader measured with the loader family's instruments."""

from pitfalls.probes.anatomy import smaller_dtype
from pitfalls.scan_loader.scan import ScanOptions, scan_loader

__all__ = ["ScanOptions", "scan_loader", "smaller_dtype"]
