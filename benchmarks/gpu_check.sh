#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py): process group, each task trained with bf16 and
# activation checkpointing through a kill and resume, dchag calibrate, and the T = 1
# baseline-vs-D-CHAG benchmark. On a GPU: `bash benchmarks/gpu_check.sh` (<= 8 minutes on one
# H100/H200, results in benchmarks/results/gpu/); the CPU rehearsal: `--size tiny`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
export PATH="$(dirname "$PY"):$PATH" PYTHONUNBUFFERED=1
exec timeout "${GPU_CHECK_TIMEOUT:-480}" "$PY" benchmarks/gpu_check.py "$@"
