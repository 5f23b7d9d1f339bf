"""The budgeted GPU run: the GPU work in a fixed priority order, each piece started only when its cost fits.

docs/gpu.md describes the run, its pieces, their costs and the merge; docs/layout.md names the modules.
"""
