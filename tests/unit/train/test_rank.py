"""The collector in the processes of `dchag launch-train`: off in the ranks' fork server (a
child of the launcher, which imports dchag.train.rank first), where it would only walk the
growing heap of its imports; in a rank (dchag/train/rank.py run by path), on again with what
the server imported frozen out of its passes. Imported anywhere else, the module changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys

from dchag.train.launch import RANK_ENTRY, SERVER_FIRST
from dchag.train.lock import LAUNCHER_PID

PROBE = "import gc, sys; print(gc.isenabled(), gc.get_freeze_count() > 0, 'torch' in sys.modules)"


def python(code: str, env: dict) -> str:
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_the_server_imports_without_the_collector_and_a_rank_freezes_them(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    # the launcher's child (this process is its launcher): off
    assert python(f"import {SERVER_FIRST}; {PROBE}", {**env, LAUNCHER_PID: str(os.getpid())}) == "False False False"
    # any other process that imports it: as it was
    assert python(f"import {SERVER_FIRST}; {PROBE}", {**env, LAUNCHER_PID: "1"}) == "True False False"
    # a rank: the server's state (its collector off, json imported), then rank.py running a module
    (tmp_path / "probe.py").write_text(PROBE + "\n")
    rank = f"import gc, json; gc.disable(); import runpy, sys; sys.argv = [{RANK_ENTRY!r}, 'probe']; "
    rank += f"runpy.run_path({RANK_ENTRY!r}, run_name='__main__')"
    assert python(rank, env) == "True True False"
