"""`OneRun`: sibling rows share one planted run; a row that reads again gets a new one."""

from pitfalls.known.one_run import OneRun


def counting() -> tuple[OneRun[int], list[tuple[object, ...]]]:
    calls: list[tuple[object, ...]] = []

    def measure(*args: object) -> int:
        calls.append(args)
        return len(calls)

    return OneRun(measure), calls


def test_the_rows_of_one_run_read_one_measurement() -> None:
    run, calls = counting()
    assert [run.take(row, "cpu") for row in ("uss", "pss", "shm")] == [1, 1, 1]
    assert calls == [("cpu",)]


def test_a_row_that_reads_again_gets_a_new_run_that_its_siblings_then_share() -> None:
    run, calls = counting()
    assert run.take("uss", "cpu") == 1
    assert run.take("uss", "cpu") == 2, "a row measured once more must not read the run it missed on"
    assert run.take("pss", "cpu") == 2
    assert len(calls) == 2


def test_each_set_of_arguments_has_its_own_run() -> None:
    run, calls = counting()
    wait, crossover = run.reader("wait share"), run.reader("starves below")
    assert (wait(0, "cpu"), wait(2, "cpu")) == (1, 2)
    assert (crossover(0, "cpu"), crossover(2, "cpu")) == (1, 2)
    assert calls == [(0, "cpu"), (2, "cpu")]
