"""The one launcher (pitfalls.processes), with real short-lived processes: a time limit, a grace, a group stop."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from pitfalls import processes

# A child that says it is ready once its SIGTERM handling is in place (and, with a grandchild, its pid).
IGNORES_TERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); " \
               "time.sleep(120)"
WITH_GRANDCHILD = textwrap.dedent("""
    import signal, subprocess, sys, time
    grandchild = subprocess.Popen([sys.executable, "-c", {grandchild!r}], stdout=subprocess.PIPE, text=True)
    grandchild.stdout.readline()
    print(grandchild.pid, flush=True)
    time.sleep(120)
""")


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether ``pid`` has ended (or is a zombie left for its parent) within ``within_s``."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if not processes.alive(psutil.Process(pid)):
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def started(code: str) -> tuple[subprocess.Popen, str]:
    child = processes.start(python(code), stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    return child, child.stdout.readline().strip()


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace() -> None:
    child, line = started(IGNORES_TERM)
    assert line == "ready"
    began = time.monotonic()
    assert processes.stop([child], grace_s=1.0) == [child.pid]
    assert child.returncode == -signal.SIGKILL  # reaped: stop waited for it
    assert time.monotonic() - began >= 1.0  # it had its grace first


def test_a_child_that_obeys_sigterm_ends_the_grace_early() -> None:
    child, _ = started("print('ready', flush=True); import time; time.sleep(120)")
    began = time.monotonic()
    processes.stop([child], grace_s=60.0)
    assert child.returncode == -signal.SIGTERM
    assert time.monotonic() - began < 30.0  # not the whole minute's grace


def test_a_grandchild_in_the_group_dies_too_even_one_that_outlives_its_parent() -> None:
    # The child obeys SIGTERM at once; its child ignores it and is left by its parent: the group's SIGKILL ends it.
    child, line = started(WITH_GRANDCHILD.format(grandchild=IGNORES_TERM))
    grandchild = int(line)
    assert os.getpgid(grandchild) == child.pid  # the child leads the group its descendants share
    processes.stop([child], grace_s=1.0)
    assert child.returncode == -signal.SIGTERM
    assert gone(grandchild)


def test_a_timeout_returns_what_ran_and_stops_it() -> None:
    began = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as stopped:
        processes.run(python("import time; print('begun', flush=True); time.sleep(120)"), timeout_s=2.0,
                      grace_s=1.0, stdout=subprocess.PIPE, text=True)
    assert stopped.value.output == "begun\n" and stopped.value.timeout == 2.0  # what it wrote before the limit
    assert time.monotonic() - began < 60.0


def test_a_command_that_ends_in_time_returns_its_status_and_output() -> None:
    code = "import os, sys; print(os.environ['PLANTED']); print('err', file=sys.stderr); sys.exit(3)"
    done = processes.run(python(code), timeout_s=60.0, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, "PLANTED": "out"})
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_a_child_reaped_elsewhere_is_never_signalled(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its pid may be another process's by now: neither SIGTERM nor SIGKILL goes to that group.
    child = processes.start(python("pass"))
    child.wait()
    signalled: list[tuple[int, int]] = []
    monkeypatch.setattr(os, "killpg", lambda group, signum: signalled.append((group, signum)))
    assert processes.stop([child], grace_s=5.0) == []
    assert signalled == []


def test_processes_found_by_a_lookup_are_stopped_with_their_groups() -> None:
    # A process this one did not start as a child of the call (asv's forkserver, say), found by the lookup.
    outsider, line = started(WITH_GRANDCHILD.format(grandchild=IGNORES_TERM))
    grandchild = int(line)
    try:
        found = [psutil.Process(outsider.pid)]
        assert processes.stop(found=lambda: found, grace_s=1.0) == [outsider.pid]
        assert gone(outsider.pid) and gone(grandchild)
    finally:
        outsider.kill()
        outsider.wait()


def test_run_takes_capture_output_as_subprocess_run_does() -> None:
    done = processes.run([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                         timeout_s=60, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")
