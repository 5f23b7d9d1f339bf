"""`pitfalls scan`: every hazard of a step at the user's source line, on the suite's cases and on a user's file.

Expected lines are found by searching the source text, so the tests follow the code when lines move.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import pytest

from pitfalls import cli
from pitfalls.cases import smoke_case
from pitfalls.families import loss, sampler
from pitfalls.probes.syncs import count_hazards
from pitfalls.probes.trace import hazard_ranges

NONZERO = "aten.nonzero.default"
UNIQUE = "aten._unique2.default"
MASK_INDEX = "aten.index.Tensor (bool mask)"
MASK_INDEX_PUT = "aten.index_put.default (bool mask)"
ITEM = "aten._local_scalar_dense.default"


def line_of(fn, text: str) -> tuple[str, int]:
    """The file and line number of the one line of `fn` that contains `text`."""
    lines, start = inspect.getsourcelines(fn)
    found = [start + i for i, line in enumerate(lines) if text in line]
    assert len(found) == 1, f"{text!r} is on {len(found)} lines of {fn.__qualname__}"
    return os.path.realpath(inspect.getsourcefile(fn)), found[0]


def line_in_file(path: Path, text: str) -> int:
    found = [i for i, line in enumerate(path.read_text().splitlines(), start=1) if text in line]
    assert len(found) == 1
    return found[0]


def scan_json(capsys, *args: str) -> dict:
    assert cli.main(["scan", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def sites(report: dict) -> dict[tuple[str, int, str, bool], float]:
    return {
        (os.path.realpath(h["path"]), h["line"], h["label"], h["backward"]): h["per_call"] for h in report["hazards"]
    }


def per_label(report: dict) -> dict[str, float]:
    totals: Counter[str] = Counter()
    for hazard in report["hazards"]:
        totals[hazard["label"]] += hazard["per_call"]
    return dict(totals)


def counted(family: str, variant: str) -> dict[str, int]:
    """What `pitfalls check` counts for one call of the same case, after a warm-up."""
    case = smoke_case(family, variant)
    case()
    return count_hazards(case).as_dict()


def test_loss_naive_lists_exactly_the_counted_hazards_at_their_lines(capsys):
    report = scan_json(capsys, "loss/naive")
    assert per_label(report) == counted("loss", "naive")
    nonzero = line_of(loss.NaiveLoss.compute, "torch.nonzero(")
    ignore = line_of(loss.NaiveLoss.compute, "target[background] = IGNORE")
    unique = line_of(loss.NaiveLoss.compute, "torch.unique(")
    target_mask = line_of(loss.MaskedLoss.masked_cross_entropy, "= target[mask]")
    pred_mask = line_of(loss.MaskedLoss.masked_cross_entropy, "pred.permute(0, 2, 3, 1)[mask]")
    assert sites(report) == {
        (*nonzero, NONZERO, False): 1,
        # The Python number is copied to the device before the integer-indexed write.
        (*ignore, "aten.index_put_.default (host value to device)", False): 1,
        (*unique, UNIQUE, False): 1,
        (*target_mask, MASK_INDEX, False): 1,
        (*pred_mask, MASK_INDEX, False): 1,
        # The mask's backward scatters the gradient with index_put: reported at the forward line that masked.
        (*pred_mask, MASK_INDEX_PUT, True): 1,
    }
    assert report["hazards_per_call"] == 6


def test_loss_naive_table_ranks_lines_with_their_code_and_rewrite(capsys):
    assert cli.main(["scan", "loss/naive"]) == 0
    out = capsys.readouterr().out
    path, line = line_of(loss.NaiveLoss.compute, "torch.unique(")
    row = next(row for row in out.splitlines() if f"loss.py:{line} " in row)
    assert "torch.unique(target)" in row and "unique" in row and "sort + diff + count_nonzero" in row
    _, mask_line = line_of(loss.MaskedLoss.masked_cross_entropy, "= target[mask]")
    row = next(row for row in out.splitlines() if f"loss.py:{mask_line} " in row)
    assert "masked_target = target[mask]" in row and "boolean-mask index" in row and "torch.where(mask" in row
    _, ignore_line = line_of(loss.NaiveLoss.compute, "target[background] = IGNORE")
    row = next(row for row in out.splitlines() if f"loss.py:{ignore_line} " in row)
    assert "target[background] = IGNORE" in row and "indexed assignment of a" in row and "torch.where(mask, v" in row
    assert "6 per call" in out


def test_loss_ignore_index_scans_clean(capsys):
    assert cli.main(["scan", "loss/ignore_index", "--fail-on-hazards"]) == 0
    assert "no sync hazards found in loss/ignore_index" in capsys.readouterr().out


def test_sampler_nonzero_names_its_two_nonzero_lines(capsys):
    report = scan_json(capsys, "sampler/nonzero", "--calls", "2")
    assert per_label(report) == counted("sampler", "nonzero")
    positive = line_of(sampler.nonzero_sample, "labels == POSITIVE")
    negative = line_of(sampler.nonzero_sample, "labels == NEGATIVE")
    assert sites(report) == {(*positive, NONZERO, False): 1, (*negative, NONZERO, False): 1}
    assert report["calls"] == 2 and all(h["count"] == 2 for h in report["hazards"])


USER_FILE = '''
import torch

x = torch.randn(64)


def step():
    total = 0.0
    for i in range(4):
        total += x[i].item()
    positive = x[x > 0]
    return total, positive


def make_step():
    w = torch.randn(16, requires_grad=True)

    def train():
        loss = w[w > 0].square().sum()
        loss.backward()

    return train


def needs_arguments(batch, lr=0.1):
    return batch


def raises():
    return helper()


def helper():
    raise ValueError("the user's own error")


NOT_A_FUNCTION = 3
'''


@pytest.fixture
def user_file(tmp_path: Path) -> Path:
    path = tmp_path / "train_user.py"
    path.write_text(textwrap.dedent(USER_FILE))
    return path


def test_a_users_file_gets_the_item_loop_and_the_mask_lines(capsys, user_file):
    report = scan_json(capsys, f"{user_file}:step")
    item = line_in_file(user_file, ".item()")
    mask = line_in_file(user_file, "x[x > 0]")
    real = os.path.realpath(user_file)
    assert sites(report) == {(real, item, ITEM, False): 4, (real, mask, MASK_INDEX, False): 1}
    by_line = {h["line"]: h for h in report["hazards"]}
    assert by_line[item]["op"] == ".item()" and by_line[item]["code"] == "total += x[i].item()"
    assert "keep the value on the device" in by_line[item]["rewrite"]
    assert report["hazards"][0]["line"] == item  # ranked by count


def test_a_factory_is_called_once_and_its_step_scanned_with_backward(capsys, user_file):
    report = scan_json(capsys, f"{user_file}:make_step")
    mask = line_in_file(user_file, "w[w > 0]")
    real = os.path.realpath(user_file)
    assert sites(report) == {(real, mask, MASK_INDEX, False): 1, (real, mask, MASK_INDEX_PUT, True): 1}


def test_fail_on_hazards_exits_one_and_trace_holds_the_hazard_ranges(capsys, user_file, tmp_path):
    trace = tmp_path / "scan.json"
    assert cli.main(["scan", f"{user_file}:step", "--fail-on-hazards", "--calls", "2", "--trace", str(trace)]) == 1
    assert f"trace written to {trace}" in capsys.readouterr().out
    assert hazard_ranges(trace) == {ITEM: 8, MASK_INDEX: 2}


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("missing.py:step", "missing.py does not exist"),
        ("{file}:nothing_here", "no 'nothing_here'; it defines: helper, make_step, needs_arguments, raises, step"),
        ("{file}:NOT_A_FUNCTION", "NOT_A_FUNCTION is not callable (it is int 3)"),
        ("{file}:needs_arguments", "needs_arguments needs arguments (batch)"),
        ("no_such_module_xyz:step", "no module named 'no_such_module_xyz'"),
        ("loss/no_such_variant", "family loss has no variant 'no_such_variant'; variants: naive, where"),
        ("{file}", "names no function; expected FILE.py:NAME, MODULE:NAME or FAMILY/VARIANT"),
    ],
)
def test_a_bad_target_gets_one_line_and_exit_two(capsys, user_file, tmp_path, monkeypatch, name, message):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["scan", name.format(file=user_file)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and message in captured.err
    assert captured.err.startswith("pitfalls scan: ")


def test_raising_code_shows_its_own_traceback_marked_as_scanned(capsys, user_file):
    assert cli.main(["scan", f"{user_file}:raises"]) == 2
    err = capsys.readouterr().err
    first, *rest = err.splitlines()
    assert "raised ValueError" in first and "the user's own error" in first and "scanned code" in first
    traceback_text = "\n".join(rest)
    assert traceback_text.startswith("Traceback (most recent call last):")
    assert f'"{user_file}", line {line_in_file(user_file, "raise ValueError")}, in helper' in traceback_text
    # It starts at the scanned code: no frame of the scan machinery above it.
    assert "targets.py" not in traceback_text and "scan.py" not in traceback_text


@pytest.mark.cuda_build
def test_the_real_command_line_in_a_subprocess(user_file):
    command = [sys.executable, "-m", "pitfalls.cli", "scan"]
    env = {**os.environ, "PYTHONPATH": str(user_file.parent)}
    bad = subprocess.run([*command, "train_user:needs_arguments"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2, bad.stderr
    assert bad.stderr.splitlines() == [
        "pitfalls scan: TARGET 'train_user:needs_arguments': needs_arguments needs arguments (batch); give a "
        "function that takes none, or a factory with no arguments that returns one"
    ]
    good = subprocess.run([*command, "train_user:step", "--json"], capture_output=True, text=True, env=env)
    assert good.returncode == 0, good.stderr
    assert per_label(json.loads(good.stdout)) == {ITEM: 4, MASK_INDEX: 1}


@pytest.mark.parametrize(
    ("label", "in_backward", "op", "rewrite"),
    [
        (NONZERO, False, "aten.nonzero", "count_nonzero + topk"),
        (UNIQUE, False, "unique (aten._unique2)", "sort + diff + count_nonzero"),
        ("aten.unique_dim.default", False, "unique (aten.unique_dim)", "sort + diff + count_nonzero"),
        (MASK_INDEX, False, "boolean-mask index", "torch.where(mask, x, fill)"),
        (MASK_INDEX_PUT, True, "boolean-mask index (its backward index_put)", "torch.where(mask, x, fill)"),
        ("aten.index_put_.default (bool mask)", False, "boolean-mask assignment", "torch.where(mask, x, fill)"),
        (ITEM, False, ".item()", "keep the value on the device"),
        ("aten.item.default", False, ".item()", "keep the value on the device"),  # under torch.inference_mode
        ("aten._to_copy.default (device to host)", False, "device-to-host copy", "copy once at the end"),
        ("aten.copy_.default (device to host)", False, "device-to-host copy", "copy once at the end"),
        ("Tensor.to (host to device)", False, "host-to-device copy (.to(device))", "DataLoader(pin_memory=True)"),
        ("Tensor.to of torch.randn's tensor (host to device)", False,
         "host-to-device copy (.to(device)) of a tensor torch.randn made on the host", "make it on the device"),
        ("torch.tensor (host to device)", False, "host-to-device copy (torch.tensor(..., device=...))",
         "make it on the device"),
        ("aten._to_copy.default (host to device)", False, "host-to-device copy (a write of host data)", "x[i:i+1]"),
        ("aten.copy_.default (host to device)", False, "host-to-device copy (a write of host data)", "x[i:i+1]"),
        ("aten.index_put_.default (host value to device)", False, "indexed assignment of a host value",
         "torch.full((), v"),
        ("aten.index_put_.default (bool mask + host value to device)", False,
         "boolean-mask assignment of a host value", "torch.where(mask, v, x)"),
        ("aten.repeat_interleave.Tensor", False, "aten.repeat_interleave", "output_size="),
        (NONZERO, True, "aten.nonzero (backward)", "count_nonzero + topk"),
        ("aten.some_future_op.default", False, "aten.some_future_op", "fixed-shape form"),
    ],
)
def test_every_hazard_label_gets_a_readable_op_and_its_rewrite(label, in_backward, op, rewrite):
    from pitfalls.probes.rewrites import describe

    kind = describe(label, in_backward=in_backward)
    assert kind.op == op and rewrite in kind.rewrite
