"""The doctor's ranking and its baseline gate, on hand-made findings: no script runs."""

from __future__ import annotations

import pytest

from pitfalls.doctor import baseline
from pitfalls.doctor.report import CompileSummary, DoctorReport, Finding, StepsDone, rank
from pitfalls.doctor.rules import model, syncs

SCRIPT = "/work/train.py"


def finding(kind="sync", line=10, per_step=1.0, ms=None, title=".item()", rule="scalar read", code="x.item()"):
    return Finding(kind=kind, title=title, path=SCRIPT, line=line, code=code, per_step=per_step, ms_per_step=ms,
                   cost="", fix="", rule=rule, function="main")


def report(*findings: Finding) -> DoctorReport:
    steps = StepsDone(warmup=1, measured=1, memory=1, before_scan=1, scanned=5, gpu=0, counted_by="optimizer", total=9)
    return DoctorReport(script=SCRIPT, argv=(), steps=steps, ended="", failure=None, step_ms=None, findings=findings,
                        loader=None, compile=CompileSummary((), (), None), memory=None, copies=(), real_syncs=None,
                        bandwidth=(), one_off=(), not_measured=(), wall_s=0.0)


def test_measured_costs_rank_first_the_costliest_first_then_the_rest_by_count_per_step():
    unmeasured_often, unmeasured_rare = finding(line=1, per_step=5.0), finding(line=2, per_step=0.2)
    cheap, dear = finding(line=3, ms=1.0), finding(line=4, ms=30.0)
    uncounted = finding(kind="compile", line=5, per_step=None, rule="graph break")
    ranked = rank([unmeasured_rare, uncounted, cheap, unmeasured_often, dear], step_ms=60.0)
    assert [f.line for f in ranked] == [4, 3, 1, 2, 5]
    assert [f.rank for f in ranked] == [1, 2, 3, 4, 5]
    assert [f.share_of_step for f in ranked] == [0.5, pytest.approx(1 / 60), None, None, None]


def test_ties_keep_the_order_they_came_in_and_no_timed_step_gives_no_share():
    first, second = finding(title="first"), finding(title="second")
    assert [f.title for f in rank([first, second], step_ms=None)] == ["first", "second"]
    assert [f.title for f in rank([second, first], step_ms=None)] == ["second", "first"]
    assert rank([finding(ms=5.0)], step_ms=None)[0].share_of_step is None


def test_the_gate_fails_on_a_new_line_or_a_count_that_grew_and_passes_what_fell_or_went():
    item = syncs.RULES[3]  # the scalar read: its counts are exact on a CPU, so the gate holds them
    assert item.name == "scalar read" and item.gated
    before = report(finding(line=10, per_step=1.0), finding(line=20, per_step=2.0, code="y.item()"),
                    finding(line=30, per_step=1.0, code="z.item()"))
    saved = baseline.entries(before)
    saved_counts = {key: count for key, (_line, count) in saved.items()}
    after = report(finding(line=11, per_step=1.0),  # moved down a line: the same line by its code
                   finding(line=21, per_step=3.0, code="y.item()"),  # grew
                   finding(line=40, per_step=0.2, code="w.item()"))  # new; z.item() is gone
    gate = baseline.compare(saved_counts, after, "b.json")
    assert gate.failed
    assert [(c.code, c.line, c.after) for c in gate.added] == [("w.item()", 40, 0.2)]
    assert [(c.code, c.before, c.after) for c in gate.grew] == [("y.item()", 2.0, 3.0)]
    assert [(c.code, c.line, c.before) for c in gate.removed] == [("z.item()", None, 1.0)]
    fewer = baseline.compare(saved_counts, report(finding(line=10, per_step=0.5)), "b.json")
    assert not fewer.failed and [c.code for c in fewer.shrank] == ["x.item()"]


def test_the_gate_holds_only_the_rules_whose_counts_are_exact_and_names_a_rule_by_its_name():
    tf32 = finding(kind="rule", title="3 float32 matmul(s) a step at 1 line(s), without TF32",
                   rule=model.TF32_MATMUL.name, code="y = head(x)")
    measured = finding(kind="loader", title="the DataLoader: waits", rule="loader-bound", code="for x in loader:")
    keys = set(baseline.entries(report(tf32, measured)))
    assert keys == {("rule", model.TF32_MATMUL.name, "<script>", "main", "y = head(x)")}
