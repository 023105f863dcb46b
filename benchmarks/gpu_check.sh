#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py): process group, each task trained with bf16 and
# activation checkpointing through a kill and resume, dchag calibrate, and the T = 1
# baseline-vs-D-CHAG benchmark, run from this working tree with the machine's own Python and
# torch; what that Python lacks comes from the wheels in .whl/ (benchmarks/gpu_wheels.sh, run
# beforehand where pip reaches PyPI), installed with --no-index into a temporary folder.
#   bash benchmarks/gpu_check.sh              # on the GPU machine: paper-like sizes, <= 6 minutes
#   bash benchmarks/gpu_check.sh --dry-run    # the CPU rehearsal of that run (what CI runs)
# --dry-run fetches the same wheel set for this Python (and checks the CPython 3.12 set that
# travels), runs in an interpreter that holds only the GPU image's packages of this one
# (benchmarks/gpu_env.py image), installs the wheels the same way and runs at --size tiny: a
# wheel missing from the set fails here (its wheels and interpreter go beside --work's folder).
# Results: benchmarks/results/gpu/ (tiny sizes: benchmarks/_work/gpu_check/) and $OUT when set;
# the console log: $OUT/gpu_check.log, or gpu_check.log beside --work's folder.
# GPU_CHECK_TIMEOUT (seconds, default 330) bounds the check after the install, so that a
# device call (machine start, install, check) can run twice in a 15-minute lease.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT="$PWD"
export GPU_CHECK_COMMAND="bash benchmarks/gpu_check.sh${*:+ $*}"  # what the results record
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
WHEELS="${GPU_WHEELS:-$ROOT/.whl}"
dry=0
args=()
work="$ROOT/benchmarks/_work/gpu_check/work"  # gpu_check.py's --work (it empties that folder)
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) dry=1 ;;
        --work) work="$2"; args+=("$1" "$2"); shift ;;
        *) args+=("$1") ;;
    esac
    shift
done
WORK="$(dirname "$work")"
mkdir -p "$WORK"
if [ "$dry" = 1 ]; then
    PYTHON="$PY" bash benchmarks/gpu_wheels.sh --dest "$WORK/wheels-cp312"  # what a device call carries, checked
    pyv="$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    WHEELS="$WORK/wheels-cp312"
    if [ "$pyv" != 3.12 ]; then
        PYTHON="$PY" bash benchmarks/gpu_wheels.sh --python-version "$pyv" --dest "$WORK/wheels-cp${pyv/./}"
        WHEELS="$WORK/wheels-cp${pyv/./}"
    fi
    "$PY" benchmarks/gpu_env.py image "$WORK/image"
    PY="$WORK/image/bin/python"
    args=(--size tiny "${args[@]}")
fi
PY="$(command -v "$PY")"
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"  # absolute, links kept (a venv's python is one)
if ! compgen -G "$WHEELS/*.whl" >/dev/null; then
    echo "no wheels in $WHEELS: run 'bash benchmarks/gpu_wheels.sh' where pip reaches PyPI, and carry .whl" >&2
    exit 2
fi
SITE="$(mktemp -d)"
trap 'rm -rf "$SITE"' EXIT
t0=$SECONDS
"$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
echo "$PY: installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE in $((SECONDS - t0)) s"
# The machine's own packages, the wheels beside them, the package from this tree: nothing else.
export PYTHONPATH="$ROOT/src:$SITE" PYTHONUNBUFFERED=1 PATH="$(dirname "$PY"):$PATH"
log="${OUT:-$WORK}/gpu_check.log"
set +e
timeout -k 10 "${GPU_CHECK_TIMEOUT:-330}" "$PY" benchmarks/gpu_check.py "${args[@]}" 2>&1 | tee "$log"
rc="${PIPESTATUS[0]}"
set -e
[ "$rc" != 124 ] || echo "gpu_check.sh: stopped after ${GPU_CHECK_TIMEOUT:-330} s (GPU_CHECK_TIMEOUT)" | tee -a "$log"
exit "$rc"
