"""The doctor's rules as units of one registry: each built-in rule's finding at its planted line with its fix, word
for word, and none on its twin, in each planted script (the rules script; the GPU path's, written for CUDA and run
under --cuda-on-cpu); a rule defined outside the package, with its own instrument, plant and twin, read the same way;
the rows that calibrate them, and one that fails when a rule's instrument is blind."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pitfalls.docs.doctor_rules import rules_lines
from pitfalls.doctor import checks, planted, rules
from pitfalls.doctor.model_watch import ModelWatch
from pitfalls.doctor.report import DoctorReport
from pitfalls.doctor.rules import model
from pitfalls.known.table import CPU, verdict

PLUGIN = Path(__file__).resolve().parent / "doctor_plugin_rule.py"


# The planted scripts whose lines every built-in rule's plant names.
PLANTED = (planted.RULES, planted.GPU_PATH)


@pytest.fixture(scope="module")
def reports() -> dict[Path, DoctorReport]:
    return {script: checks.run_script(str(script), (), CPU) for script in PLANTED}


@pytest.fixture(scope="module")
def report(reports) -> DoctorReport:
    return reports[planted.RULES]


def _planted_in(script: Path, rule: rules.Rule) -> bool:
    return rule.plant.planted.script == script


@pytest.mark.parametrize("script", PLANTED, ids=lambda p: p.name)
def test_each_rule_planted_in_a_script_is_one_finding_at_its_line_and_none_at_its_twin(reports, script):
    found = reports[script]
    assert found.failure is None and found.steps.scanned == checks.RULES_OPTIONS.scanned
    for rule in rules.BUILTIN:
        if _planted_in(script, rule):
            (finding,) = checks.found_at(found, rule, rule.plant.planted)
            assert finding.kind == rule.kind and finding.fix == rule.fix, rule.name
            assert finding.code and finding.path == str(script)
        if rule.plant.right.script == script:
            assert checks.found_at(found, rule, rule.plant.right) == [], rule.name


@pytest.mark.parametrize("script", PLANTED, ids=lambda p: p.name)
def test_every_finding_names_its_rule_whose_fix_is_the_tables_word_for_word(reports, script):
    found = reports[script]
    fixes = {rule.name: rule.fix for rule in rules.BUILTIN}
    assert found.findings and all(f.rule and f.fix == fixes[f.rule] for f in found.findings)
    table = "\n".join(rules_lines())
    assert all(f"| {f.rule} | {f.kind} |" in table and f.fix in table for f in found.findings)


@pytest.mark.parametrize("script", PLANTED, ids=lambda p: p.name)
def test_nothing_but_the_planted_lines_is_found(reports, script):
    found = reports[script]
    planted_lines = {rule.plant.planted.number for rule in rules.BUILTIN if _planted_in(script, rule)}
    assert {f.line for f in found.findings} == planted_lines
    assert len(found.findings) == sum(_planted_in(script, rule) for rule in rules.BUILTIN)


def test_a_rule_finding_names_its_rule_and_function_in_the_json(report):
    (tf32,) = [f for f in report.findings if f.rule == model.TF32_MATMUL.name]
    data = tf32.as_json()
    assert data["kind"] == "rule" and data["rule"] == model.TF32_MATMUL.name and data["function"] == "forward"
    assert data["title"] == "3 float32 matmul(s) a step at 1 line(s), without TF32"  # forward and its 2 backward
    assert data["cost"] == "not measured: no GPU"


def test_the_registry_names_each_rule_once_and_each_plant_names_one_line():
    names = [rule.name for rule in rules.BUILTIN]
    assert len(names) == len(set(names))
    for rule in rules.BUILTIN:
        planted_at, right_at = rule.plant.planted, rule.plant.right
        assert (planted_at.script, planted_at.number) != (right_at.script, right_at.number), rule.name


@pytest.mark.parametrize(("make", "setting"), [
    (lambda p: torch.optim.AdamW(p, foreach=False), "foreach=False"),
    (lambda p: torch.optim.AdamW(p), ""),  # unset: a GPU picks foreach
    (lambda p: torch.optim.AdamW(p, foreach=False, fused=True), ""),
    (lambda p: torch.optim.SGD(p, lr=0.1, differentiable=True), "differentiable=True"),
    (lambda p: torch.optim.LBFGS(p), ""),  # no foreach implementation to switch to
])
def test_an_optimizer_runs_tensor_by_tensor_on_a_gpu_as_its_settings_say(make, setting):
    assert model.tensor_by_tensor(make([torch.nn.Parameter(torch.ones(2))])) == setting


def test_a_blind_matmul_instrument_fails_its_row(monkeypatch):
    monkeypatch.setattr(ModelWatch, "_matmul", lambda self, a, b: None)
    (check,) = [c for c in checks.rule_checks() if c.device == CPU and c.name.startswith(
        f"doctor rule on cpu: {model.TF32_MATMUL.name}, one at")]
    row = verdict(check, check.measure(CPU))
    assert row.verdict == "fail" and row.measured == 0.0


@pytest.fixture
def plugin(monkeypatch):
    monkeypatch.setenv(rules.RULES_ENV, f"{PLUGIN}:RULE")
    rules.reload()
    yield rules.rule("full sort for the top values")
    monkeypatch.delenv(rules.RULES_ENV)
    rules.reload()


def test_a_rule_defined_outside_the_package_fires_on_its_plant_and_not_on_its_twin(plugin):
    assert plugin is not None and rules.load_errors() == ()
    assert plugin in rules.all_rules() and plugin not in rules.BUILTIN
    found = checks.run_script(str(plugin.plant.planted.script), (), CPU)
    (finding,) = checks.found_at(found, plugin, plugin.plant.planted)
    assert (finding.kind, finding.title, finding.per_step, finding.fix) == ("rule", "a full sort", 1.0, plugin.fix)
    assert checks.found_at(found, plugin, plugin.plant.right) == []
    rows = [c for c in checks.rule_checks() if plugin.name in c.name]
    assert [verdict(c, c.measure(CPU)).verdict for c in rows] == ["pass", "pass"]


def test_a_plugin_that_is_not_a_rule_is_left_out_with_its_reason(monkeypatch):
    monkeypatch.setenv(rules.RULES_ENV, f"{PLUGIN}:SCRIPT")
    rules.reload()
    try:
        with pytest.warns(UserWarning, match="rule left out"):
            errors = rules.load_errors()
        assert len(errors) == 1 and "is a PosixPath, not a pitfalls.Rule" in errors[0]
        assert rules.all_rules() == rules.BUILTIN
    finally:
        monkeypatch.delenv(rules.RULES_ENV)
        rules.reload()
