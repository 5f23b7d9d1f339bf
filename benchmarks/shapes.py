"""The shapes of the figures every family has: their axes, units and inputs, and the figures whose code is the same
for every family (CUDA's, NVML's, the compiler's). A bench module declares its classes on them and writes out the
others, one delegating line into pitfalls.measure each. Each shape is abstract until a class names its family, so
asv collects none of them from this module.
"""

from typing import Any

from pitfalls import measure, registry

from .common import GRID, NVML_WINDOW_S, FamilyBenchmark, figure, require_cuda, skip, skipping

QUICK_CPU_COMPILED = ("the quick grid does not time a compiled case on a CPU: its compiled speedup and compile "
                      "table measure it (PITFALLS_GRID=full times it)")


class Time(FamilyBenchmark):
    """Time and host peak memory of one call of the case, synchronized. On the quick grid a compiled case on a CPU
    is n/a: its speed is read by the compiled speedup against naive eager, and its compile by the compile table."""

    rounds, repeat = GRID.rounds, GRID.repeat

    def setup(self, *params: Any) -> None:
        args = self.arguments(params)
        if GRID.name == "quick" and args.get("mode") == "compiled" and args.get("device") == "cpu":
            # Each such process imports inductor (2.3 s on a 2-core CPU) before a sample is taken: 46 of them were
            # 166 s of the main job's 10 minutes, for figures the compiled speedup already gives.
            skip(QUICK_CPU_COMPILED)
        super().setup(*params)


class Speedup(FamilyBenchmark):
    """Speedup over the article's starting point, the naive variant run eagerly (same sizes and device), timed
    interleaved A B A B in one process. In compiled mode it is the gain of rewriting and compiling together."""

    units = {"track_speedup": "x"}
    with_naive = True


class SyncHazards(FamilyBenchmark):
    """Ops with data-dependent output shapes or values in one call (each a host-device sync on a GPU), counted on
    the eager program on any device: compiled mode has no column (the counter runs a compiled region eagerly)."""

    mode_axis = False
    units = {"track_sync_hazards": "hazards/{unit}"}


class Compile(FamilyBenchmark):
    """torch.compile of the case's eager program with cold caches, every case compiled once in one process for the
    class (its module's ``setup_cache``: asv keys it by module and line, so each module writes its own)."""

    mode_axis = False
    timeout = 3600
    units = {"track_compile_seconds": "seconds", "track_graph_breaks": "breaks", "track_recompiles": "graphs"}

    def compile_table(self) -> dict[tuple[Any, ...], Any]:
        axes = registry.family(self.family).axes(GRID.name)
        sweep = None if self.sweep_axis is None else (self.sweep_axis, axes[self.sweep_axis])
        return measure.compile_table(self.family, self.param_names, self.params, sweep)  # type: ignore[attr-defined]

    def setup(self, table: dict[tuple[Any, ...], Any], *params: Any) -> None:
        with skipping():
            self.figures = measure.lookup(table, params)

    def track_compile_seconds(self, table: Any, *params: Any) -> float:
        return self.figures.compile_s

    def track_graph_breaks(self, table: Any, *params: Any) -> int:
        return self.figures.graph_breaks


class CompileSweep(Compile):
    """`Compile` swept along one of the family's axes inside one process: also the graphs compiled again."""

    def track_recompiles(self, table: Any, *params: Any) -> int:
        return self.figures.recompiles


class Cuda(FamilyBenchmark):
    """What CUDA itself reports for one call: real host-device syncs (sync debug mode) and peak allocated memory."""

    device_axis = False
    units = {"track_cuda_syncs": "syncs/{unit}", "track_cuda_peak_memory": "MiB"}

    def setup(self, *params: Any) -> None:
        require_cuda()
        self.case = self.build(params)

    def track_cuda_syncs(self, *params: Any) -> float:
        return figure(measure.cuda_syncs(self.case))

    def track_cuda_peak_memory(self, *params: Any) -> float:
        return measure.cuda_peak_mib(self.case)


class Nvml(FamilyBenchmark):
    """What NVML sees while calls loop for a few seconds: GPU busy percent, memory in use, power. CUDA only."""

    device_axis = False
    units = {"track_gpu_busy": "%", "track_gpu_memory": "MiB", "track_gpu_power": "W"}

    def setup(self, *params: Any) -> None:
        require_cuda()
        case = self.build(params)
        self.window = measure.nvml_window(case, case.device, NVML_WINDOW_S)

    def track_gpu_busy(self, *params: Any) -> float:
        return figure(measure.nvml_mean(self.window, "utilization_pct"))

    def track_gpu_memory(self, *params: Any) -> float:
        return figure(measure.nvml_mean(self.window, "memory_used_mib"))

    def track_gpu_power(self, *params: Any) -> float:
        return figure(measure.nvml_mean(self.window, "power_w"))
