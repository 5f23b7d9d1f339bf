"""A one-node Slurm cluster on loopback, from Debian's packages: started for a test, stopped and removed after it.

One controller (slurmctld) and one node (slurmd) on this machine, authenticated by a munged of its own (a fresh
key, a private socket), every state, spool, pid and log file in one folder, private ports, and
``CommunicationParameters=NoCtldInAddrAny,NoInAddrAny`` so that both daemons bind what the host name resolves to
(a loopback address, or the cluster is not started) instead of every address. No slurmdbd: Slurm's own record of
each finished job is its job-completion log (``jobcomp/filetxt``), and ``scontrol show job`` while it remembers
the job. Stopping cancels the cluster's jobs, stops the daemons by their pid files (munged last) and removes any
process still carrying the cluster's marker in its environment, then the folder.
"""

from __future__ import annotations

import ipaddress
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from sandbox import alive, marked, other_processes

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge", "iproute2")
PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo", "squeue", "scancel", "ss")
MARKER = "PITFALLS_SLURM_CLUSTER"
DAEMONS = ("munged", "slurmctld", "slurmd")
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "DEADLINE",
            "BOOT_FAIL")


def unavailable() -> str | None:
    """Why a cluster cannot be started here, or None: the programs, root, and a host name on loopback."""
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        return (f"no Slurm cluster: {', '.join(missing)} not installed (scripts/test installs the Debian packages "
                f"{' '.join(PACKAGES)} as root)")
    if os.geteuid() != 0:
        return "no Slurm cluster: its daemons run as root and this user is not"
    host = socket.gethostname()
    addresses = host_addresses(host)
    if not addresses or not all(ipaddress.ip_address(address).is_loopback for address in addresses):
        return (f"no Slurm cluster: the host name {host!r} resolves to {', '.join(sorted(addresses)) or 'nothing'}, "
                "not to loopback only, so its daemons would listen beyond this machine")
    return None


def bind_address(host: str) -> str:
    """The address the daemons bind with NoInAddrAny, and the one clients reach them at: the host name's first."""
    return socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)[0][4][0]


def host_addresses(host: str) -> set[str]:
    """Every address ``host`` resolves to (what slurmctld and slurmd bind with NoInAddrAny)."""
    try:
        return {info[4][0] for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)}
    except socket.gaierror:
        return set()


