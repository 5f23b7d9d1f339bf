"""asv's machine file stays whole while several asv processes load and save it at once (two runs started together)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

from asv import util
from asv.machine import MachineCollection

import pitfalls_asv_main

# What asv does at the start of every run (Machine.load reads the file, then saves it back), many times over, while
# other processes do the same for other machines.
_LOAD_AND_SAVE = textwrap.dedent("""
    import sys
    import pitfalls_asv_main
    from asv.machine import Machine

    pitfalls_asv_main.install()
    path, name = sys.argv[1], sys.argv[2]
    Machine.load(_path=path, machine_name=name, machine=name, arch="x86_64", cpu=name * 200)
    for _ in range(150):
        machine = Machine.load(_path=path, machine_name=name)
        assert machine.machine == name and machine.cpu == name * 200, machine.__dict__
""")


def test_processes_loading_and_saving_at_once_read_whole_files_and_keep_every_entry(tmp_path):
    path = tmp_path / ".asv-machine.json"
    names = [f"box{i}" for i in range(4)]
    runs = [
        subprocess.Popen([sys.executable, "-c", _LOAD_AND_SAVE, str(path), name], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
        for name in names
    ]
    outputs = [run.communicate(timeout=300)[0] for run in runs]
    for run, output in zip(runs, outputs, strict=True):
        # asv logs "Error parsing JSON" when it reads half a file, and a lost entry fails the assertion.
        assert run.returncode == 0 and "Error" not in output, output[-2000:]
    machines = util.load_json(str(path), MachineCollection.api_version)
    assert sorted(machines) == names
    assert all(machines[name]["cpu"] == name * 200 for name in names)
    assert not list(tmp_path.glob("*.partial"))


def test_save_keeps_asvs_layout_and_the_other_entries(tmp_path):
    path = tmp_path / "home" / ".asv-machine.json"
    MachineCollection.save("mine", {"machine": "mine", "ram": "1"}, _path=str(path))  # asv's own save
    pitfalls_asv_main.save_machine("box", {"machine": "box", "cpu": "c"}, path)
    text = path.read_text()
    assert json.loads(text)["version"] == MachineCollection.api_version
    assert text == json.dumps(json.loads(text), indent=4, sort_keys=True)
    assert MachineCollection.load("mine", _path=str(path)) == {"machine": "mine", "ram": "1"}
    assert MachineCollection.load("box", _path=str(path)) == {"machine": "box", "cpu": "c"}
    assert oct(path.stat().st_mode & 0o777) == oct(0o644)


def test_the_command_line_is_asvs_with_the_machine_file_saved_whole(tmp_path):
    env = dict(os.environ, HOME=str(tmp_path))
    done = subprocess.run([*pitfalls_asv_main.command(sys.executable), "machine", "--yes", "--machine", "box",
                           "--cpu", "planted"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert MachineCollection.load("box", _path=str(tmp_path / ".asv-machine.json"))["cpu"] == "planted"
    assert (tmp_path / ".asv-machine.json.lock").exists()  # it went through save_machine
