"""Every skip is accounted for: the run ends with the skip reasons grouped, allowed (tests/skips.py) or not."""

from __future__ import annotations

import json
import os
import resource
from collections.abc import Iterator
from multiprocessing import resource_tracker
from pathlib import Path

import pytest
from skips import STRICT_ENV, grouped


@pytest.fixture(autouse=True)
def _no_resource_tracker_left_behind() -> Iterator[None]:
    # multiprocessing starts its resource tracker (a child of this process for the rest of the run) for spawned
    # DataLoader workers and shared memory. A test that started it stops it, so that a later test's process group
    # (the group memory sampler counts every descendant) holds only what that test started.
    tracker = resource_tracker._resource_tracker
    running_before = tracker._pid is not None
    yield
    if not running_before and tracker._pid is not None:
        tracker._stop()


@pytest.fixture(scope="session")
def committed_inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HEAD's results/ and proof/ (tests/committed.py), read once: what the tests of the committed pages and results
    read, so that a user's own main job in the working tree leaves them as they are. Outside a git checkout each
    test that reads them fails, saying so."""
    # Imported here: test_shuffled.py and test_skips.py run copies of this file without tests/committed.py.
    from committed import NotACheckout, head_inputs

    try:
        return head_inputs(tmp_path_factory.mktemp("committed"))
    except NotACheckout as error:
        pytest.fail(str(error), pytrace=False)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--phase", choices=("parallel", "serial"), default=None,
                     help="only the tests marked serial (timing and memory figures read against planted values), "
                          "or only the others; tests/shuffled.py --parallel N runs the others across N processes, "
                          "then the serial ones alone")


# tests/shuffled.py's: one collection lists the tests marked serial in this file, so that both phases are dealt
# from it rather than collecting twice.
SERIAL_LIST_ENV = "PITFALLS_SERIAL_LIST"


def _held_elsewhere(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test marked held_by(node id) runs a part of that test's work, for a run that does not select it (the
    # CUDA-build leg's `-m cuda_build`): where both are collected, the part is deselected, not run twice.
    collected = {item.nodeid for item in items}
    _deselect(config, items, [item for item in items
                               if (marker := item.get_closest_marker("held_by")) and marker.args[0] in collected])


def _deselect(config: pytest.Config, items: list[pytest.Item], left: list[pytest.Item]) -> None:
    """Leave ``left`` out of ``items``, reported as deselected."""
    if left:
        config.hook.pytest_deselected(items=left)
        items[:] = [item for item in items if item not in left]


# scripts/test's: set for the run that its CUDA-build leg follows.
LEG_FOLLOWS_ENV = "PITFALLS_CUDA_LEG_FOLLOWS"


def _left_to_the_leg(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test marked left_to_the_leg is about the stack of a GPU machine (the budgeted GPU run's rehearsal): where the
    # CUDA-build leg follows, which runs it on that stack, the run before it leaves it out rather than run it twice.
    if os.environ.get(LEG_FOLLOWS_ENV) != "1":
        return
    _deselect(config, items, [item for item in items if item.get_closest_marker("left_to_the_leg") is not None])


# After pytest's own -m and -k selection: a part is left out only where its whole is still selected.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _held_elsewhere(config, items)
    _left_to_the_leg(config, items)
    listing = os.environ.get(SERIAL_LIST_ENV)
    if listing:
        serial = [item.nodeid for item in items if item.get_closest_marker("serial") is not None]
        Path(listing).write_text(json.dumps(serial))
    phase = config.getoption("--phase")
    if phase is None:
        return
    serial = phase == "serial"
    kept = [item for item in items if (item.get_closest_marker("serial") is not None) == serial]
    left = [item for item in items if (item.get_closest_marker("serial") is not None) != serial]
    if left:
        config.hook.pytest_deselected(items=left)
    items[:] = kept


def _skip_reasons(config: pytest.Config) -> list[str]:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    reasons = []
    for report in getattr(reporter, "stats", {}).get("skipped", []):
        longrepr = report.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
        reasons.append(reason.removeprefix("Skipped: "))
    return reasons


# The test command's slowest tests: each phase adds what its tests took (setup, call and teardown), in wall seconds
# and in CPU seconds of the test's process and the children it waited for, to this file, and tests/shuffled.py
# prints the ten slowest of both phases at the end. The parallel phase keeps both cores busy: what a test costs
# it is its CPU seconds more than its wall time.
DURATIONS_ENV = "PITFALLS_DURATIONS_FILE"
_durations: dict[str, list[float]] = {}
_CPU_AT = pytest.StashKey[float]()
CPU_PROPERTY = "cpu_s"


def _cpu_seconds() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    item.stash[_CPU_AT] = _cpu_seconds()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[pytest.TestReport]:
    report = yield
    if call.when == "teardown" and _CPU_AT in item.stash:
        report.user_properties.append((CPU_PROPERTY, _cpu_seconds() - item.stash[_CPU_AT]))
    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # With xdist the controller receives every worker's reports here (their properties with them); a worker writes
    # nothing itself.
    wall, cpu = _durations.get(report.nodeid, [0.0, 0.0])
    cpu += sum(value for name, value in report.user_properties if name == CPU_PROPERTY)
    _durations[report.nodeid] = [wall + report.duration, cpu]


def _save_durations(config: pytest.Config) -> None:
    path = os.environ.get(DURATIONS_ENV)
    if not path or hasattr(config, "workerinput"):
        return
    file = Path(path)
    known = json.loads(file.read_text()) if file.is_file() else {}
    file.write_text(json.dumps({**known, **_durations}))


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    _save_durations(session.config)
    _, unexpected = grouped(_skip_reasons(session.config))
    if unexpected and os.environ.get(STRICT_ENV) == "1" and exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:  # noqa: ANN001
    ok, unexpected = grouped(_skip_reasons(config))
    if not ok and not unexpected:
        return
    terminalreporter.section("skips")
    for why, count in sorted(ok.items()):
        terminalreporter.line(f"allowed ({why}): {count}")
    for reason, count in sorted(unexpected.items()):
        terminalreporter.line(f"NOT ALLOWED: {count} x {reason}", red=True)
    if unexpected:
        terminalreporter.line(f"{sum(unexpected.values())} skip(s) not on the allow-list of tests/skips.py"
                              + (" fail this run" if os.environ.get(STRICT_ENV) == "1" else ""), red=True)
