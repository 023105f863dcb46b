"""A real single-node Slurm cluster on this machine, for the cluster tests.

Installs Debian's slurm-wlm and munge when absent (as root), writes /etc/slurm/slurm.conf
(the executor plugin strips SLURM_CONF inside jobs, so the config must be at the default
path), starts munged, slurmctld and slurmd in the foreground as child processes and stops
exactly those by pid. No systemd, no accounting: job states come from squeue.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from .commands import started

CONF = Path("/etc/slurm/slurm.conf")


def available() -> str | None:
    """None if a cluster can be started here, else why not."""
    if os.geteuid() != 0:
        return "needs root (to install slurm-wlm and munge and run the daemons)"
    if not (shutil.which("apt-get") or shutil.which("slurmctld")):
        return "neither Slurm nor apt-get is installed"
    return None


def install() -> None:
    if all(shutil.which(p) for p in ("slurmctld", "slurmd", "munged", "sbatch", "squeue")):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    cmd = ["apt-get", "install", "-y", "-q", "slurm-wlm", "munge"]
    if subprocess.run(cmd, env=env, capture_output=True).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, check=True)
        subprocess.run(cmd, env=env, capture_output=True, check=True)


def _conf(host: str, cpus: int, mem_mb: int, state: Path) -> str:
    return f"""# written by dchag's tests: a one-node cluster on this machine
ClusterName=dchagtest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
ReturnToService=2
SchedulerType=sched/backfill
StateSaveLocation={state}/ctld
SlurmdSpoolDir={state}/d
SlurmctldPidFile={state}/slurmctld.pid
SlurmdPidFile={state}/slurmd.pid
SlurmctldLogFile={state}/slurmctld.log
SlurmdLogFile={state}/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MinJobAge=300
KillWait=5
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={mem_mb} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP
"""


@contextlib.contextmanager
def cluster(state: Path):
    """Start munged, slurmctld and slurmd; yield; stop them (and only them)."""
    install()
    state.mkdir(parents=True, exist_ok=True)
    for sub in ("ctld", "d"):
        (state / sub).mkdir(exist_ok=True)
    host = socket.gethostname().split(".")[0]
    mem = int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
    CONF.parent.mkdir(parents=True, exist_ok=True)
    old_conf = CONF.read_text() if CONF.exists() else None
    CONF.write_text(_conf(host, os.cpu_count() or 2, mem, state))
    sock_dir = state / "munge"
    sock_dir.mkdir(exist_ok=True)
    for p in [sock_dir, *sock_dir.parents]:  # munged's socket path must be reachable by everyone
        with contextlib.suppress(PermissionError):
            p.chmod(p.stat().st_mode | 0o011)
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True)
    socket_path = sock_dir / "munge.socket.2"
    env = {**os.environ, "MUNGE_SOCKET": str(socket_path)}
    procs = []
    try:
        procs.append(
            subprocess.Popen(
                [
                    "munged",
                    "-F",
                    "--force",
                    "--socket",
                    str(socket_path),
                    "--pid-file",
                    str(state / "munged.pid"),
                    "--log-file",
                    str(state / "munged.log"),
                    "--seed-file",
                    str(state / "munged.seed"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
            )
        )
        _wait(lambda: socket_path.exists(), "munged's socket")
        # Slurm's munge plugins use the default socket path; point it at ours.
        default = Path("/run/munge/munge.socket.2")
        default.parent.mkdir(parents=True, exist_ok=True)
        default.parent.chmod(0o755)
        if default.is_symlink() or default.exists():
            default.unlink()
        default.symlink_to(socket_path)
        procs.append(started(["slurmctld", "-D", "-i"], state / "ctld.out", env=env))
        procs.append(started(["slurmd", "-D"], state / "d.out", env=env))
        _wait(
            lambda: "idle" in subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True).stdout,
            "the node to become idle",
            state,
        )
        yield host
    finally:
        for p in reversed(procs):
            p.terminate()
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
        if old_conf is None:
            CONF.unlink(missing_ok=True)
        else:
            CONF.write_text(old_conf)


def _wait(cond, what: str, state: Path | None = None, timeout: float = 60) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.5)
    logs = ""
    if state:
        logs = "\n".join(
            f"--- {p.name}\n{p.read_text()[-2000:]}" for p in sorted(state.glob("*.log")) + sorted(state.glob("*.out"))
        )
    raise RuntimeError(f"Slurm test cluster: timed out waiting for {what}\n{logs}")
