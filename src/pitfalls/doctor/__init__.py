"""`pitfalls doctor SCRIPT`: an unmodified training script, run for a few steps under every instrument in turn,
and one report of what slows its step, ranked by cost, each finding with its fix."""

from pitfalls.doctor.options import DoctorOptions
from pitfalls.doctor.proof import gpu_check, rules_check
from pitfalls.doctor.report import DoctorReport, Finding
from pitfalls.doctor.run import run_doctor
from pitfalls.doctor.script import ScriptError

__all__ = ["DoctorOptions", "DoctorReport", "Finding", "ScriptError", "gpu_check", "rules_check", "run_doctor"]