def free_port(address: str) -> int:
    with closing(socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


@dataclass(frozen=True)
class Cluster:
    """A running cluster.

    Attributes:
        folder: every file of the cluster (configuration, key, state, spool, pids, logs).
        conf: its slurm.conf.
        host: the node's name (this machine's host name).
        address: where both daemons listen, what the host name resolves to (a loopback address).
        ports: (slurmctld's, slurmd's).
        partitions: the partitions, the first the default; every one holds the node.
        features: the node's features.
        env: the environment of a client (SLURM_CONF, and the marker every job inherits).
        daemons: each daemon's process, as started and as its pid file names it when the cluster stops.
    """

    folder: Path
    conf: Path
    host: str
    address: str
    ports: tuple[int, int]
    partitions: tuple[str, ...]
    features: tuple[str, ...]
    env: Mapping[str, str]
    daemons: dict[str, psutil.Process] = field(default_factory=dict)

    @property
    def jobcomp(self) -> Path:
        """The job-completion log: one line of ``Key=Value`` fields per finished job."""
        return self.folder / "jobcomp.txt"

    def pid_file(self, daemon: str) -> Path:
        return self.folder / f"{daemon}.pid"

    def client(self, *args: str, timeout: float = 30) -> str:
        """Run a Slurm client (``scontrol ...``) against this cluster; its output (raises on failure)."""
        done = subprocess.run(list(args), env=dict(self.env), capture_output=True, text=True, timeout=timeout,
                              check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
        return done.stdout

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` of one job (an array task as ``ID_TASK``), field by field."""
        return fields(self.client("scontrol", "show", "job", "--oneliner", job_id))

    def completions(self) -> list[dict[str, str]]:
        """The job-completion log, one record per finished job."""
        text = self.jobcomp.read_text() if self.jobcomp.is_file() else ""
        return [fields(line) for line in text.splitlines() if line.strip()]

    def wait(self, job_ids: list[str], timeout: float, until: tuple[str, ...] = FINISHED) -> dict[str, dict[str, str]]:
        """Wait until every job is in one of the states ``until`` (by default: finished); their records."""
        deadline = time.monotonic() + timeout
        while True:
            records = {job_id: self.job(job_id) for job_id in job_ids}
            if all(record.get("JobState") in until for record in records.values()):
                return records
            if time.monotonic() > deadline:
                states = {job_id: record.get("JobState") for job_id, record in records.items()}
                raise TimeoutError(f"jobs not {'/'.join(until)} after {timeout:.0f} s: {states}")
            time.sleep(0.5)


def fields(line: str) -> dict[str, str]:
    """``Key=Value Key=Value ...`` (scontrol's one-liners, the job-completion log) as a dict."""
    out: dict[str, str] = {}
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            out[key] = value
    return out


MUNGE_SOCKET = "munge.socket"


def slurm_conf(cluster: Cluster, short: Path) -> str:
    """The cluster's slurm.conf: one node on loopback, every file in the cluster's folder (its sockets reached
    through ``short``, a short link to it)."""
    folder, host, address, ports = cluster.folder, cluster.host, cluster.address, cluster.ports
    lines = [
        "ClusterName=pitfalls-test",
        f"SlurmctldHost={host}({address})",
        f"SlurmctldPort={ports[0]}",
        f"SlurmdPort={ports[1]}",
        # Bind what the host name resolves to (loopback here), not every address.
        "CommunicationParameters=NoCtldInAddrAny,NoInAddrAny",
        "AuthType=auth/munge",
        "CryptoType=crypto/munge",
        f"AuthInfo=socket={short / MUNGE_SOCKET}",
        "SlurmUser=root",
        "SlurmdUser=root",
        f"StateSaveLocation={folder / 'state'}",
        f"SlurmdSpoolDir={short / 'spool'}",
        f"SlurmctldPidFile={cluster.pid_file('slurmctld')}",
        f"SlurmdPidFile={cluster.pid_file('slurmd')}",
        f"SlurmctldLogFile={folder / 'slurmctld.log'}",
        f"SlurmdLogFile={folder / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc",
        "TaskPlugin=task/none",
        "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_Core_Memory",
        "AccountingStorageType=accounting_storage/none",
        "JobCompType=jobcomp/filetxt",
        f"JobCompLoc={cluster.jobcomp}",
        "MpiDefault=none",
        "ReturnToService=2",
        # The node's size as declared here, whatever the machine has: the test asks for 1 CPU and 1 GB per task.
        "SlurmdParameters=config_overrides",
        f"NodeName={host} NodeAddr={address} CPUs=2 RealMemory=8000 Feature={','.join(cluster.features)} "
        "State=UNKNOWN",
    ]
    for index, partition in enumerate(cluster.partitions):
        default = "YES" if index == 0 else "NO"
        lines.append(f"PartitionName={partition} Nodes={host} Default={default} MaxTime=INFINITE State=UP")
    return "\n".join(lines) + "\n"


def start(command: list[str], log: Path, cluster: Cluster) -> None:
    """Start a daemon of the cluster in the foreground of a process of its own, its output into ``log``."""
    with log.open("ab") as out:
        daemon = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                  env=dict(cluster.env), start_new_session=True)
    cluster.daemons[command[0]] = psutil.Process(daemon.pid)


def wait_for(what: str, ready: Callable[[], bool], timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.is_file() else "(no log)"
            raise TimeoutError(f"{what} not ready after {timeout:.0f} s; {log.name}:\n{tail}")
        time.sleep(0.2)


def daemon_processes(cluster: Cluster) -> dict[str, psutil.Process]:
    """The daemons still running, found by their pid files."""
    found = {}
    for daemon in DAEMONS:
        try:
            found[daemon] = psutil.Process(int(cluster.pid_file(daemon).read_text().split()[0]))
        except (OSError, ValueError, IndexError, psutil.NoSuchProcess):
            continue
    return found


def stop(*found: psutil.Process | None, timeout: float = 15) -> None:
    """SIGTERM to each at once, SIGKILL to those left after ``timeout``; returns once all are gone (reaped, if
    children)."""
    targets = []
    for process in found:
        if process is None:
            continue
        try:
            process.terminate()
            targets.append(process)
        except psutil.NoSuchProcess:
            continue
    _, left = psutil.wait_procs(targets, timeout=timeout)
    for process in left:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(left, timeout=5)


def cancel_jobs(cluster: Cluster, timeout: float = 30) -> None:
    """Cancel every job the cluster still has and wait until its queue is empty."""
    try:
        queued = cluster.client("squeue", "--noheader", "--format=%i").split()
        if queued:
            cluster.client("scancel", *queued)
        deadline = time.monotonic() + timeout
        while cluster.client("squeue", "--noheader", "--format=%i").split() and time.monotonic() < deadline:
            time.sleep(0.5)
    except (RuntimeError, subprocess.TimeoutExpired):
        # The controller did not answer: the sweep of the cluster's processes stops what is left of the jobs.
        return


def shut_down(cluster: Cluster) -> None:
    """Stop the cluster whatever state it is in: jobs, slurmd, slurmctld, anything left of its jobs, munged last."""
    cluster.daemons.update(daemon_processes(cluster))
    controller = cluster.daemons.get("slurmctld")
    if controller is not None and alive([controller]):  # a client would wait seconds for a dead one
        cancel_jobs(cluster)
    stop(cluster.daemons.get("slurmd"))
    stop(cluster.daemons.get("slurmctld"))
    munged = cluster.daemons.get("munged")
    stop(*[process for process in processes(cluster) if munged is None or process.pid != munged.pid], timeout=2)
    stop(munged)


@contextmanager
def local_cluster(folder: Path, partitions: tuple[str, ...] = ("kind-a", "kind-b"),
                  features: tuple[str, ...] = ("kind-a", "kind-b"), timeout: float = 30) -> Iterator[Cluster]:
    """Start a cluster whose files live in ``folder`` (made, then removed); stopped when the block ends.

    Args:
        folder: a folder that does not exist yet.
        partitions: the partitions (the first is the default), each holding the one node.
        features: the node's features.
        timeout: seconds for each daemon to come up.

    Yields:
        The running `Cluster`; its ``env`` is what a client (sbatch, scontrol) needs.
    """
    folder.mkdir(parents=True)
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    host = socket.gethostname()
    address = bind_address(host)
    ports = (free_port(address), free_port(address))
    conf = folder / "slurm.conf"
    key = folder / "munge.key"
    key.write_bytes(secrets.token_bytes(1024))
    key.chmod(0o400)
    env = {**os.environ, "SLURM_CONF": str(conf), MARKER: folder.name + "-" + secrets.token_hex(8)}
    cluster = Cluster(folder=folder, conf=conf, host=host, address=address, ports=ports, partitions=partitions,
                      features=features, env=env)
    with ExitStack() as stack:
        # A Unix socket's path holds at most 107 bytes, and slurmd names its job steps' sockets
        # <SlurmdSpoolDir>/<host>_<job>.<step>: under a long TMPDIR (/tmp/ci.XXXX/tmp/pytest-of-root/...) they did not
        # fit and every job stayed PENDING. The daemons reach the folder's sockets through a short link instead.
        links = Path(tempfile.mkdtemp(prefix="slurm-", dir="/tmp"))
        stack.callback(shutil.rmtree, links, ignore_errors=True)  # the link, not what it points to
        short = links / "c"
        short.symlink_to(folder)
        munge_socket = short / MUNGE_SOCKET
        conf.write_text(slurm_conf(cluster, short))
        stack.callback(shutil.rmtree, folder, ignore_errors=True)
        stack.callback(shut_down, cluster)
        start(["munged", "--foreground", f"--key-file={key}", f"--socket={munge_socket}",
               f"--pid-file={cluster.pid_file('munged')}", f"--log-file={folder / 'munged.log'}",
               f"--seed-file={folder / 'munged.seed'}", "--force"], folder / "munged.out", cluster)
        wait_for("munged", munge_socket.exists, timeout, folder / "munged.log")
        start(["slurmctld", "-D", "-f", str(conf)], folder / "slurmctld.out", cluster)
        wait_for("slurmctld", lambda: ping(cluster), timeout, folder / "slurmctld.log")
        start(["slurmd", "-D", "-f", str(conf)], folder / "slurmd.out", cluster)
        wait_for("the node", lambda: idle(cluster), timeout, folder / "slurmd.log")
        yield cluster


def ping(cluster: Cluster) -> bool:
    try:
        return "UP" in cluster.client("scontrol", "ping", timeout=5)
    except (RuntimeError, subprocess.TimeoutExpired):
        return False


def idle(cluster: Cluster) -> bool:
    try:
        state = cluster.client("sinfo", "--noheader", "--nodes", cluster.host, "--format=%T", timeout=5)
    except (RuntimeError, subprocess.TimeoutExpired):
        return False
    return bool(state.split()) and all(word == "idle" for word in state.split())


def listeners(ports: tuple[int, ...], pids: set[int]) -> list[tuple[str, int]]:
    """(address, port) of each TCP socket listening on one of ``ports`` or owned by one of ``pids`` (``ss -ltnp``)."""
    out = subprocess.run(["ss", "-Hltnp"], capture_output=True, text=True, check=True).stdout
    found = []
    for line in out.splitlines():
        address, _, port = line.split()[3].rpartition(":")
        owners = {int(pid) for pid in re.findall(r"pid=(\d+)", line)}
        if int(port) in ports or owners & pids:
            found.append((address.strip("[]"), int(port)))
    return found


def processes(cluster: Cluster) -> list[psutil.Process]:
    """The cluster's live processes: its daemons, every process carrying its marker (a job's: sbatch exports the
    client's environment) and every process holding one of its files open (slurmstepd, which outlives slurmd)."""
    found = {process.pid: process for process in {**cluster.daemons, **daemon_processes(cluster)}.values()}
    found.update((process.pid, process) for process in marked(cluster.env[MARKER], MARKER))
    found.update((process.pid, process) for process in holding(cluster.folder))
    return alive([process for _, process in sorted(found.items())])


def holding(folder: Path) -> list[psutil.Process]:
    """The processes (other than this one) with a file under ``folder`` open."""
    return other_processes(lambda process: any(Path(file.path).is_relative_to(folder)
                                               for file in process.open_files()))


def stopped(cluster: Cluster) -> list[str]:
    """What the cluster left behind: a process of its daemons or marker, a listener, its folder."""
    left = processes(cluster)
    found = [f"pid {process.pid} ({process.name()})" for process in left]
    found += [f"a listener on {address}:{port}"
              for address, port in listeners(cluster.ports, {process.pid for process in left})]
    if cluster.folder.exists():
        found.append(str(cluster.folder))
    return found


__all__ = ["MARKER", "PACKAGES", "Cluster", "listeners", "local_cluster", "processes", "stopped", "unavailable"]
