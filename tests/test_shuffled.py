"""The shuffled runner the test command uses: a seeded permutation, module by module, run in that order."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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
    # Each phase adds its tests' seconds to one file (tests/conftest.py); the run ends with the slowest of all.
    durations = tmp_path / "durations.json"
    durations.write_text('{' + ", ".join(f'"tests/test_x.py::test_{i}": {i}.5' for i in range(14)) + '}')
    shuffled.print_slowest(durations)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "the 10 slowest tests of both phases:"
    assert [line.split()[-1] for line in lines[1:]] == [f"tests/test_x.py::test_{i}" for i in range(13, 3, -1)]
    shuffled.print_slowest(tmp_path / "none.json")  # a run that measured nothing prints nothing
    assert capsys.readouterr().out == ""
