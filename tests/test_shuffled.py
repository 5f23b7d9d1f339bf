"""The shuffled runner the test command uses: a seeded permutation, module by module, run in that order."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import shuffled

NODES = [f"tests/test_{m}.py::test_{i}" for m in "abcd" for i in range(6)]


def test_the_module_bucket_permutes_modules_and_keeps_each_together():
    order = shuffled.shuffle(NODES, seed=7, bucket="module")
    assert sorted(order) == sorted(NODES) and order != NODES
    modules = [node.split("::")[0] for node in order]
    runs = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    assert sorted(runs) == sorted(set(modules))  # each module is one contiguous run
    assert order == shuffled.shuffle(NODES, seed=7, bucket="module")
    assert order != shuffled.shuffle(NODES, seed=8, bucket="module")


def test_the_longest_modules_are_dealt_first_and_the_rest_keep_their_shuffled_order():
    first = ("tests/test_c.py", "tests/test_a.py")
    plain = [node.split("::")[0] for node in shuffled.shuffle(NODES, seed=7, bucket="module")]
    dealt = [node.split("::")[0] for node in shuffled.shuffle(NODES, seed=7, bucket="module", first=first)]
    modules = list(dict.fromkeys(dealt))
    assert set(modules[:2]) == set(first)
    assert modules[2:] == [m for m in dict.fromkeys(plain) if m not in first]
    assert sorted(dealt) == sorted(plain)


def test_the_global_bucket_mixes_modules():
    order = shuffled.shuffle(NODES, seed=7, bucket="global")
    modules = [node.split("::")[0] for node in order]
    runs = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
    assert sorted(order) == sorted(NODES) and len(runs) > len(set(modules))


def test_pytest_runs_the_tests_in_the_shuffled_order(tmp_path: Path):
    (tmp_path / "tests").mkdir()
    log = tmp_path / "ran.txt"
    for module in ("one", "two"):
        (tmp_path / "tests" / f"test_{module}.py").write_text(textwrap.dedent(f"""
            import pytest
            @pytest.mark.parametrize("case", ["a: b", "c", "d"])
            def test_it(case):
                with open({str(log)!r}, "a") as fh:
                    fh.write("tests/test_{module}.py::test_it[" + case + "]\\n")
        """))
    runner = Path(shuffled.__file__)
    done = subprocess.run([sys.executable, str(runner), "--seed", "11", "-q", "tests"],
                          cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "with --seed 11 --bucket module" in done.stdout and "6 passed" in done.stdout
    collected = [f"tests/test_{m}.py::test_it[{case}]" for m in ("one", "two") for case in ("a: b", "c", "d")]
    assert log.read_text().splitlines() == shuffled.shuffle(collected, 11, "module")


def test_the_ten_slowest_tests_of_both_phases_close_the_run(tmp_path, capsys):
    # Each phase adds its tests' wall and CPU seconds to one file (tests/conftest.py); the run ends with the slowest
    # of all, and the sums.
    durations = tmp_path / "durations.json"
    durations.write_text(json.dumps({f"tests/test_x.py::test_{i}": [i + 0.5, 2.0 * i] for i in range(14)}))
    shuffled.print_slowest(durations)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("the 10 slowest tests of both phases (wall s, CPU s")
    assert [line.split()[-1] for line in lines[1:-1]] == [f"tests/test_x.py::test_{i}" for i in range(13, 3, -1)]
    assert lines[1].split() == ["13.5", "26.0", "tests/test_x.py::test_13"]
    assert lines[-1].split() == ["98.0", "182.0", "all", "14", "tests"]
    shuffled.print_slowest(tmp_path / "none.json")  # a run that measured nothing prints nothing
    assert capsys.readouterr().out == ""


def test_each_test_s_cpu_seconds_reach_the_durations_file_from_every_process(tmp_path: Path):
    # Planted: a test that burns about 1 s of CPU in a child it waits for, one that sleeps 1 s; run across two
    # processes, as the parallel phase is.
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "conftest.py").write_text((Path(shuffled.__file__).parent / "conftest.py").read_text())
    (tmp_path / "tests" / "skips.py").write_text((Path(shuffled.__file__).parent / "skips.py").read_text())
    (tmp_path / "tests" / "test_burn.py").write_text(textwrap.dedent("""
        import subprocess, sys, time
        def test_burn():
            subprocess.run([sys.executable, "-c", "import time\\nend = time.process_time() + 1\\n"
                            "while time.process_time() < end: pass"], check=True)
    """))
    (tmp_path / "tests" / "test_sleep.py").write_text("import time\n\ndef test_sleep():\n    time.sleep(1)\n")
    durations = tmp_path / "durations.json"
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:pitfalls", "-n",
                           "2", "tests"],
                          cwd=tmp_path, capture_output=True, text=True, check=False,
                          env={**os.environ, "PITFALLS_DURATIONS_FILE": str(durations)})
    assert done.returncode == 0, done.stdout + done.stderr
    measured = json.loads(durations.read_text())
    (burn_wall, burn_cpu), (sleep_wall, sleep_cpu) = (measured[f"tests/test_{name}.py::test_{name}"]
                                                      for name in ("burn", "sleep"))
    assert 1.0 <= burn_cpu <= burn_wall + 0.5, measured
    assert sleep_wall >= 1.0 and sleep_cpu < 0.2, measured


def test_the_parallel_phase_deals_the_longest_modules_first(tmp_path: Path):
    # xdist sorts modules by their number of tests unless told not to: the container's few long tests then started
    # minutes into the phase. Planted: the two longest modules with one test each, three others with five each.
    (tmp_path / "tests").mkdir()
    log = tmp_path / "ran.jsonl"
    (tmp_path / "tests" / "conftest.py").write_text(textwrap.dedent("""
        def pytest_addoption(parser):
            parser.addoption("--phase", default=None)
        def pytest_collection_modifyitems(config, items):
            if config.getoption("--phase") == "serial":  # none is marked serial
                config.hook.pytest_deselected(items=list(items))
                items[:] = []
    """))
    longest, others = shuffled.LONGEST[:2], ("tests/test_p.py", "tests/test_q.py", "tests/test_r.py")
    for module in (*longest, *others):
        count = 1 if module in longest else 5
        (tmp_path / module).write_text(textwrap.dedent(f"""
            import json, os, time
            import pytest
            @pytest.mark.parametrize("case", range({count}))
            def test_it(case):
                with open({str(log)!r}, "a") as fh:
                    fh.write(json.dumps([os.environ["PYTEST_XDIST_WORKER"], {module!r}, time.time()]) + "\\n")
        """))
    done = subprocess.run([sys.executable, str(Path(shuffled.__file__)), "--seed", "3", "--parallel", "2", "-q",
                           "-p", "no:pitfalls", "tests"], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = sorted((json.loads(line) for line in log.read_text().splitlines()), key=lambda row: row[2])
    first = {}
    for worker, module, _ in ran:
        first.setdefault(worker, module)
    assert sorted(first.values()) == sorted(longest), ran
    assert "[parallel phase] ran in" in done.stdout


def test_cores_busy_reads_a_planted_kernel_counter(tmp_path: Path, monkeypatch):
    stat = tmp_path / "stat"
    ticks = 100
    monkeypatch.setattr(shuffled.os, "sysconf", lambda name: ticks)
    monkeypatch.setattr(shuffled.os, "cpu_count", lambda: 2)
    # user nice system idle iowait irq softirq steal guest guest_nice, in ticks
    stat.write_text("cpu  1000 0 200 5000 100 0 0 0 300 0\ncpu0 ...\n")
    before = shuffled.cpu_seconds(stat)
    assert before == (12.0, 63.0)  # guest time is inside user: not counted twice
    # 10 s of both cores: 15 s busy (user and system), 5 s idle or waiting on the disk.
    stat.write_text("cpu  2300 0 400 5300 300 0 0 0 300 0\n")
    assert shuffled.cores_busy(before, shuffled.cpu_seconds(stat)) == ", 1.5 of 2 cores busy"
    assert shuffled.cpu_seconds(tmp_path / "none") is None
    assert shuffled.cores_busy(None, before) == ""


def test_both_phases_are_dealt_from_one_collection(tmp_path: Path):
    # The project's own conftest lists the tests marked serial while the runner collects: each phase runs its share
    # and the run collects once.
    (tmp_path / "tests").mkdir()
    for helper in ("conftest.py", "skips.py"):
        (tmp_path / "tests" / helper).write_text((Path(shuffled.__file__).parent / helper).read_text())
    log = tmp_path / "ran.txt"
    (tmp_path / "tests" / "test_mixed.py").write_text(textwrap.dedent(f"""
        import os
        import pytest
        def record(name):
            with open({str(log)!r}, "a") as fh:
                fh.write(name + " " + os.environ.get("PYTEST_XDIST_WORKER", "alone") + "\\n")
        @pytest.mark.parametrize("case", range(3))
        def test_spread(case):
            record(f"spread{{case}}")
        @pytest.mark.serial
        def test_serial():
            record("serial")
    """))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n")
    # Run from a test that is itself in an xdist process: the runner's serial phase must not read that process's
    # PYTEST_XDIST_WORKER as its own.
    env = {name: value for name, value in os.environ.items() if not name.startswith("PYTEST_")}
    done = subprocess.run([sys.executable, str(Path(shuffled.__file__)), "--seed", "5", "--parallel", "2",
                           "-p", "no:pitfalls", "tests"], cwd=tmp_path, capture_output=True, text=True, check=False,
                          env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "collected 4 tests in" in done.stdout and ": 3 for the parallel phase, 1 for the serial one" in done.stdout
    # The runner's own collection, once (pytest's "collected 1 item" headers are the runs').
    assert len(re.findall(r"^collected \d+ tests in", done.stdout, flags=re.MULTILINE)) == 1
    ran = dict(line.split() for line in log.read_text().splitlines())
    assert ran["serial"] == "alone" and all(ran[f"spread{i}"].startswith("gw") for i in range(3)), ran


def _marked_project(tmp_path: Path, module: str, markers: str) -> Callable[..., list[str]]:
    """A project with the suite's conftest and one test module (``module``'s text, with the pytest.ini lines of its
    ``markers``); returns what ``pytest --collect-only`` collects there (test names) for some arguments and
    environment variables."""
    (tmp_path / "tests").mkdir()
    for helper in ("conftest.py", "skips.py"):
        (tmp_path / "tests" / helper).write_text((Path(shuffled.__file__).parent / helper).read_text())
    (tmp_path / "tests" / "test_marked.py").write_text(textwrap.dedent(module))
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nmarkers =\n{markers}")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PYTEST_") and name != "PITFALLS_CUDA_LEG_FOLLOWS"}

    def collected(*args: str, **variables: str) -> list[str]:
        done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:pitfalls", *args],
                              cwd=tmp_path, capture_output=True, text=True, check=False, env={**env, **variables})
        assert done.returncode == 0, done.stdout + done.stderr
        return [line.removeprefix("tests/test_marked.py::") for line in done.stdout.splitlines() if "::" in line]

    return collected


def test_a_part_held_by_a_collected_test_is_left_out_and_runs_where_that_test_is_not_selected(tmp_path: Path):
    # The doctor's calibration rows are a part of the whole table's run: in the whole suite they would run twice,
    # in the CUDA-build leg's `-m cuda_build` (no whole table) they must run.
    collected = _marked_project(tmp_path, """
        import pytest
        def test_whole():
            pass
        @pytest.mark.leg
        @pytest.mark.held_by("tests/test_marked.py::test_whole")
        def test_part():
            pass
    """, "    leg: the leg\n    held_by(nodeid): part\n")
    assert collected("tests") == ["test_whole"]
    assert collected("tests", "-m", "leg") == ["test_part"]


def test_a_test_left_to_the_leg_is_left_out_only_where_the_leg_follows(tmp_path: Path):
    # The GPU run's rehearsal is about a GPU machine's stack: where scripts/test's CUDA-build leg follows, it runs
    # there alone; a run the leg does not follow (a selection, PITFALLS_CUDA_LEG=0) runs it, and so does the leg.
    collected = _marked_project(tmp_path, """
        import pytest
        def test_any_build():
            pass
        @pytest.mark.leg
        @pytest.mark.left_to_the_leg
        def test_gpu_machines_stack():
            pass
    """, "    leg: the leg\n    left_to_the_leg: the leg's\n")
    assert collected("tests", PITFALLS_CUDA_LEG_FOLLOWS="1") == ["test_any_build"]
    both = ["test_any_build", "test_gpu_machines_stack"]
    assert collected("tests", PITFALLS_CUDA_LEG_FOLLOWS="0") == collected("tests") == both
    assert collected("tests", "-m", "leg", PITFALLS_CUDA_LEG_FOLLOWS="0") == ["test_gpu_machines_stack"]
