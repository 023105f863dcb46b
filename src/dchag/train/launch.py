"""Starting `dchag train` under torchrun: standalone on one machine, or one torchrun per node
inside a Slurm allocation with c10d rendezvous on the job's first node.

On a cluster, run one task per node, e.g. ``srun --ntasks-per-node 1 dchag launch-train ...``;
every task derives the same rendezvous (head node, job id, node count) from Slurm's variables.

torchrun's agent runs in the launcher's own process. Its ranks fork from a server process that
imports torch and the trainer once (``--start-method=forkserver``, :mod:`dchag.train.rank`): a
rank starts in a fraction of a second instead of importing them again, as does every rank of a
restart. A worker that ends on a user's error
(one line, :func:`report_error`) leaves that line in the error file torchrun gives it
(``TORCHELASTIC_ERROR_FILE``); the launcher ends with that line, not with torchrun's
``ChildFailedError`` report. A worker that fails otherwise (a bug, a signal) keeps torchrun's report.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from ..errors import DchagError

log = logging.getLogger(__name__)

SIGNALS_TO_HANDLE = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"  # torchrun's default and SIGUSR1
SHUTDOWN_GRACE_S = "120"  # seconds the ranks get to stop after a signal (torchrun's default: 30)
WORKER_ERROR = "dchag_error"  # marks a worker's one-line user error in torchrun's error file


class WorkerError(DchagError, RuntimeError):
    """A worker of `dchag launch-train` ended on a user's error (its one line)."""


RDZV_BASE_PORT = 29500
RANK_ENTRY = str(Path(__file__).with_name("rank.py"))
TRAINER_MODULES = ("dchag.cli", "dchag.train.trainer")  # what the ranks' fork server imports for `dchag train`
# ...and for any rank: torch.use_deterministic_algorithms and an optimizer's first step import
# torch._inductor (1.3 CPU-s) in every rank that has not. First of all, the ranks' entry: imported,
# it turns the server's collector off for the imports that follow (its docstring).
RANK_MODULES = ("torch._inductor",)
SERVER_FIRST = "dchag.train.rank"


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


def node_count(env: dict) -> int:
    """The nodes of a Slurm allocation (1 outside one)."""
    return int(env.get("SLURM_NNODES") or env.get("SLURM_JOB_NUM_NODES") or 1)


def torchrun_command(
    nproc_per_node: int,
    max_restarts: int,
    train_args: list[str],
    env: dict | None = None,
    module: tuple[str, ...] = ("dchag", "train"),
) -> list[str]:
    """torchrun running ``python -m <module...> <train_args>`` on every rank (forked, through
    :mod:`dchag.train.rank`)."""
    env = dict(os.environ if env is None else env)
    cmd = ["torchrun", f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}"]
    # SIGTERM or SIGUSR1 to the launcher reaches every rank, which finishes its step and
    # checkpoints it (dchag.train.stop) within the grace before SIGKILL (launch sets it)
    cmd += [f"--signals-to-handle={SIGNALS_TO_HANDLE}"]
    nnodes = node_count(env)
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
    return [*cmd, "--start-method=forkserver", "--run-path", RANK_ENTRY, *module, *train_args]


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


def report_error(message: str) -> None:
    """Under torchrun, leave this worker's one-line error where its agent reads it (torchrun's
    per-worker error file); elsewhere nothing."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        with open(path, "w") as f:
            json.dump({"message": message, "timestamp": int(time.time()), WORKER_ERROR: True}, f)
    except OSError:
        pass  # the worker's own output still has the line


def worker_error(failures: dict) -> str | None:
    """The first one-line user error the failed workers reported (earliest, then lowest rank),
    or None when none did. ``failures``: torchrun's rank -> ProcessFailure."""
    reported = sorted(
        (f.timestamp, rank, f.error_file_data["message"])
        for rank, f in failures.items()
        if isinstance(f.error_file_data, dict) and f.error_file_data.get(WORKER_ERROR)
    )
    return reported[0][2] if reported else None


