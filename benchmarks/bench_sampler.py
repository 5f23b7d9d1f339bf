"""Article 004, the balanced sampler: pick N/10 items, half positive, half negative, per call.

Every class sweeps the registry's sampler variants; N and the batch come from the grid (benchmarks/common.py).
A batch of 32 is one call for the static variant and a Python loop over rows for the nonzero one.
"""

from . import common

GRID = common.GRID


class Sample:
    """Time and host peak memory of one sampling call."""

    param_names = ["variant", "n", "batch", "device", "mode"]
    params = [common.SAMPLER_VARIANTS, list(GRID.sampler_n), list(GRID.sampler_batch), list(common.DEVICES),
              list(common.MODES)]
    rounds = GRID.rounds
    repeat = GRID.repeat

    def setup(self, variant, n, batch, device, mode):
        self.case = common.case("sampler", variant, device, mode, n=n, batch=batch)

    def time_sample(self, *params):
        common.step(self.case)

    def peakmem_sample(self, *params):
        common.step(self.case)


class Speedup:
    """Speedup over the article's starting point, the nonzero variant run eagerly (same sizes and device), timed
    interleaved A B A B in one process. In compiled mode it is the gain of rewriting and compiling together."""

    param_names = Sample.param_names
    params = Sample.params

    def setup(self, variant, n, batch, device, mode):
        self.baseline = common.case("sampler", common.SAMPLER_VARIANTS[0], device, "eager", n=n, batch=batch)
        self.case = common.case("sampler", variant, device, mode, n=n, batch=batch)

    def track_speedup(self, *params):
        return common.speedup(self.baseline, self.case)

    track_speedup.unit = "x"


class SyncHazards:
    """Ops with data-dependent output shapes or values in one call (each a host-device sync on a GPU).

    Counted on the eager program on any device; compiled mode has no column because the counter runs a compiled
    region eagerly.
    """

    param_names = ["variant", "n", "batch", "device"]
    params = [common.SAMPLER_VARIANTS, list(GRID.sampler_n), list(GRID.sampler_batch), list(common.DEVICES)]

    def setup(self, variant, n, batch, device):
        self.case = common.case("sampler", variant, device, "eager", n=n, batch=batch)

    def track_sync_hazards(self, *params):
        return common.sync_hazards(self.case)

    track_sync_hazards.unit = "hazards/call"


class Compile:
    """torch.compile (dynamic=None) of the sampler, swept over every N of the grid in one process: compile
    seconds and graph breaks at the smallest N, and the graphs compiled again for the larger ones.

    Every case is compiled once, in setup_cache (one process for the class); the figures are looked up per case.
    """

    param_names = ["variant", "batch", "device"]
    params = [common.SAMPLER_VARIANTS, list(GRID.sampler_batch), list(common.DEVICES)]
    timeout = 3600

    def setup_cache(self):
        return common.compile_table("sampler", self.param_names, self.params, sweep=("n", GRID.sampler_n))

    def setup(self, table, *params):
        self.figures = common.compiled_figures(table, params)

    def track_compile_seconds(self, table, *params):
        return self.figures.compile_s

    track_compile_seconds.unit = "seconds"

    def track_graph_breaks(self, table, *params):
        return self.figures.graph_breaks

    track_graph_breaks.unit = "breaks"

    def track_recompiles(self, table, *params):
        return self.figures.recompiles

    track_recompiles.unit = "graphs"


class Cuda:
    """What CUDA itself reports for one call: real host-device syncs (sync debug mode) and peak allocated memory."""

    param_names = ["variant", "n", "batch", "mode"]
    params = [common.SAMPLER_VARIANTS, list(GRID.sampler_n), list(GRID.sampler_batch), list(common.MODES)]

    def setup(self, variant, n, batch, mode):
        common.require_cuda()
        self.case = common.case("sampler", variant, "cuda", mode, n=n, batch=batch)

    def track_cuda_syncs(self, *params):
        return common.figure(common.cuda_syncs(self.case))

    track_cuda_syncs.unit = "syncs/call"

    def track_cuda_peak_memory(self, *params):
        return common.cuda_peak_mib(self.case)

    track_cuda_peak_memory.unit = "MiB"


class Nvml:
    """What NVML sees while calls loop for a few seconds: GPU busy percent, memory in use, power. CUDA only."""

    param_names = Cuda.param_names
    params = Cuda.params

    def setup(self, variant, n, batch, mode):
        common.require_cuda()
        self.window = common.nvml_window(common.case("sampler", variant, "cuda", mode, n=n, batch=batch))

    def track_gpu_busy(self, *params):
        return common.nvml_mean(self.window, "utilization_pct")

    track_gpu_busy.unit = "%"

    def track_gpu_memory(self, *params):
        return common.nvml_mean(self.window, "memory_used_mib")

    track_gpu_memory.unit = "MiB"

    def track_gpu_power(self, *params):
        return common.nvml_mean(self.window, "power_w")

    track_gpu_power.unit = "W"
