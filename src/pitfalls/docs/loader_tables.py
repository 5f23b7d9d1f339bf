"""The loader family's bytes table: the bytes each rung ships (its ladder is `pitfalls.report.ladder`'s)."""

from __future__ import annotations

from pitfalls.docs.registry_tables import builtin_family
from pitfalls.families.loader.variants import DEVICE_NORMALIZED, batch_bytes
from pitfalls.markdown import code, table

__all__ = ["byte_lines"]


def byte_lines() -> list[str]:
    """Bytes per batch of each rung at the article's size and the quick grid's, and what waits in the queue."""
    entry = builtin_family("loader")
    article = entry.resolve(entry.article_sizes[0])
    quick = entry.axes("quick")
    q_batch, q_size = int(quick["batch"][0]), int(quick["image_size"][0])
    workers, prefetch = article["num_workers"], article["prefetch_factor"]
    naive = batch_bytes("naive", article["batch"], article["image_size"])
    rows = []
    for case in entry.cases:
        shipped = batch_bytes(case, article["batch"], article["image_size"])
        rows.append((code(case),
                     "uint8 image, uint8 mask" if case in DEVICE_NORMALIZED else "float32 image, int64 mask",
                     "device" if case in DEVICE_NORMALIZED else "host",
                     f"{shipped:,}", f"{naive / shipped:.0f}x less" if shipped < naive else "-",
                     f"{workers * prefetch * shipped:,}", f"{batch_bytes(case, q_batch, q_size):,}"))
    return [
        *table(("case", "a batch crosses to the device as", "normalized on the",
                f"bytes per batch, {article['batch']} x {article['image_size']}²", "over naive",
                f"waiting in the queue at {workers} workers x prefetch {prefetch}",
                f"bytes per batch, quick grid ({q_batch} x {q_size}²)"), rows),
        "",
        "`gpu_decode` ships JPEG bytes: its row is the decoded size, an upper bound.",
    ]
