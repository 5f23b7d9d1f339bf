"""How the suite drives asv: one staged configuration, one machine record, results merged under a lock.

``scripts/run-suite``, ``scripts/run-history``, ``scripts/compare`` and the budgeted GPU run's asv slices all run
asv through this package (``python -m pitfalls.runner suite|history|compare``; one staged run, `runner.staged`);
``pitfalls merge`` brings several machines' results together. The asv environment plugin it selects
(``installed``) lives in the top-level module ``pitfalls_asv``, so that asv can load it without importing torch.
"""
