"""The sync-hazard counter against CUDA's behaviour: the labelled corpus, ATen's masked_fill_ path on public code,
host copies and the call sites of a helper, through `pitfalls scan`.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console

from pitfalls import cli, scan_corpus
from pitfalls.scan import render, scan_step

EXAMPLES = Path(__file__).resolve().parent / "scan_examples"


def line_in_file(path: Path, text: str) -> int:
    found = [i for i, line in enumerate(path.read_text().splitlines(), start=1) if text in line]
    assert len(found) == 1, f"{text!r} is on {len(found)} lines of {path}"
    return found[0]


def scan_json(capsys, target: str) -> dict:
    assert cli.main(["scan", target, "--json", "--calls", "2"]) == 0
    return json.loads(capsys.readouterr().out)


def per_line(report: dict) -> dict[int, float]:
    lines: dict[int, float] = {}
    for hazard in report["hazards"]:
        lines[hazard["line"]] = lines.get(hazard["line"], 0) + hazard["per_call"]
    return lines


def test_the_corpus_scans_with_precision_and_recall_one_per_line() -> None:
    assert len(scan_corpus.CORPUS) >= 30
    labels = scan_corpus.expected_per_line()
    assert sum(1 for c in scan_corpus.CORPUS if c.syncs == 0) >= 10  # the counter must also stay quiet
    counted, _ = scan_corpus.scan_per_line()
    found = scan_corpus.agreement(counted, labels)
    assert found.wrong == ()
    assert (found.precision, found.recall) == (1.0, 1.0)


def test_a_miscount_lowers_precision_or_recall() -> None:
    # The measure itself can fail: a sync at the wrong line is a false alarm and a miss.
    truth = {("f.py", 1): 1.0, ("f.py", 2): 0.0}
    moved = scan_corpus.agreement({("f.py", 2): 1.0}, truth)
    assert (moved.precision, moved.recall) == (0.0, 0.0)
    extra = scan_corpus.agreement({("f.py", 1): 2.0}, truth)
    assert (extra.precision, extra.recall) == (0.5, 1.0)


def test_the_corpus_helper_keeps_both_call_sites() -> None:
    _, found = scan_corpus.scan_per_line(calls=1)
    path, helper_line = scan_corpus.line_of(scan_corpus._nonzero_rows)
    site = next(s for s in found.sites if s.line and (s.line.path, s.line.lineno) == (path, helper_line))
    callers = sorted((c.frames[0].code, c.count) for c in site.call_sites)
    assert callers == [("_nonzero_rows(d.mask)", 1), ("_nonzero_rows(~d.mask)", 1)]


def test_torchvisions_matcher_and_sampler_scan_as_sixteen_per_call_at_the_where_and_index_write_lines(capsys):
    path = EXAMPLES / "detection.py"
    report = scan_json(capsys, f"{path}:make_step")
    positive = line_in_file(path, "torch.where(labels_per_image >= 1)")
    negative = line_in_file(path, "torch.where(labels_per_image == 0)")
    # pos_mask[positive[perm1]] = 1: integer indices and a Python number, which ATen copies to the device first.
    pos_write = line_in_file(path, "pos_mask[positive[perm1]] = 1")
    neg_write = line_in_file(path, "neg_mask[negative[perm2]] = 1")
    assert report["hazards_per_call"] == 16
    assert per_line(report) == {positive: 4, negative: 4, pos_write: 4, neg_write: 4}
    labels = {h["line"]: h["label"] for h in report["hazards"]}
    assert labels[positive] == labels[negative] == "aten.nonzero.default"
    assert labels[pos_write] == labels[neg_write] == "aten.index_put_.default (host value to device)"


def test_a_step_that_logs_item_and_copies_preds_to_the_cpu_names_both_lines(capsys) -> None:
    path = EXAMPLES / "train_logging.py"
    report = scan_json(capsys, f"{path}:make_step")
    item = line_in_file(path, "loss.item()")
    copy = line_in_file(path, ".cpu())")
    assert per_line(report) == {item: 1, copy: 1}
    by_line = {h["line"]: h for h in report["hazards"]}
    assert by_line[copy]["label"] == "Tensor.cpu (device to host)"
    assert by_line[copy]["op"] == "device-to-host copy (.cpu())"
    assert by_line[item]["op"] == ".item()"


def test_a_helper_called_from_two_lines_shows_both_call_sites_in_json_and_table(capsys) -> None:
    path = EXAMPLES / "train_logging.py"
    report = scan_json(capsys, f"{path}:make_helper_step")
    helper = line_in_file(path, "return mask.nonzero()")
    above = line_in_file(path, "positions(x > 0.5)")
    below = line_in_file(path, "positions(x < -0.5)")
    (hazard,) = report["hazards"]
    assert (hazard["line"], hazard["per_call"]) == (helper, 2)
    sites = sorted((c["frames"][0]["line"], c["per_call"]) for c in hazard["call_sites"])
    assert sites == [(above, 1), (below, 1)]
    frame = hazard["call_sites"][0]["frames"][0]
    assert os.path.realpath(frame["path"]) == os.path.realpath(path) and frame["function"] == "step"

    namespace: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), namespace)  # noqa: S102 (the test's own example file)
    scanned = scan_step(namespace["make_helper_step"](), calls=1)
    console = Console(record=True, width=200)
    render(scanned, console)
    text = console.export_text()
    assert f"<- {path}:{above}" in text or f"train_logging.py:{above}" in text
    assert "positions(x > 0.5)" in text and "positions(x < -0.5)" in text


def test_an_adamw_step_scans_with_no_sync_in_the_optimizer_whether_named_as_step_or_factory(capsys) -> None:
    path = EXAMPLES / "train_adamw.py"
    # The step itself: its first call, when the scan loads it, makes AdamW's host-side step counts.
    report = scan_json(capsys, f"{path}:step")
    assert per_line(report) == {line_in_file(path, "return loss.item()"): 1}
    # A factory: foreach AdamW behind a GradScaler; the scaler's found_inf.item() is the one sync, named as
    # GradScaler's with its rewrite, not as a scalar read of the line's own.
    report = scan_json(capsys, f"{path}:make_step")
    assert per_line(report) == {line_in_file(path, "scaler.step(opt)"): 1}
    (hazard,) = report["hazards"]
    assert hazard["op"] == ".item() of GradScaler's found_inf" and "fused=True" in hazard["rewrite"]


def test_the_gpu_runs_corpus_piece_reports_its_agreement_or_why_not() -> None:
    from pitfalls.devices import cuda_available
    from pitfalls.gpu_run.outcome import render_rows
    from pitfalls.gpu_run.sizes import REHEARSAL
    from pitfalls.gpu_run.syncs import scan_corpus_on_device

    found = scan_corpus_on_device("cpu", REHEARSAL)
    rows = {row["construct"]: row for row in found["rows"]}
    assert set(rows) == {c.name for c in (*scan_corpus.CORPUS, scan_corpus.HELPER)}
    assert rows["bincount"]["label"] == 2 and rows["bincount"]["cpu_scan"] == 2
    assert rows["bool_write_scalar"]["cpu_scan"] == 0 and rows["to_cpu_method"]["cpu_scan"] == 1
    assert rows["adamw_single_tensor_step"]["cpu_scan"] == 0 and rows["grad_scaler_step"]["cpu_scan"] == 1
    assert rows["adamw_capturable_step"]["cpu_scan"].startswith("skipped on cpu: capturable=True needs")
    assert found["agreement"]["cpu scan against labels"] == "precision 1, recall 1, 0 lines differ"
    assert found["agreement"]["cpu scan against cpu scan"] == "precision 1, recall 1, 0 lines differ"
    if not cuda_available():
        assert found["agreement"]["against real CUDA syncs"].startswith("unavailable: no CUDA device")
        assert all(row["cuda_syncs"].startswith("unavailable") for row in rows.values())
    report = render_rows(found["rows"])
    assert "`return torch.bincount(d.labels)`" in report
