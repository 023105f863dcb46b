"""Processes the benchmarks start: a `dchag` job under GNU time (its peak RSS), torchrun
commands for benchmark workers, a part's JSON lines as they come, a training run whose worker
is killed once and must resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

TIME = "/usr/bin/time"  # GNU time (Debian: time)


def run_job(args: list[str], log: Path) -> dict:
    """Run `dchag ARGS` in a fresh process: its wall time and peak RSS.

    The job is started by GNU time, which reports its child's peak RSS: a process forked
    from this one (wait4 here) would report at least this process's own peak, since Linux
    carries a forked process's high-water mark across exec."""
    if not os.access(TIME, os.X_OK):
        raise SystemExit(f"{TIME} is needed to measure a job's peak RSS (apt-get install time)")
    t0 = time.perf_counter()
    usage_file = log.with_suffix(".usage")
    with open(log, "w") as f:
        code = subprocess.call(
            [TIME, "-f", "%M %U %S", "-o", str(usage_file), sys.executable, "-m", "dchag", *args],
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    wall = time.perf_counter() - t0
    if code:
        raise RuntimeError(f"dchag {args[0]} failed ({code}); see {log}")
    max_kb, user, system = usage_file.read_text().split()[-3:]
    return {
        "job": args[0],
        "seconds": round(wall, 2),
        "peak_rss_mb": round(int(max_kb) / 1024, 1),
        "cpu_s": round(float(user) + float(system), 2),
        "load_avg_1min": round(os.getloadavg()[0], 2),  # the machine is shared: how busy it was
    }


def torchrun(nproc: int, *target: str) -> list[str]:
    """torchrun (this interpreter's) starting ``nproc`` local workers of ``target`` (a script
    and its arguments, or ``-m module ...``)."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}", *target]


def json_lines(text: str) -> list[dict]:
    """The JSON objects a worker printed, one a line, among its other output."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def stream_json(cmd: list[str], log: Path, on_result: Callable[[dict], None], env: dict | None = None) -> None:
    """Run ``cmd``; each JSON line it prints goes to ``on_result`` as it comes (a stop at a
    time limit keeps the lines already printed), everything else to ``log``."""
    with (
        open(log, "w") as err,
        subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env) as proc,
    ):
        try:
            for line in proc.stdout:
                if line.startswith("{"):
                    on_result(json.loads(line))
                else:
                    err.write(line)
        finally:
            if proc.poll() is None:
                proc.terminate()
    if proc.returncode:
        raise SystemExit(f"{' '.join(cmd[-3:])} failed (exit {proc.returncode}):\n{log.read_text()[-3000:]}")


def children(pid: int) -> list[int]:
    """The process ids ``pid`` started (every thread's children)."""
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def ranks(pid: int) -> list[int]:
    """The ranks under launcher ``pid``: its descendants that lead a session of their own (torchrun
    starts each rank in one, and so does a rank of `dchag launch-train`, forked from a server)."""
    found, todo = [], [pid]
    while todo:
        try:
            below = children(todo.pop())
        except FileNotFoundError:  # it ended
            continue
        for p in below:
            try:
                leads = os.getsid(p) == p
            except ProcessLookupError:
                continue
            (found if leads else todo).append(p)
    return sorted(found)


def kill_once_past(cmd: list[str], log: Path, partial: Path, rows: int, env: dict, timeout: float = 600) -> tuple:
    """Run ``cmd`` (a launcher); once ``partial`` holds more than ``rows`` lines, kill its first
    rank (SIGKILL) once. (returncode, whether a rank was killed)."""
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    killed = None
    try:
        while proc.poll() is None and killed is None:
            if partial.exists() and len(partial.read_text().splitlines()) > rows:
                workers = ranks(proc.pid)
                if workers:
                    killed = workers[0]
                    os.kill(killed, signal.SIGKILL)
            time.sleep(0.05)
        proc.wait(timeout=timeout)
    finally:  # stopped (a time limit) or failed here: torchrun stops its workers on SIGTERM
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    return proc.returncode, killed is not None


def du(path: Path) -> int:
    """Bytes of the files under ``path``."""
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def drop_cache(path: Path) -> None:
    """Drop a store's pages from the page cache (no root needed: the files' own advice)."""
    os.sync()
    for f in Path(path).rglob("*"):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
