"""One writer per run: an exclusive lock on ``<run>/.lock`` for the run's lifetime, and workers
that die with their launcher.

The lock is an ``flock`` held by rank 0 of ``dchag train`` (the kernel releases it when the
process ends, however it ends); the file says who holds it (host, pid, start time), so a second
start fails naming the holder. Each worker runs in a session of its own, so a SIGKILLed
launcher would leave its workers writing checkpoints while a rerun resumes:
:func:`die_with_parent` asks the kernel to kill a worker when its launcher dies.
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import os
import signal
import socket
import stat
from pathlib import Path

from ..errors import DchagError


class RunLockedError(DchagError, RuntimeError):
    """Another process trains (or evaluates into) the same run directory."""


class LockFileError(DchagError, OSError):
    """A run directory's lock file is not a regular file (a link, a directory)."""


class RunLock:
    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / ".lock"
        self._fd: int | None = None

    def holder(self) -> str:
        try:
            return self.path.read_text().strip() or "an unknown process"
        except OSError:
            return "an unknown process"

    def _open(self) -> int:
        """The lock file, never followed if it is a link nor truncated on opening, and no other
        name of another file (a hard link): anyone who can write a shared results folder could
        otherwise make it any file the trainer may write."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as err:
            what = "a symbolic link" if self.path.is_symlink() else "a directory" if self.path.is_dir() else None
            raise LockFileError(
                f"cannot lock run directory {self.path.parent}: {self.path} is "
                f"{what or err.strerror}; it must be a regular file (remove it)"
            ) from None
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            raise LockFileError(f"cannot lock run directory {self.path.parent}: {self.path} is not a regular file")
        if info.st_nlink > 1:  # another name of the same file, which taking the lock would empty
            os.close(fd)
            raise LockFileError(
                f"cannot lock run directory {self.path.parent}: {self.path} is a hard link "
                f"({info.st_nlink} names of one file); it must be a file of its own (remove it)"
            )
        return fd

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = self._open()
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunLockedError(
                f"run directory {self.path.parent} is in use by {self.holder()}; wait for it to finish or stop it "
                "(two writers would mix their checkpoints and logs)"
            ) from None
        now = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.write(fd, f"pid {os.getpid()} on host {socket.gethostname()}, since {now}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def check_free(self) -> None:
        """Raise RunLockedError if another process holds the lock (it is not taken)."""
        self.acquire()
        self.release()

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


LAUNCHER_PID = "DCHAG_LAUNCHER_PID"  # set by `dchag launch-train`, which becomes torchrun's agent


def die_with_parent() -> None:
    """Have this process SIGKILLed when its launcher (torchrun's agent) dies (Linux; elsewhere
    nothing); if it is already gone, exit now. The kernel kills it when its parent dies; a
    rank of `dchag launch-train` forked from a server (which outlives the agent while ranks
    hold it open) also watches the launcher itself."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    parent = os.getppid()
    PR_SET_PDEATHSIG = 1
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        return
    launcher = int(os.environ.get(LAUNCHER_PID) or parent)
    try:
        watch = os.pidfd_open(launcher) if launcher != parent else None
    except ProcessLookupError:
        os._exit(1)
    except OSError:  # a kernel before 5.3: the parent's death alone
        watch = None
    if os.getppid() != parent:  # the parent died before the request took effect
        os._exit(1)
    if watch is not None:
        import threading

        threading.Thread(target=_die_when_ended, args=(watch,), name="launcher-watch", daemon=True).start()


def _die_when_ended(pidfd: int) -> None:
    import select

    select.select([pidfd], [], [])  # readable once the process has ended
    os.kill(os.getpid(), signal.SIGKILL)
