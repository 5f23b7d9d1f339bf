"""Article 000, the masked cross-entropy: one SGD training step of the toy segmentation net per call.

Every class sweeps the registry's loss variants; sizes come from the grid (benchmarks/common.py).
"""

from . import common

GRID = common.GRID


class Step:
    """Time and host peak memory of one training step."""

    param_names = ["variant", "batch", "image_size", "device", "mode"]
    params = [common.LOSS_VARIANTS, list(GRID.loss_batch), list(GRID.loss_image_size), list(common.DEVICES),
              list(common.MODES)]
    rounds = GRID.rounds
    repeat = GRID.repeat

    def setup(self, variant, batch, image_size, device, mode):
        self.case = common.case("loss", variant, device, mode, batch=batch, image_size=image_size)

    def time_step(self, *params):
        common.step(self.case)

    def peakmem_step(self, *params):
        common.step(self.case)


class Speedup:
    """Speedup over the article's starting point, the naive variant run eagerly (same sizes and device), timed
    interleaved A B A B in one process. In compiled mode it is the gain of rewriting and compiling together."""

    param_names = Step.param_names
    params = Step.params

    def setup(self, variant, batch, image_size, device, mode):
        sizes = {"batch": batch, "image_size": image_size}
        self.naive = common.case("loss", common.LOSS_VARIANTS[0], device, "eager", **sizes)
        self.case = common.case("loss", variant, device, mode, **sizes)

    def track_speedup(self, *params):
        return common.speedup(self.naive, self.case)

    track_speedup.unit = "x"


class SyncHazards:
    """Ops with data-dependent output shapes or values in one step (each a host-device sync on a GPU).

    Counted on the eager program on any device; compiled mode has no column because the counter runs a compiled
    region eagerly.
    """

    param_names = ["variant", "batch", "image_size", "device"]
    params = [common.LOSS_VARIANTS, list(GRID.loss_batch), list(GRID.loss_image_size), list(common.DEVICES)]

    def setup(self, variant, batch, image_size, device):
        self.case = common.case("loss", variant, device, "eager", batch=batch, image_size=image_size)

    def track_sync_hazards(self, *params):
        return common.sync_hazards(self.case)

    track_sync_hazards.unit = "hazards/step"


class Compile:
    """torch.compile of the forward pass and loss: compile seconds (cold caches) and graph breaks.

    Every case is compiled once, in setup_cache (one process for the class); the figures are looked up per case.
    """

    param_names = SyncHazards.param_names
    params = SyncHazards.params
    timeout = 3600

    def setup_cache(self):
        return common.compile_table("loss", self.param_names, self.params)

    def setup(self, table, *params):
        self.figures = common.compiled_figures(table, params)

    def track_compile_seconds(self, table, *params):
        return self.figures.compile_s

    track_compile_seconds.unit = "seconds"

    def track_graph_breaks(self, table, *params):
        return self.figures.graph_breaks

    track_graph_breaks.unit = "breaks"


class Cuda:
    """What CUDA itself reports for one step: real host-device syncs (sync debug mode) and peak allocated memory."""

    param_names = ["variant", "batch", "image_size", "mode"]
    params = [common.LOSS_VARIANTS, list(GRID.loss_batch), list(GRID.loss_image_size), list(common.MODES)]

    def setup(self, variant, batch, image_size, mode):
        common.require_cuda()
        self.case = common.case("loss", variant, "cuda", mode, batch=batch, image_size=image_size)

    def track_cuda_syncs(self, *params):
        return common.figure(common.cuda_syncs(self.case))

    track_cuda_syncs.unit = "syncs/step"

    def track_cuda_peak_memory(self, *params):
        return common.cuda_peak_mib(self.case)

    track_cuda_peak_memory.unit = "MiB"


class Nvml:
    """What NVML sees while steps loop for a few seconds: GPU busy percent, memory in use, power. CUDA only."""

    param_names = Cuda.param_names
    params = Cuda.params

    def setup(self, variant, batch, image_size, mode):
        common.require_cuda()
        self.window = common.nvml_window(
            common.case("loss", variant, "cuda", mode, batch=batch, image_size=image_size)
        )

    def track_gpu_busy(self, *params):
        return common.nvml_mean(self.window, "utilization_pct")

    track_gpu_busy.unit = "%"

    def track_gpu_memory(self, *params):
        return common.nvml_mean(self.window, "memory_used_mib")

    track_gpu_memory.unit = "MiB"

    def track_gpu_power(self, *params):
        return common.nvml_mean(self.window, "power_w")

    track_gpu_power.unit = "W"
