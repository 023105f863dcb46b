#!/usr/bin/env bash
# Downloads, here, the wheels the GPU check needs that the GPU machine's image lacks (it is
# offline; benchmarks/gpu_image_packages.txt is its package list) into .whl/, which a device
# call carries (`carry: [".whl"]`) and benchmarks/gpu_check.sh installs with --no-index.
#   bash benchmarks/gpu_wheels.sh                                    # CPython 3.12, into .whl/
#   bash benchmarks/gpu_wheels.sh --python-version 3.11 --dest DIR   # the same set for another Python
# The device README's download command: --no-deps, so every dependency is named here, one
# version of each; benchmarks/gpu_env.py check then proves the set complete (every
# Requires-Dist carried or in the image, none of the image's repeated, under 64 MiB with the
# working tree) before it replaces the folder's wheels.
set -euo pipefail
cd "$(dirname "$0")/.."
PYV=3.12
DEST=.whl
while [ $# -gt 0 ]; do
    case "$1" in
        --python-version) PYV="$2"; shift 2 ;;
        --dest) DEST="$2"; shift 2 ;;
        *) echo "usage: $0 [--python-version X.Y] [--dest DIR]" >&2; exit 2 ;;
    esac
done
# dchag's dependencies that the image lacks (all but snakemake, which the check does not run,
# and torch, the machine's own), and their dependencies that the image lacks; the versions the
# test suite runs with (spectral 0.25 has no wheel: 0.24 is the newest one).
WHEELS=(
    zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0  # zarr
    dask==2026.8.0 partd==1.4.2 locket==1.0.0                               # dask (xarray's chunks)
    netCDF4==1.7.5.1.post1 cftime==1.6.6.1 h5netcdf==1.8.3                  # the ERA5 files
    spectral==0.24                                                          # ENVI images
    jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1  # the config
)
# dask imports importlib_metadata below Python 3.12 (a rehearsal on CI's 3.11 needs it).
[ "$PYV" != 3.11 ] || WHEELS+=(importlib-metadata==10.2.0 lazy-importer==0.1.0)
PY="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$tmp" "${WHEELS[@]}"
"$PY" benchmarks/gpu_env.py check "$tmp" --python-version "$PYV"
mkdir -p "$DEST"
rm -f "$DEST"/*.whl
mv "$tmp"/*.whl "$DEST"/
echo "$DEST: ready for CPython $PYV"
