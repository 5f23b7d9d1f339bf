"""`pitfalls scan-loader`: a user's own DataLoader measured with the loader family's instruments."""

# Exported as batch_anatomy: `pitfalls.probes.anatomy` stays the module, importable by its dotted path.
from pitfalls.probes.anatomy import Anatomy, TensorInfo, smaller_dtype
from pitfalls.probes.anatomy import anatomy as batch_anatomy
from pitfalls.scan_loader.results import ScanLoaderReport
from pitfalls.scan_loader.scan import ScanOptions, scan_loader

__all__ = ["Anatomy", "ScanLoaderReport", "ScanOptions", "TensorInfo", "batch_anatomy", "scan_loader",
           "smaller_dtype"]