def launch(
    nproc_per_node: int,
    max_restarts: int,
    train_args: list[str],
    threads_per_rank: int | None = None,
    module: tuple[str, ...] = ("dchag", "train"),
    preload: tuple[str, ...] = TRAINER_MODULES,
) -> None:
    """Run torchrun's agent in this process over ``python -m <module> <train_args>`` workers,
    forked from a server that has imported ``preload``; a worker's reported user error ends it
    as :class:`WorkerError`."""
    import multiprocessing

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    from .lock import LAUNCHER_PID

    cmd = torchrun_command(nproc_per_node, max_restarts, train_args, module=module)
    if threads_per_rank:  # the workers inherit this process's environment
        os.environ.update(rank_thread_env({}, threads_per_rank))
    os.environ.setdefault("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", SHUTDOWN_GRACE_S)
    os.environ[LAUNCHER_PID] = str(os.getpid())  # the agent runs in this process
    # The server starts with the first rank, in this environment (the thread counts above included).
    multiprocessing.set_forkserver_preload([SERVER_FIRST, *preload, *RANK_MODULES])
    start_quiet_resource_tracker()
    logging.getLogger("torch.distributed.elastic.multiprocessing.api").addFilter(_exit_without_traceback)
    log.info("%s ...%s", " ".join(cmd[:6]), f" ({threads_per_rank} threads per rank)" if threads_per_rank else "")
    try:
        run(parse_args(cmd[1:]))
    except ChildFailedError as err:
        message = worker_error(err.failures)
        if message is None:
            raise
        raise WorkerError(message) from None
    except SignalException as err:
        raise WorkerError(f"stopped by {err.sigval.name}; {_newest_checkpoint(train_args)}") from None
    finally:
        _stop_fork_server()


def start_quiet_resource_tracker() -> None:
    """Start multiprocessing's resource tracker without its leak warnings. In a rank forked by
    the server, a multiprocessing lock (tqdm's, numcodecs' Blosc lock) is a named semaphore
    that the tracker removes when the rank could not (a rank that torchrun ended by a signal
    after another failed); its "leaked semaphore objects" warning would then come after the
    launcher's one-line error, from the tracker's own process. The tracker still removes them."""
    from multiprocessing import resource_tracker

    before = os.environ.get("PYTHONWARNINGS")
    quiet = "ignore::UserWarning:multiprocessing.resource_tracker"
    os.environ["PYTHONWARNINGS"] = f"{before},{quiet}" if before else quiet
    try:
        resource_tracker.ensure_running()  # its process reads PYTHONWARNINGS; nothing else does
    finally:
        if before is None:
            del os.environ["PYTHONWARNINGS"]
        else:
            os.environ["PYTHONWARNINGS"] = before


def _exit_without_traceback(record: logging.LogRecord) -> bool:
    """torchrun logs a forked rank that exited with the traceback of its own wait for it
    (``ProcessExitedException``), which tells nothing the exit code does not: keep the line, drop
    that traceback (a rank's own exception keeps its traceback)."""
    if record.exc_info and type(record.exc_info[1]).__name__ == "ProcessExitedException":
        record.exc_info, record.exc_text = None, None
    return True


def _stop_fork_server() -> None:
    """End the ranks' fork server and wait for it (it would end with this process anyway), so
    that its CPU time and its ranks' count as this process's children's (GNU time, a job's
    accounting). Python keeps the server's stop private (3.8-3.13: ``ForkServer._stop``)."""
    import signal
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid, stop = getattr(server, "_forkserver_pid", None), getattr(server, "_stop", None)
    if pid:
        # It holds nothing to save or flush (its ranks have ended); ended by its own exit it
        # would first spend ~1 CPU-s tearing down the torch it imported.
        os.kill(pid, signal.SIGKILL)
    if stop is not None:
        stop()


def _newest_checkpoint(train_args: list[str]) -> str:
    """What a rerun of the stopped run continues from (its ranks checkpointed the step they were in)."""
    from .checkpoint.manager import step_checkpoints

    out = Path(train_args[train_args.index("--output") + 1]) / "checkpoints"
    steps = [(s, p) for s, p in step_checkpoints(out) if (p / ".metadata").exists()]
    return f"a rerun continues from {steps[-1][1]}" if steps else "no checkpoint was written: a rerun starts afresh"
