"""Outputs are owned: a command replaces only an earlier output of its own kind, never an input,
a run directory or a path it did not write; the run lock follows no link; a config change keeps
the old final/; a failed write is one line naming the target, whatever the library raised."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from support.commands import dchag, digest, mount, one_line, short_run, train_once

from dchag.store import OutputError, open_zarr, write_zarr


# -- outputs are owned ---------------------------------------------------------------------------------------
def test_a_writer_replaces_only_an_earlier_output_of_its_own_kind(tmp_path):
    from dchag.store import OWNER_ATTRIBUTE

    ds = xr.Dataset({"a": (("x",), np.arange(3.0))})
    out = tmp_path / "out.zarr"
    write_zarr(ds, out, kind="forecast")
    write_zarr(ds * 2, out, kind="forecast")  # a rerun replaces its own earlier output
    assert open_zarr(out)["a"].values.tolist() == [0.0, 2.0, 4.0]
    assert open_zarr(out).attrs[OWNER_ATTRIBUTE] == "forecast"

    unrelated = tmp_path / "mine"
    unrelated.mkdir()
    (unrelated / "thesis.tex").write_text("years of work")
    other_kind = tmp_path / "truth.zarr"
    write_zarr(ds, other_kind, kind="truth")
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / ".lock").write_text("")
    link = tmp_path / "link"
    link.symlink_to(unrelated)
    a_file = tmp_path / "scene.tif"
    a_file.write_bytes(b"II*\0an image")
    expected = {
        unrelated: "a directory dchag did not write",
        other_kind: "a dchag truth output",
        run: "training run's directory",
        link: "a symbolic link",
        a_file: "refusing to replace the file",
    }
    for path, why in expected.items():
        before = digest(path)
        with pytest.raises(OutputError, match=why) as err:
            write_zarr(ds, path, kind="forecast")
        assert str(path) in str(err.value) and "\n" not in str(err.value)
        assert digest(path) == before, path
        assert not list(tmp_path.glob(f".{path.name}.tmp-*"))
    with pytest.raises(OutputError, match="contains the input"):
        write_zarr(ds, tmp_path, kind="forecast", inputs=[other_kind])
    empty = tmp_path / "model"
    empty.mkdir()  # as Snakemake makes the folder of a rule's file outputs before the job
    write_zarr(ds, empty, kind="model")
    assert open_zarr(empty).attrs[OWNER_ATTRIBUTE] == "model"


@pytest.fixture(scope="module")
def stores(data_root):
    root, base = data_root
    return root, base, root / "era5" / "val.zarr"


def test_commands_refuse_their_inputs_run_directories_and_foreign_paths(stores, tmp_path):
    root, base, val = stores
    before = digest(val)
    truth = ["era5-truth", "--data", str(val), "--variables", "z500", "--output"]
    # the output is the input, or a folder holding it
    one_line(dchag(*truth, str(val)), f"output {val} is the input {val}")
    one_line(dchag(*truth, str(val.parent)), "contains the input")
    assert digest(val) == before
    # a run directory, an unrelated folder, a store of another kind
    run = tmp_path / "run"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "log.csv").write_text("step\n1\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    for path in (run, mine, val.parent / "train.zarr"):
        kept = digest(path)
        one_line(dchag(*truth, str(path)), f"refusing to replace {path}")
        assert digest(path) == kept
    # the pipeline's own rerun replaces its earlier output
    out = tmp_path / "truth.zarr"
    for _ in range(2):
        proc = dchag(*truth, str(out))
        assert proc.returncode == 0, proc.stderr[-3000:]
    # export into the run folder it exports (its checkpoint is inside): refused before any work
    cfg = json.dumps(short_run(base))
    kept = digest(run)
    export = ["export", "--config", cfg, "--run-name", "f", "--checkpoint", str(run / "final"), "--output", str(run)]
    one_line(dchag(*export), f"output {run} contains the input {run / 'final'}")
    assert digest(run) == kept
    # predict with --output the image it reads
    image = tmp_path / "scene.tif"
    image.write_bytes(b"II*\0 an image")
    proc = dchag("predict", "--model", str(mine), "--image", str(image), "--output", str(image))
    one_line(proc, f"output {image} is the input {image}")
    assert image.read_bytes() == b"II*\0 an image"
    # preprocess-hsi into the product's own folder
    hdr = mine / "image.hdr"
    hdr.write_text("ENVI\n")
    one_line(dchag("preprocess-hsi", str(hdr), "--output", str(mine)), "contains the input")
    assert (mine / "notes.txt").read_text() == "keep me"


def test_a_classification_map_is_refused_a_name_its_geotiff_or_png_would_take(tmp_path):
    from dchag.model.folder import Model
    from dchag.predict import hsi
    from dchag.predict.layout import PredictError

    model = Model(meta={"task": "classification"}, network=None, source=str(tmp_path / "model"))
    image = tmp_path / "scene.hdr"
    image.write_text("ENVI\n")
    for name in ("x.tif", "x.png"):
        with pytest.raises(PredictError, match="give the store another name"):
            hsi.classify_scene(model, str(image), str(tmp_path / name))
    # the GeoTIFF beside x.zarr would be the input image x.tif
    scene = tmp_path / "x.tif"
    scene.write_bytes(b"II*\0")
    with pytest.raises(OutputError, match=f"output {scene} is the input"):
        hsi.classify_scene(model, str(scene), str(tmp_path / "x.zarr"))
    assert scene.read_bytes() == b"II*\0" and not (tmp_path / "x.zarr").exists()


# -- the run lock follows no link --------------------------------------------------------------------------
def test_the_run_lock_follows_no_link_and_is_a_regular_file(data_root, tmp_path):
    from dchag.train.lock import LockFileError, RunLock

    root, base = data_root
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = tmp_path / "run" / ".lock"
    lock.parent.mkdir()
    lock.symlink_to(victim)
    proc = train_once(short_run(base, steps=2), tmp_path, root)  # dchag train into tmp_path/run
    one_line(proc, f"{lock} is a symbolic link")
    assert victim.read_text() == "precious\n"
    with pytest.raises(LockFileError, match="symbolic link"):
        RunLock(lock.parent).check_free()
    lock.unlink()
    lock.mkdir()
    proc = train_once(short_run(base, steps=2), tmp_path, root)
    one_line(proc, f"{lock} is a directory")
    fifo = tmp_path / "other" / ".lock"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(LockFileError, match="not a regular file"):
        RunLock(fifo.parent).check_free()


# -- a config change keeps the old final/ ------------------------------------------------------------------
def test_a_config_change_moves_the_old_final_and_its_record_aside(data_root, tmp_path):
    root, base = data_root
    out = tmp_path / "run"
    proc = train_once(short_run(base, steps=4), tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    old = {name: digest(out / name) for name in ("final", "log.csv", "run.json")}
    proc = train_once(short_run(base, steps=4, lr=0.001), tmp_path, root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (aside,) = (out / "superseded").iterdir()
    assert {name: digest(aside / name) for name in old} == old  # the old model, by SHA-256
    assert "train.lr: 0.003 -> 0.001" in (aside / "why.txt").read_text()
    assert digest(out / "final") != old["final"]
    assert json.loads((out / "run.json").read_text())["train"]["lr"] == 0.001
    # the same configuration again: final/ and its record stay where they are
    proc = train_once(short_run(base, steps=4, lr=0.001), tmp_path, root)
    assert proc.returncode == 0 and len(list((out / "superseded").iterdir())) == 1, proc.stderr[-3000:]


# -- a failed write is one line naming the target ---------------------------------------------------------
def test_a_file_size_limit_is_a_write_error_naming_the_target(stores, tmp_path):
    root, base, val = stores
    out = tmp_path / "truth.zarr"
    proc = dchag("era5-truth", "--data", str(val), "--variables", "z500", "--output", str(out), limit=4096)
    one_line(proc, f"cannot write {out}", "File too large")
    assert not list(tmp_path.glob("*truth*"))


def _model(embed_dim: int = 64, depth: int = 4):
    """An untrained forecast model, for its writer (export's)."""
    from support.parallel_checks import small_config

    from dchag.model.folder import Model
    from dchag.model.model import ChannelViT

    net = ChannelViT(small_config(embed_dim=embed_dim, depth=depth))
    return Model(meta={"task": "forecast", "format": "dchag-model"}, network=net)


def _save_limited(model_dir: Path, limit: int) -> str:
    """model.folder.save (export's writer) under a file size limit, in a subprocess: its error."""
    code = (
        "import resource, sys; sys.path[:0] = ['tests', 'tests/integration'];"
        f"resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}));"
        "from test_trust_outputs import _model; from dchag.model import folder;"
        f"folder.save(_model(), {str(model_dir)!r})"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[2])
    return proc.stderr.strip().splitlines()[-1] if proc.returncode else ""


def test_export_on_a_full_disk_or_at_the_size_limit_is_an_output_error(tmp_path):
    """safetensors reports a failed write as its own SafetensorError, not an OSError."""
    target = tmp_path / "model"
    last = _save_limited(target, 64 * 1024)
    assert last.startswith("dchag.store.outputs.OutputError: cannot write") and str(target) in last, last
    assert "File too large" in last and not list(tmp_path.iterdir())


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not mount(disk, "size=4m"):
        pytest.skip("mounting a small tmpfs needs root")
    yield disk
    subprocess.run(["umount", str(disk)], capture_output=True)


def _wide(base: dict, **train) -> dict:
    """A run whose checkpoint (14 MB) has tensors larger than a file's buffer: the disk fills
    inside torch's zip writer, which raises a RuntimeError ("unexpected pos")."""
    cfg = short_run(base, **train)
    cfg["model"] = {**cfg["model"], "embed_dim": 256}
    return cfg


def test_a_checkpoint_or_model_on_a_full_disk_is_one_line_and_leaves_nothing(data_root, small_disk):
    from dchag.model import folder

    root, base = data_root
    proc = train_once(_wide(base, steps=4), small_disk, root)  # the run's logs fit, its checkpoint does not
    one_line(proc, f"cannot write checkpoint {small_disk / 'run' / 'checkpoints' / 'step_2'}: No space left")
    assert not list((small_disk / "run" / "checkpoints").iterdir())
    shutil.rmtree(small_disk / "run")
    with pytest.raises(OutputError, match=f"cannot write {small_disk / 'model'}: No space left on device"):
        folder.save(_model(256, 8), small_disk / "model")  # safetensors raises its SafetensorError
    assert not list(small_disk.iterdir())


def test_a_checkpoint_at_the_file_size_limit_is_one_line(data_root, tmp_path):
    root, base = data_root
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (2**20, hard))  # inherited by the run's process
    try:
        proc = train_once(_wide(base, steps=4), tmp_path, root)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    one_line(proc, f"cannot write checkpoint {tmp_path / 'run' / 'checkpoints' / 'step_2'}: File too large")
    assert not list((tmp_path / "run" / "checkpoints").iterdir())
