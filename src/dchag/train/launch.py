"""Starting `dchag train` under torchrun: standalone on one machine, or one torchrun per node
inside a Slurm allocation with c10d rendezvous on the job's first node.

On a cluster, run one task per node, e.g. ``srun --ntasks-per-node 1 dchag launch-train ...``;
every task derives the same rendezvous (head node, job id, node count) from Slurm's variables.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import sys

log = logging.getLogger(__name__)

RDZV_BASE_PORT = 29500


def rendezvous_port(env: dict) -> int:
    """The c10d rendezvous port on the head node: ``DCHAG_RDZV_PORT`` if set, else one derived
    from the job id (every node of a job computes the same; two jobs sharing a head node get
    different ones, which a fixed port would not)."""
    if env.get("DCHAG_RDZV_PORT"):
        return int(env["DCHAG_RDZV_PORT"])
    return RDZV_BASE_PORT + int(re.sub(r"\D", "", env.get("SLURM_JOB_ID", "")) or 0) % 2000


def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm's compressed host lists: 'gpu[01-03,07],login1' -> gpu01, gpu02, gpu03, gpu07, login1."""
    hosts = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*", nodelist):
        m = re.fullmatch(r"([^\[]*)\[([^\]]*)\](.*)", part)
        if not m:
            hosts.append(part)
            continue
        prefix, ranges, suffix = m.groups()
        for r in ranges.split(","):
            lo, _, hi = r.partition("-")
            hi = hi or lo
            hosts += [f"{prefix}{i:0{len(lo)}d}{suffix}" for i in range(int(lo), int(hi) + 1)]
    return hosts


def slurm_head_node(env: dict) -> str:
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.split()[0]
    return expand_hostlist(nodelist)[0]


def torchrun_command(
    nproc_per_node: int,
    max_restarts: int,
    train_args: list[str],
    env: dict | None = None,
    module: tuple[str, ...] = ("dchag", "train"),
) -> list[str]:
    """torchrun running ``python -m <module...> <train_args>`` on every rank."""
    env = dict(os.environ if env is None else env)
    cmd = ["torchrun", f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}"]
    nnodes = int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)
    # One node (a laptop, or a one-node Slurm job): standalone picks a free port, so several
    # training jobs can share a node.
    if nnodes > 1 and "SLURM_JOB_ID" in env and (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")):
        cmd += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={slurm_head_node(env)}:{rendezvous_port(env)}",
            f"--rdzv-id={env['SLURM_JOB_ID']}",
        ]
    else:
        cmd += ["--standalone"]
    return [*cmd, "-m", *module, *train_args]


# The thread counts of the math libraries torch may use. Snakemake exports all of them as the
# job's threads, and torchrun passes them to every rank unchanged (it only sets
# OMP_NUM_THREADS=1 when none is set): with N ranks that oversubscribes the cores N times.
THREAD_VARS = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "GOTO_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "NUMEXPR_NUM_THREADS",
)


def rank_thread_env(env: dict, threads_per_rank: int) -> dict:
    return {**env, **{k: str(threads_per_rank) for k in THREAD_VARS}}


def launch(
    nproc_per_node: int,
    max_restarts: int,
    train_args: list[str],
    threads_per_rank: int | None = None,
    module: tuple[str, ...] = ("dchag", "train"),
) -> None:
    from .lock import LAUNCHER_PID

    cmd = torchrun_command(nproc_per_node, max_restarts, train_args, module=module)
    env = rank_thread_env(dict(os.environ), threads_per_rank) if threads_per_rank else dict(os.environ)
    env[LAUNCHER_PID] = str(os.getpid())  # torchrun runs in this process (exec): its workers' parent
    log.info("%s ...%s", " ".join(cmd[:6]), f" ({threads_per_rank} threads per rank)" if threads_per_rank else "")
    if shutil.which(cmd[0], path=env.get("PATH")) is None:  # torch is installed, its script is not on PATH
        cmd = [sys.executable, "-m", "torch.distributed.run", *cmd[1:]]
    os.execvpe(cmd[0], cmd, env)
