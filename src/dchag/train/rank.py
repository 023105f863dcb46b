"""What each rank of `dchag launch-train` runs: ``python -m MODULE ARGS``, in a process torchrun
forks from a server that has already imported MODULE's dependencies (torch, the trainer), rather
than a fresh interpreter importing them again on every rank and every restart. torchrun runs this
file by path (``--run-path``): run so, it imports nothing relative.

Like a rank torchrun starts as a command, it runs in a session of its own: a terminal's Ctrl-C
or a signal to the launcher's process group reaches it through the launcher only.

The server imports this module first (``dchag.train.rank``, ahead of the modules it preloads) and
the collector follows Python's advice for a process that forks without exec (``gc.freeze``): off in
the server, whose imports then make no full passes over a growing heap (0.9 CPU-s of each launch);
in a rank, the server's objects are frozen before it is enabled, so that no pass walks them or
writes to their pages (0.2 CPU-s a rank)."""

import gc
import os
import runpy
import sys

if __name__ == "__main__":
    gc.freeze()
    gc.enable()
    os.setsid()
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    from .lock import LAUNCHER_PID

    if os.environ.get(LAUNCHER_PID) == str(os.getppid()):  # the server (a child of the launcher)
        gc.disable()  # before its other imports; it runs nothing but forks
