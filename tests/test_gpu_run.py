"""The budgeted GPU run's schedule (a fake clock, planted costs), its costs, its stop at the budget with real
processes, its command line, and its pieces against the suite they slice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pitfalls.gpu_run import pieces as catalogue
from pitfalls.gpu_run.costs import HEADROOM, Costs, merge_costs, run_costs
from pitfalls.gpu_run.plan import DONE, FAILED, OVER_BUDGET, STOPPED, Entry, Piece, schedule
from pitfalls.gpu_run.run import RunOptions, run

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.cuda_build  # also in the test command's CUDA-build leg


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def planted(name: str, seconds: float, group: int = 1) -> Piece:
    return Piece(name, group, f"planted {name}", {"cpu": seconds, "cuda": seconds})


def test_a_piece_whose_cost_does_not_fit_is_listed_over_budget_and_the_next_that_fits_still_runs() -> None:
    clock = FakeClock()
    took = {"a": 12.0, "c": 4.0}
    launched: list[tuple[str, float]] = []

    def launch(piece: Piece, timeout_s: float) -> tuple[int | None, bool]:
        launched.append((piece.name, timeout_s))
        clock.now += took[piece.name]
        return 0, False

    entries = schedule([planted("a", 10), planted("b", 50), planted("c", 5)], budget_s=40,
                       cost=lambda p: (p.guess_s["cpu"], "guess"), launch=launch, clock=clock, margin_s=15)
    assert [(e.name, e.status) for e in entries] == [("a", DONE), ("b", OVER_BUDGET), ("c", DONE)]
    assert entries[1].reason == "over budget: needs about 50 s, 28 s left"
    assert [name for name, _ in launched] == ["a", "c"]
    assert launched[0][1] == 40 + 15 and launched[1][1] == 28 + 15  # each may run to the budget plus the margin
    assert all(e.cost_s <= e.left_s for e in entries if e.started)


def test_a_piece_that_outruns_the_budget_is_stopped_and_one_that_fails_is_failed() -> None:
    clock = FakeClock()
    planted_s = {"slow": 100.0, "broken": 1.0}

    def launch(piece: Piece, timeout_s: float) -> tuple[int | None, bool]:
        if planted_s[piece.name] > timeout_s:
            clock.now += timeout_s
            return None, True
        clock.now += planted_s[piece.name]
        return 3, False

    entries = schedule([planted("slow", 5), planted("broken", 1)], budget_s=60, cost=lambda p: (p.guess_s["cpu"], "g"),
                       launch=launch, clock=clock, margin_s=10)
    assert entries[0].status == STOPPED and entries[0].seconds == 70 and entries[0].exit_code is None
    assert entries[1].status == OVER_BUDGET  # the stopped piece spent the budget
    broken = schedule([planted("broken", 1)], budget_s=60, cost=lambda p: (1.0, "g"), launch=launch, clock=clock)
    assert (broken[0].status, broken[0].exit_code, broken[0].reason) == (FAILED, 3, "exit 3")


def test_costs_recorded_per_kind_with_headroom_else_the_stated_guess(tmp_path: Path) -> None:
    piece = planted("asv x", 90)
    costs = Costs({"gpu-nvidia-h200": {"asv x": 20.0}})
    assert costs.cost(piece, "gpu-nvidia-h200", "cuda") == (20.0 * HEADROOM, "recorded on gpu-nvidia-h200")
    assert costs.cost(piece, "gpu-nvidia-a10g", "cuda") == (90.0, "guess")
    entries = [Entry("asv x", 1, DONE, 90, "guess", 400, 31.24, 0), Entry("y", 1, STOPPED, 5, "g", 10, 25.0),
               Entry("z", 1, OVER_BUDGET, 500, "g", 10)]
    run_file = tmp_path / "costs.json"
    run_file.write_text(json.dumps(run_costs("gpu-nvidia-a10g", entries)))
    cost_file = tmp_path / "committed.json"
    assert merge_costs(run_file, cost_file) == ["asv x", "y"]
    assert Costs.read(cost_file).recorded == {"gpu-nvidia-a10g": {"asv x": 31.2, "y": 25.0}}
    # A stopped piece's seconds are a lower bound: they never lower a recorded cost.
    run_file.write_text(json.dumps(run_costs("gpu-nvidia-a10g", [Entry("y", 1, STOPPED, 5, "g", 10, 12.0)])))
    assert merge_costs(run_file, cost_file) == []
    cost_file.write_text("[1, 2]")
    with pytest.raises(ValueError, match="is not a cost file"):
        Costs.read(cost_file)


def _python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_a_piece_stopped_by_the_budget_leaves_the_earlier_pieces_results_intact(tmp_path: Path) -> None:
    out = tmp_path / "run"
    result = out / "results" / "m" / "first.json"
    first = Piece("first", 1, "writes a result", {"cpu": 1}, _python(
        f"import pathlib; p = pathlib.Path({str(result)!r}); p.parent.mkdir(parents=True); p.write_text('42')"))
    # Its recorded cost says 1 s: it starts, then sleeps past the budget and its margin.
    hog = Piece("hog", 2, "outruns the budget", {"cpu": 1}, _python("import time; time.sleep(120)"))
    never = Piece("never", 3, "does not fit", {"cpu": 999}, _python("raise SystemExit(9)"))
    archive = tmp_path / "run.tar.gz"
    status = run(out, RunOptions(budget_s=4, device="cpu", costs_file=tmp_path / "costs.json", archive=archive,
                                 pieces=(first, hog, never), margin_s=2))
    assert status == 1
    ledger = json.loads((out / "run.json").read_text())
    by_name = {p["name"]: p for p in ledger["pieces"]}
    assert by_name["first"]["status"] == DONE and by_name["never"]["status"] == OVER_BUDGET
    hog_entry = by_name["hog"]
    assert hog_entry["status"] == STOPPED and hog_entry["seconds"] < 60  # stopped, not left to sleep its 120 s
    assert result.read_text() == "42"
    with tarfile.open(archive) as tar:
        assert tar.extractfile("gpu-run/results/m/first.json").read() == b"42"  # type: ignore[union-attr]
        assert "gpu-run/report.md" in tar.getnames()
    report = (out / "report.md").read_text()
    assert "over budget: needs about 999 s" in report and "stopped by the budget: 1 piece(s)" in report
    assert json.loads((out / "costs.json").read_text())["pieces"]["hog"]["at_least"] is True


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "scripts/gpu-run", *args], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env={**os.environ, "PYTHON": sys.executable})


@pytest.mark.parametrize(("args", "said"), [
    (("OUT", "--budget", "soon", "--device", "cpu"), "'soon' is not a number of seconds"),
    (("OUT", "--budget", "-5", "--device", "cpu"), "the budget must be more than 0 seconds"),
    (("OUT", "--budget", "60", "--device", "cpu", "--only", "headline loss,headline lost"),
     "--only: no such piece 'headline lost'"),
    (("OUT", "--budget", "60"), "no CUDA device here"),
    (("merge", "no/such/archive.tar.gz"), "no such archive or folder"),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], said: str) -> None:
    done = _cli(*(str(tmp_path / "out") if a == "OUT" else a for a in args))
    assert done.returncode == 2
    assert said in done.stderr.strip().splitlines()[-1]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out").exists()


def test_a_run_refuses_a_folder_that_holds_files(tmp_path: Path) -> None:
    (tmp_path / "kept.txt").write_text("an earlier run's")
    done = _cli(str(tmp_path), "--budget", "60", "--device", "cpu")
    assert done.returncode == 2 and "is not an empty folder" in done.stderr.splitlines()[-1]
    assert (tmp_path / "kept.txt").read_text() == "an earlier run's"


def test_merge_of_something_that_is_no_run_says_so(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.tar.gz"
    with tarfile.open(bogus, "w:gz") as tar:
        tar.add(__file__, arcname="elsewhere/file.py")
    done = _cli("merge", str(bogus), "--results", str(tmp_path / "results"))
    assert done.returncode == 2 and "is not a gpu-run archive" in done.stderr.splitlines()[-1]
    assert not (tmp_path / "results").exists()


def test_every_slice_is_a_class_of_the_suite_and_selects_its_device_cases() -> None:
    suite = json.loads((ROOT / "results" / "benchmarks.json").read_text())
    slices = [*catalogue._LOSS_SAMPLER, *catalogue._COMPILE, *catalogue._LOADER, *catalogue._PARALLEL,
              *catalogue._CALIBRATION]
    assert {s.name for s in slices} == {p.name for p in catalogue.PIECES if p.name.startswith("asv ")}
    for piece in slices:
        names = [name for name in suite if name.startswith(f"{piece.module}.{piece.cls}.")]
        assert names, f"{piece.name}: no such benchmark class"
        has_device = "device" in suite[names[0]]["param_names"]
        assert has_device == piece.device_axis, piece.name
        assert ("mode" in suite[names[0]]["param_names"]) == piece.mode_axis or not piece.device_axis, piece.name
    step = catalogue.AsvSlice("bench_loss", "Step")
    import re

    on_gpu, on_cpu = re.compile(step.selection("cuda")), re.compile(step.selection("cpu"))
    case = "bench_loss.Step.time_step('naive', 4, 64, '{}', '{}')"
    assert on_gpu.search(case.format("cuda", "compiled")) and not on_gpu.search(case.format("cpu", "eager"))
    assert on_cpu.search(case.format("cpu", "eager")) and not on_cpu.search(case.format("cpu", "compiled"))


def test_the_pieces_are_in_their_priority_order_and_every_one_has_both_guesses() -> None:
    groups = [piece.group for piece in catalogue.PIECES]
    assert groups == sorted(groups) and set(groups) == {1, 2, 3, 4}
    assert len({p.name for p in catalogue.PIECES}) == len(catalogue.PIECES)
    assert all(set(piece.guess_s) == {"cuda", "cpu"} for piece in catalogue.PIECES)
    first = [p.name for p in catalogue.PIECES if p.group == 1]
    assert first[:2] == ["asv bench_loss.Cuda", "asv bench_loss.Nvml"] and first[-1] == "asv bench_sampler.Compile"


def _archive_with(path: Path, member: tarfile.TarInfo, data: bytes = b"") -> Path:
    import io

    with tarfile.open(path, "w:gz") as tar:
        good = tarfile.TarInfo("gpu-run/report.md")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"ok"))
        member.size = len(data) if member.isfile() else 0
        tar.addfile(member, io.BytesIO(data) if member.isfile() else None)
    return path


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info


def _device(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.CHRTYPE
    return info


# The archive's members must all sit under gpu-run/ to be read at all; these do, and still reach out of it.
@pytest.mark.parametrize(("member", "said"), [
    (tarfile.TarInfo("gpu-run/../../escaped.txt"), "would be written outside"),
    (_link("gpu-run/out", "../../escaped.txt"), "links to '../../escaped.txt'"),
    (_link("gpu-run/abs", "/etc/passwd"), "links to '/etc/passwd'"),
    (_link("gpu-run/hard", "../escaped.txt", tarfile.LNKTYPE), "links to '../escaped.txt'"),
    (_device("gpu-run/dev"), "neither a file, a folder nor a link"),
], ids=["dotdot", "symlink-out", "absolute-link", "hardlink-out", "device"])
@pytest.mark.parametrize("tar_filter", ["own", "without-tarfile's-data-filter"])
def test_an_archive_that_reaches_out_of_its_folder_is_refused_before_any_file_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, member: tarfile.TarInfo, said: str, tar_filter: str) -> None:
    from pitfalls.gpu_run.archive import unpack

    if tar_filter != "own":
        # The Pythons before 3.11.4 and 3.10.12 have no tarfile.data_filter: the suite's own check stands alone.
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    archive = _archive_with(tmp_path / "evil.tar.gz", member, b"x")
    into = tmp_path / "deep" / "into"
    into.mkdir(parents=True)
    with pytest.raises(ValueError, match="is not a gpu-run archive") as raised:
        unpack(archive, into)
    assert said in str(raised.value) and "\n" not in str(raised.value)
    assert list(into.iterdir()) == [] and not (tmp_path / "escaped.txt").exists()
    assert not (tmp_path / "deep" / "escaped.txt").exists()


def test_without_tarfiles_data_filter_a_run_unpacks_with_its_links_inside_and_its_owner_dropped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from pitfalls.gpu_run.archive import unpack

    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    member = tarfile.TarInfo("gpu-run/results/m/r.json")
    member.mode, member.uid, member.uname = 0o6777, 4242, "stranger"
    archive = _archive_with(tmp_path / "run.tar.gz", member, b"{}")
    with tarfile.open(archive) as tar:
        assert {m.name for m in tar.getmembers()} == {"gpu-run/report.md", "gpu-run/results/m/r.json"}
    run = unpack(archive, tmp_path)
    written = run / "results" / "m" / "r.json"
    assert written.read_bytes() == b"{}" and (run / "report.md").read_bytes() == b"ok"
    assert written.stat().st_mode & 0o7777 == 0o755
    linked = _archive_with(tmp_path / "linked.tar.gz", _link("gpu-run/latest", "report.md"))
    (tmp_path / "second").mkdir()
    assert (unpack(linked, tmp_path / "second") / "latest").read_bytes() == b"ok"
