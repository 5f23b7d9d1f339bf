"""The command line: list, check (exit status tells whether every variant matches naive)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pitfalls import cli, registry
from pitfalls.devices import cuda_available


def test_list_names_every_variant(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for family in registry.family_names():
        assert family in out
        for variant in registry.variants(family):
            assert variant in out


def test_list_shows_each_familys_floor_and_parameters(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    assert "batch=8, image_size=64" in out and "num_samples=auto" in out and "floor" in out


def test_check_prints_a_row_per_variant_and_exits_zero(capsys):
    assert cli.main(["check", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if " cpu " in line]
    assert len(rows) == sum(len(registry.variants(f)) for f in registry.family_names())
    # Every row matches, or says why it cannot run on this machine (a variant that needs CUDA devices).
    assert all(" yes " in row or "not run here: " in row for row in rows)
    if not cuda_available():
        assert "needs 2 or more CUDA" in " ".join(out.split())
        # A stand-in never passes: gpu_decode's device decoder cannot run here, so its row is n/a with the reason.
        gpu_decode = next(row for row in rows if " gpu_decode " in row)
        assert " yes " not in gpu_decode and " n/a " in gpu_decode
        # rich wraps the detail cell over lines: read the table's words in order, without its borders.
        words = " ".join(out.replace("│", " ").split())
        assert "n/a not run here: OpenCV decoded its JPEG bytes on the host: the device decoder cannot run" in words
        assert "not run here: loader/gpu_decode on cpu" in words


def test_check_exits_nonzero_when_a_variant_differs(capsys, monkeypatch):
    from pitfalls.families import loss

    class Broken(loss.WhereLoss):
        def compute(self, pred, target):
            return 1.01 * super().compute(pred, target)

    monkeypatch.setitem(loss.VARIANTS, "where", Broken)
    assert cli.main(["check", "--device", "cpu"]) == 1
    assert "loss/where on cpu" in capsys.readouterr().out


@pytest.mark.skipif(cuda_available(), reason="this machine has a CUDA device, so cuda is not absent")
def test_check_on_an_absent_device_says_so():
    done = subprocess.run(
        [sys.executable, "-m", "pitfalls.cli", "check", "--device", "cuda"], capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "device cuda is not available here; available: cpu" in done.stdout



def test_check_shows_sync_hazards_per_variant(capsys):
    assert cli.main(["check", "--device", "cpu"]) == 0
    rows = {tuple(cell.strip() for cell in line.split("│")[1:3]): line
            for line in capsys.readouterr().out.splitlines() if " cpu " in line}
    hazards = {key: row.split("│")[6].strip() for key, row in rows.items()}
    # Per call at the smoke size: the loss's six (see docs/families/loss.md), the sampler's two per row.
    assert int(hazards["loss", "naive"]) == 6 and int(hazards["sampler", "nonzero"]) == 2
    assert int(hazards["loss", "ignore_index"]) == 0 and int(hazards["sampler", "static"]) == 0
    # A family whose figures leave sync hazards out (a DataLoader's work happens in other processes) says n/a.
    assert hazards["loader", "naive"] == "n/a"


@pytest.mark.skipif(cuda_available(), reason="checks the reasons printed where there is no CUDA device")
def test_probe_prints_real_figures_and_reasons_for_the_rest(capsys, tmp_path):
    trace = tmp_path / "naive.json"
    assert cli.main(["probe", "loss", "naive", "--batch", "1", "--image-size", "16", "--rounds", "2",
                     "--trace", str(trace)]) == 0
    out = capsys.readouterr().out
    assert "time per call" in out and "aten.nonzero.default" in out
    assert "unavailable: no CUDA device" in out
    assert "unavailable: NVML library not found" in out or "unavailable: case runs on cpu" in out
    assert trace.exists()


def test_probe_refuses_an_unknown_variant(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["probe", "sampler", "naive"])
    assert exit_.value.code == 2
    assert "sampler variant='naive' is not known; allowed: nonzero, static, floor" in capsys.readouterr().err


def test_report_on_a_missing_results_folder_says_so(tmp_path, capsys):
    assert cli.main(["report", "--results", str(tmp_path / "none"), "--out", str(tmp_path / "report")]) == 2
    assert "is not a folder" in capsys.readouterr().out
    assert not (tmp_path / "report").exists()


# Ordinary bad input: one error line under the subcommand's usage, exit 2, never a traceback.
BAD_INPUT = [
    (["sampler", "static", "--n", "-5"], "n=-5 is not allowed; n must be an int >= 1"),
    (["loss", "naive", "--batch", "0"], "batch=0 is not allowed; batch must be an int >= 1"),
    (["loss", "naive", "--image-size", "-64"], "image_size=-64 is not allowed; image_size must be an int >= 1"),
    (["loss", "naive", "--batch", "1", "--image-size", "8", "--rounds", "0"], "rounds must be an int > 0, got 0"),
    (["sampler", "static", "--feature-dim", "0"], "feature_dim=0 is not allowed; feature_dim must be an int >= 1"),
    (["loss", "naive", "--device", "tpu"], "device='tpu' is not a device name; allowed: cpu, cuda, cuda:N"),
    (["sampler", "static", "--n", "many"], "n='many' is not an int"),
    (["sampler", "static", "--num-samples", "5"],
     "num_samples=5 is not allowed; num_samples must be a positive even int"),
    (["sampler", "static", "--param", "k=4"],
     "sampler has no parameter k; allowed: n, batch, feature_dim, num_samples"),
    (["sampler", "static", "--param", "n"], "--param 'n' is not NAME=VALUE"),
    (["loss", "fastest"],
     "loss variant='fastest' is not known; allowed: naive, where, sort_count, ignore_index, floor"),
]


@pytest.mark.parametrize(("args", "message"), BAD_INPUT, ids=[" ".join(a) for a, _ in BAD_INPUT])
def test_bad_probe_input_is_one_line_and_exit_2(args, message, capsys):
    # Any exception other than argparse's exit would fail this test: that is the traceback a user would see.
    with pytest.raises(SystemExit) as exit_:
        cli.main(["probe", *args])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert [line for line in err.splitlines() if "error:" in line] == [f"pitfalls probe {args[0]}: error: {message}"]
    assert err.startswith(f"usage: pitfalls probe {args[0]}")


def test_bad_input_from_the_real_command_prints_no_traceback():
    done = subprocess.run([sys.executable, "-m", "pitfalls.cli", "probe", "loss", "naive", "--device", "tpu"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[-1] == (
        "pitfalls probe loss: error: device='tpu' is not a device name; allowed: cpu, cuda, cuda:N"
    )


@pytest.mark.parametrize("n", [10, 30, 50, 150])
def test_probe_sampler_works_for_any_n_the_default_k_rule_allows(n, capsys):
    # N // 10 is 1, 3, 5, 15 here: K is rounded down to an even number, at least 2.
    assert cli.main(["probe", "sampler", "nonzero", "--n", str(n), "--rounds", "1"]) == 0
    k = max(2, n // 10 // 2 * 2)
    assert f"sampler/nonzero n={n} batch=1 feature_dim=16 num_samples={k}" in capsys.readouterr().out


def test_probe_help_states_the_k_rule(capsys):
    with pytest.raises(SystemExit):
        cli.main(["probe", "sampler", "--help"])
    assert "N/10 rounded down to an even number, at least 2" in " ".join(capsys.readouterr().out.split())


@pytest.mark.slow
def test_a_case_that_fails_to_compile_reads_unavailable_with_the_reason(monkeypatch, capsys):
    import torch

    from pitfalls.families import sampler

    def crash(*args, **kwargs):
        # Built by hand: the constructor's signature changes between torch versions; its fields do not.
        error = torch._dynamo.exc.BackendCompilerFailed.__new__(torch._dynamo.exc.BackendCompilerFailed)
        Exception.__init__(error, "backend='inductor' raised: RuntimeError: inductor fell over")
        error.backend_name, error.inner_exception = "inductor", RuntimeError("inductor fell over")
        raise error

    monkeypatch.setattr(sampler.torch, "compile", lambda fn: crash)
    assert cli.main(["probe", "sampler", "nonzero", "--compiled", "--n", "100", "--rounds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("unavailable: torch.compile failed on torch") and "inductor fell over" in err
    assert len(err.strip().splitlines()) == 1


def test_probe_shows_a_familys_own_figures(capsys):
    # The loader's: bytes per batch from the tensors (8 x 3 x 64 x 64 uint8 images + 8 x 64 x 64 uint8 masks), and
    # DataLoader's prefetch_factor (2) batches in flight for its one worker.
    assert cli.main(["probe", "loader", "uint8", "--image-size", "64", "--batch", "8", "--num-workers", "1",
                     "--rounds", "1"]) == 0
    cells = {row[0]: row[1] for row in
             ([c.strip() for c in line.split("│")[1:-1]] for line in capsys.readouterr().out.splitlines())
             if len(row) == 4 and row[0]}
    assert cells["bytes per batch"] == str(8 * 3 * 64 * 64 + 8 * 64 * 64)
    assert cells["batches in flight"] == "2"
    assert float(cells["samples per second"]) > 0
