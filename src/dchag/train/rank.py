"""What each rank of `dchag launch-train` runs: ``python -m MODULE ARGS``, in a process torchrun
forks from a server that has already imported MODULE's dependencies (torch, the trainer), rather
than a fresh interpreter importing them again on every rank and every restart. torchrun runs this
file by path (``--run-path``): it imports nothing relative.

Like a rank torchrun starts as a command, it runs in a session of its own: a terminal's Ctrl-C
or a signal to the launcher's process group reaches it through the launcher only."""

import os
import runpy
import sys

if __name__ == "__main__":
    os.setsid()
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
