"""Families registered by other packages (entry points ``pitfalls.families``) or by ``PITFALLS_FAMILIES``.

Each gets the figures every family has, with no code of its own here: its classes are made from the shapes of
benchmarks/common.py, named after the family (family ``item_loop``: ``ItemLoopTime.time_call``,
``ItemLoopSpeedup.track_speedup``...). With no such family registered, this module holds no benchmark.
"""

from typing import Any

from pitfalls import measure, registry
from pitfalls.family import COMPILE, CUDA, HAZARDS, NVML, SPEEDUP

from . import common, shapes


def _time(self: Any, *_params: Any) -> None:
    measure.step(self.case)


def _peakmem(self: Any, *_params: Any) -> None:
    measure.step(self.case)


def _speedup(self: Any, *_params: Any) -> float:
    return common.speedup(self.naive_case, self.case)


def _hazards(self: Any, *_params: Any) -> int:
    return measure.sync_hazards(self.case)


# A figure of the entry -> (class name suffix, its shape, its methods). The families share one module, so their
# compile classes compile per process (asv keys a setup_cache by module and line: one per module).
_SHAPES = {SPEEDUP: ("Speedup", shapes.Speedup, {"track_speedup": _speedup}),
           HAZARDS: ("SyncHazards", shapes.SyncHazards, {"track_sync_hazards": _hazards}),
           CUDA: ("Cuda", shapes.Cuda, {}), NVML: ("Nvml", shapes.Nvml, {})}


def _compile_setup(self: Any, *params: Any) -> None:
    table = measure.compile_table(self.family, self.param_names, [[value] for value in params])
    shapes.Compile.setup(self, table, *params)


def plugin_classes(module: str) -> dict[str, type]:
    """The classes of every plug-in family, by name, for this module's namespace."""
    classes: dict[str, type] = {}
    for entry in registry.plugin_families():
        prefix = "".join(part.capitalize() for part in entry.name.replace("-", "_").split("_"))
        made: dict[str, tuple[type, dict[str, Any]]] = {
            "Time": (shapes.Time, {"time_call": _time, "peakmem_call": _peakmem})}
        for figure, (name, shape, methods) in _SHAPES.items():
            if figure in entry.figures:
                made[name] = (shape, methods)
        if COMPILE in entry.figures:
            made["Compile"] = (shapes.Compile, {"setup": _compile_setup})
        for name, (shape, methods) in made.items():
            classes[prefix + name] = type(prefix + name, (shape,), {
                **methods, "family": entry.name, "__module__": module, "__qualname__": prefix + name,
                "__doc__": f"{(shape.__doc__ or '').strip()}\n\nFamily {entry.name} (article {entry.article}): "
                           f"{entry.summary}."})
    return classes


globals().update(plugin_classes(__name__))
