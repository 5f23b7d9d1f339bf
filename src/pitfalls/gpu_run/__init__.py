"""The budgeted GPU run: the GPU work in a fixed priority order, each piece started only when its cost fits.

``scripts/gpu-run OUT --budget SECONDS`` (`pitfalls.gpu_run.run`), its pieces (`pitfalls.gpu_run.pieces`: the asv
slices, the articles' headlines, the GPU proof's checks in `syncs` and `checks`), their schedule
(`pitfalls.gpu_run.plan`) and costs (`pitfalls.gpu_run.costs`), and the merge that brings a run home
(`pitfalls.gpu_run.merge`). docs/gpu.md says how to run it on an offline GPU machine.
"""
