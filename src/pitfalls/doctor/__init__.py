"""`pitfalls doctor SCRIPT`: an unmodified training script, run for a few steps under every instrument in turn,
and one report of what slows its step, ranked by cost, each finding with its fix.

The way from an instrument to a line of the report::

    steps.StepCounter ── each step's end ──> phases.Phases (the state machine; phases.schedule: the order)
        warmup, timed, before_scan, scanned, memory | gpu: each phase enters its instruments, and when it ends they
        become its record (records.TimedRecord, ScanRecord, MemoryRecord, GpuRecord)
    run.run_doctor ── the records and the run's watches (loader, compile, the rules' own: Rule.watch) ──> records.Seen
        ──> rules.findings: every rule of the registry (rules/: syncs, copies, model, loader, compiled, training,
            settings; plug-ins) turns what was seen into its hits, given its fix and name (rule.Rule) ──> report.rank
        ──> report.DoctorReport ──> render (text) or as_json (--json); reasons: why a figure was not measured
    under torchrun: ranks.Ranks ends each phase with every rank; cli sends each rank's report to rank 0, which
        prints them all (world.combine, world.render_world)
"""

from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.report import DoctorReport, Finding
from pitfalls.doctor.rule import Hit, Plant, Rule, ScriptLine
from pitfalls.doctor.run import run_doctor
from pitfalls.doctor.script import ScriptError

__all__ = ["DoctorOptions", "DoctorReport", "Finding", "Hit", "Plant", "Rule", "ScriptError", "ScriptLine",
           "run_doctor"]
