"""The doctor's rules on the planted rules script: exactly the planted findings, at their lines, each with its fix;
none on the right-thing lines; and the rows that calibrate them fail when a rule's instrument is blind."""

from __future__ import annotations

import pytest
import torch

from pitfalls.doctor import known as planted
from pitfalls.doctor import rules
from pitfalls.doctor.report import DoctorReport
from pitfalls.known.table import CPU, verdict

SCRIPT = str(planted.RULES_SCRIPT)


@pytest.fixture(scope="module")
def report() -> DoctorReport:
    return planted.run_rules()


def test_each_planted_rule_is_one_finding_at_its_line_with_its_fix(report):
    fixes = {rule.name: rule.fix for rule in rules.RULES}
    for one in planted.PLANTED:
        (finding,) = planted.at_planted(report, one)
        assert finding.fix == fixes[one.rule] if one.kind == "rule" else one.fix in finding.fix
        assert finding.path == SCRIPT and finding.code and finding.per_step and finding.per_step >= 1


def test_nothing_but_the_planted_rules_and_the_loaders_pipeline_is_found(report):
    planted_lines = {planted.lines_marked(one.text)[0] for one in planted.PLANTED}
    loader = planted.lines_marked("for images, labels in DataLoader(")[0]  # its wait and its batch's dtypes
    pinned = planted.lines_marked("# right: a non-blocking copy from pinned memory")[0]
    found = {(f.kind, f.line) for f in report.findings}
    assert {line for _, line in found} == planted_lines | {loader, pinned}
    (copy,) = [f for f in report.findings if f.line == pinned]
    assert copy.kind == "copy" and ", pinned, non-blocking" in copy.title  # its bytes, not a rule
    assert planted.on_right_lines(report) == []
    assert sum(f.kind == "rule" for f in report.findings) == sum(one.kind == "rule" for one in planted.PLANTED)


def test_a_rule_finding_names_its_rule_and_function_in_the_json(report):
    (tf32,) = [f for f in report.findings if f.rule == rules.TF32_MATMUL.name]
    data = tf32.as_json()
    assert data["kind"] == "rule" and data["rule"] == rules.TF32_MATMUL.name and data["function"] == "forward"
    assert data["title"] == "3 float32 matmul(s) a step at 1 line(s), without TF32"  # forward and its 2 backward
    assert data["cost"] == "not measured: no GPU"


@pytest.mark.parametrize(("make", "setting"), [
    (lambda p: torch.optim.AdamW(p, foreach=False), "foreach=False"),
    (lambda p: torch.optim.AdamW(p), ""),  # unset: a GPU picks foreach
    (lambda p: torch.optim.AdamW(p, foreach=False, fused=True), ""),
    (lambda p: torch.optim.SGD(p, lr=0.1, differentiable=True), "differentiable=True"),
    (lambda p: torch.optim.LBFGS(p), ""),  # no foreach implementation to switch to
])
def test_an_optimizer_runs_tensor_by_tensor_on_a_gpu_as_its_settings_say(make, setting):
    assert rules._tensor_by_tensor(make([torch.nn.Parameter(torch.ones(2))])) == setting


def test_a_blind_matmul_instrument_fails_its_row(monkeypatch):
    monkeypatch.setattr(rules.RuleWatch, "_matmul", lambda self, a, b: None)
    (check,) = [c for c in planted.rule_checks()
                if c.device == CPU and rules.TF32_MATMUL.name in c.name]
    row = verdict(check, check.measure(CPU))
    assert row.verdict == "fail" and row.measured == 0.0


def test_the_rules_gpu_piece_runs_on_the_cpu_and_writes_its_report(tmp_path):
    from pitfalls.doctor import rules_check

    found = rules_check(tmp_path, CPU)
    assert [(row["rule"], row["found"]) for row in found["rows"]] == [(one.name, 1) for one in planted.PLANTED]
    assert found["right_lines"]["found"] == 0 and found["error"] is None
    assert "findings, the costliest first" in (tmp_path / "doctor-rules.txt").read_text()
