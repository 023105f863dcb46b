"""The ``dchag`` command: one subcommand per pipeline stage.

Each Snakemake rule calls exactly one of these; each is also usable on its own. A user's
mistake (any :class:`dchag.errors.DchagError`) ends the command with one line naming the
file, key or value at fault (exit status 2), never a traceback; ``-v`` shows the traceback.
Anything else is a bug and keeps its traceback.

Every stage has its module here (``era5``, ``hsi``, ``train``, ``evaluate``, ``predict``, ``figures``,
``paper``, ``benefit``, ``pipeline``) that registers its subcommands beside their handlers; a handler
only turns flags into a call of the library.
"""

from __future__ import annotations

import argparse
import logging
import sys
import textwrap

from .. import __version__
from . import benefit, era5, evaluate, figures, hsi, paper, pipeline, predict, train

DESCRIPTION = """dchag: multi-channel foundation models trained with D-CHAG. The commands below are
for people; the pipeline's steps, which its Snakemake rules run, are named at the end.

A mistake in an input, file or setting, or a disk that is full or read-only, ends a command
with one line naming what is at fault (exit status 2); -v shows the traceback."""

STAGES = (era5, hsi, train, evaluate, predict, figures, paper, benefit, pipeline)
# What a person types; every other subcommand is a pipeline step (a Snakemake rule calls it),
# named apart at the end of --help.
FOR_PEOPLE = (
    "regrid", "download-era5", "preprocess-hsi", "train", "launch-train", "export", "predict", "push-model",
    "pull-model", "score", "compare-scores", "score-recon", "describe-model", "estimate-memory", "calibrate",
    "advise", "check-config", "install-profile",
)  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dchag", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"dchag {__version__}")
    p.add_argument("-v", "--verbose", action="store_true", help="log debug messages and show tracebacks")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    steps = []

    def add(name: str, func, help_: str) -> argparse.ArgumentParser:
        if name not in FOR_PEOPLE:
            steps.append(name)
        sp = sub.add_parser(name, description=help_, **({"help": help_} if name in FOR_PEOPLE else {}))
        sp.set_defaults(func=func)
        return sp

    for stage in STAGES:
        stage.register(add)
    p.epilog = "pipeline steps (each run by a Snakemake rule; `dchag STEP --help` describes it):\n" + "\n".join(
        textwrap.wrap(", ".join(steps), 88, initial_indent="  ", subsequent_indent="  ")
    )
    return p


def _check_output(args) -> None:
    """An --output (or --outdir) that is, or contains, a path given to the same command is
    refused before any work: writing it would replace the command's own input."""
    from ..store import check_inputs

    outputs = [getattr(args, name) for name in ("output", "outdir") if getattr(args, name, None)]
    given = []
    for key, value in vars(args).items():
        if key not in ("output", "outdir"):
            given += [v for v in (value if isinstance(value, list) else [value]) if isinstance(v, str) and v]
    for output in outputs:
        check_inputs(output, given)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s"
    )
    from ..errors import DchagError
    from ..store import write_error
    from ..train.launch import report_error

    try:
        _check_output(args)
        args.func(args)
    except DchagError as err:
        if args.verbose:
            raise
        message = str(err)
    except Exception as err:
        cause = write_error(err)  # a full disk or a read-only place is the machine's state, not a bug
        if cause is None or args.verbose:
            raise
        message = f"cannot write {cause.filename or ''}: {cause.strerror}"
    else:
        return 0
    # one line, whatever the message holds (YAML's parser reports its position on lines of its own)
    message = "; ".join(line.strip() for line in message.splitlines() if line.strip()).replace(":; ", ": ")
    print(f"dchag {args.command}: error: {message}", file=sys.stderr)
    report_error(message)  # a worker under torchrun: the line `dchag launch-train` ends with
    return 2


def run() -> None:
    """The ``dchag`` program (its console script, ``python -m dchag``): :func:`main`, then the
    interpreter's exit without its last part. As at any exit, threads are waited for, exit handlers
    run (logging's, zarr's event loop, temporary folders, multiprocessing's) and the output is
    flushed; what is skipped is freeing every module, which after torch's imports costs 0.5-1 CPU-s
    of each command (a pipeline runs dozens). A command that ends in a traceback exits as usual, and
    so does a rank of `dchag launch-train` (multiprocessing ends the processes it starts)."""
    import atexit
    import gc
    import multiprocessing
    import os
    import threading

    # A full pass of the collector walks every object that imports made (torch's and xarray's:
    # ~350k, 0.2 CPU-s a pass), and while imports grow the heap Python starts one every 10 passes
    # over the young objects: 0.2-0.9 CPU-s of a command. One in 100 instead; a cycle that
    # outlives the young passes waits that much longer for the full one that frees it.
    gc.set_threshold(*gc.get_threshold()[:2], 100)
    code = main()
    if multiprocessing.parent_process() is not None:
        sys.exit(code)
    threading._shutdown()  # the exit's first step: wait for the threads that are not daemons
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except OSError:  # e.g. a closed pipe: the status a normal exit would give
        code = code or 120
    os._exit(code)
