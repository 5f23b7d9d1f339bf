"""Why a figure of the doctor's report was not measured: every reason it gives, in one place."""

from __future__ import annotations

__all__ = ["NO_BREAK_COST", "NO_CPU_COST", "NO_FIX_COST", "NO_GPU", "NO_LOADER", "NO_TIMED_STEP", "SCRIPT_NO_GPU",
           "gpu_figures", "not_measured"]

NO_GPU = "no GPU"
# Where a GPU is present but the script never initialized CUDA.
SCRIPT_NO_GPU = "the script used no GPU"
NO_CPU_COST = "cost not measurable on a CPU"
# A rule's cost on a GPU: what its fix saves needs the step run with the fix.
NO_FIX_COST = "what the fix saves needs the step run with it"
NO_BREAK_COST = "it needs the step without the break"
NO_TIMED_STEP = "no step was timed"
NO_LOADER = "the timed steps took no batch from a DataLoader"


def gpu_figures(no_gpu: str) -> tuple[str, ...]:
    """What only a GPU measures, each with why it was not (``no_gpu``: `NO_GPU` or `SCRIPT_NO_GPU`)."""
    return (
        f"real syncs by line (CUDA's sync debug mode): {no_gpu}",
        f"what each sync stalls the step: {no_gpu} (the syncs are counted; their {NO_CPU_COST})",
        f"copy costs (bytes over the device's bandwidth): {no_gpu}",
        f"the CUDA allocator's peak: {no_gpu} (the process group's memory instead)",
    )


def not_measured(no_gpu: str, phases: tuple[str, ...], timed: bool, loader: bool, compiled: bool) -> tuple[str, ...]:
    """Every figure of a run that was not measured, and why.

    Args:
        no_gpu: why the GPU's figures were not measured ("" when they were).
        phases: a sentence for each phase the run did not take in full (`phases.Phases.short`).
        timed: a step was timed.
        loader: the timed steps took a batch from a DataLoader.
        compiled: the script compiled something (a graph break's cost is then not measured).
    """
    missing = [*(gpu_figures(no_gpu) if no_gpu else ()), *phases]
    if not timed:
        missing.append(f"step time and the loader's wait: {NO_TIMED_STEP}")
    elif not loader:
        missing.append(f"the loader's wait: {NO_LOADER}")
    if compiled:
        missing.append(f"what a graph break costs a step: {NO_BREAK_COST}")
    return tuple(missing)
