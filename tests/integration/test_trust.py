"""Trust, tried as a careless or hostile user would: a crafted checkpoint runs no code; training
never goes on into NaN; checkpoints and logs survive config changes, reruns, damage and two
writers; a full or read-only disk is a one-line error."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from support.commands import finish, launch_train, mount, run_config, short_run, train_in_ranks, train_once

from dchag.bench.procs import ranks
from dchag.train import checkpoint as ckpt


# -- loading runs no code --------------------------------------------------------------------------
def _short_unicode(text: str) -> bytes:
    data = text.encode()
    return b"\x8c" + bytes([len(data)]) + data


def _attribute_path_pickle(module: str, dotted: str, arg: str) -> bytes:
    """Protocol 4 pickle calling ``module.<dotted>(arg)``: STACK_GLOBAL resolves a dotted name
    as an attribute path inside the module (``os.system`` inside a module that imports os)."""
    return b"\x80\x04" + _short_unicode(module) + _short_unicode(dotted) + b"\x93" + _short_unicode(arg) + b"\x85R."


def _global_pickle(module: str, name: str, arg: str) -> bytes:
    """Protocol 2 pickle calling ``module.name(arg)`` through GLOBAL."""
    return b"\x80\x02c" + f"{module}\n{name}\n".encode() + _short_unicode(arg) + b"\x85R."


def _crafted(marker: Path) -> dict[str, bytes]:
    cmd = f"touch {marker}"
    return {
        "attribute path in an allowed module": _attribute_path_pickle(
            "torch.distributed.checkpoint.filesystem", "os.system", cmd
        ),
        "attribute path in collections": _attribute_path_pickle("collections", "_sys.modules.get", cmd),
        "os.system": _global_pickle("os", "system", cmd),
        "builtins.eval": _global_pickle("builtins", "eval", f"__import__('os').system({cmd!r})"),
        "torch.load": _global_pickle("torch", "load", str(marker)),
        "a torch function": _global_pickle("torch.serialization", "os.system", cmd),
    }


@pytest.mark.parametrize("kind", list(_crafted(Path("x"))))
def test_crafted_checkpoint_metadata_is_refused_not_run(tmp_path, kind):
    marker = tmp_path / "PWNED"
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / ".metadata").write_bytes(_crafted(marker)[kind])
    with pytest.raises(ckpt.CheckpointError, match="refusing|unreadable"):
        ckpt.read_metadata(evil)
    assert not marker.exists()


def _class_patching_pickle() -> bytes:
    """Protocol 4: PosixPath, then BUILD with (None, {'is_file': frozenset}): pickle's BUILD
    would setattr on the allowed class itself, for the whole process."""
    s = _short_unicode
    return (
        b"\x80\x04" + s("pathlib") + s("PosixPath") + b"\x93"
        b"N}" + s("is_file") + s("builtins") + s("frozenset") + b"\x93" + b"s\x86b."
    )


def test_crafted_metadata_changes_no_class_and_any_failure_is_one_error(tmp_path):
    evil = tmp_path / "evil"
    evil.mkdir()
    (evil / ".metadata").write_bytes(_class_patching_pickle())
    with pytest.raises(ckpt.CheckpointError, match="sets attributes of PosixPath"):
        ckpt.read_metadata(evil)
    assert Path(__file__).is_file() is True  # PosixPath.is_file is still the method
    # an allowed callable given a bad argument raises KeyError inside the unpickler
    (evil / ".metadata").write_bytes(
        b"\x80\x04"
        + _short_unicode("torch.serialization")
        + _short_unicode("_get_layout")
        + b"\x93"
        + _short_unicode("nope")
        + b"\x85R."
    )
    with pytest.raises(ckpt.CheckpointError, match="unreadable checkpoint metadata: KeyError"):
        ckpt.read_metadata(evil)


def test_a_crafted_checkpoint_given_to_a_command_is_one_line_and_runs_nothing(data_root, tmp_path):
    root, base = data_root
    marker = tmp_path / "PWNED"
    evil = tmp_path / "final"
    evil.mkdir()
    (evil / ".metadata").write_bytes(_crafted(marker)["attribute path in an allowed module"])
    cfg = run_config(base)
    cmd = [
        sys.executable,
        "-m",
        "dchag",
        "export",
        "--config",
        json.dumps(cfg),
        "--run-name",
        "f",
        "--checkpoint",
        str(evil),
        "--data",
        str(root / "era5" / "train.zarr"),
        "--output",
        str(tmp_path / "model"),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    assert proc.returncode == 2 and "refusing" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert not marker.exists() and not (tmp_path / "model").exists()


def test_a_safe_pickle_of_dcp_metadata_still_loads(tmp_path):
    """The allow-list admits what DCP itself writes (every dtype, sizes, layouts, paths)."""
    tensors = {
        "a": torch.zeros(3, dtype=torch.bfloat16),
        "b": torch.ones(2, 2, dtype=torch.int64),
        "c": torch.get_rng_state(),
        "d": torch.zeros((), dtype=torch.float64),
    }
    ckpt.save(tensors, tmp_path / "ok")
    ckpt.check_intact(tmp_path / "ok")
    assert ckpt.saved_shapes(tmp_path / "ok") == {"a": (3,), "b": (2, 2), "c": tuple(tensors["c"].shape), "d": ()}


# -- non-finite is an error ------------------------------------------------------------------------
def _poisoned_store(root: Path, tmp: Path, how: str) -> Path:
    import zarr

    data = tmp / "era5"
    shutil.copytree(root / "era5", data)
    store = data / "train.zarr"
    if how == "nan":
        arr = zarr.open_array(store=str(store), path="data", mode="r+")
        block = arr[3]
        block[1, 4, 5] = np.nan
        arr[3] = block
    else:  # a lost shard file: Zarr reads its fill value, NaN
        shards = sorted((store / "data" / "c").rglob("*"))
        next(p for p in shards if p.is_file()).unlink()
    return tmp


@pytest.mark.parametrize("how", ["nan", "missing shard", "huge lr"])
def test_training_stops_at_the_first_non_finite_step(data_root, tmp_path, how):
    root, base = data_root
    cfg = run_config(base, steps=12, checkpoint_every=4, val_every=4, batch_size=4)
    cfg["parallel"] = {"tp": 1, "strategy": "baseline", "data_parallel": "none"}
    if how == "huge lr":
        cfg["train"].update(lr=1e30, warmup_steps=0, grad_clip=1e30)
        data = root
    else:
        data = _poisoned_store(root, tmp_path, how)
    proc = train_once(cfg, tmp_path, data)
    assert proc.returncode == 2, proc.stderr[-2000:]
    line = proc.stderr.strip().splitlines()[-1]
    assert "run f: step" in line and "gradient norm" in line and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    if how == "huge lr":
        assert "the model diverged" in line or "loss is NaN" in line, line
    else:
        assert "non-finite input value" in line and "train.zarr" in line, line
    assert not (tmp_path / "run" / "final").exists() and not (tmp_path / "run" / "log.csv").exists()


def test_scores_refuse_a_non_finite_forecast(tmp_path):
    import xarray as xr

    from dchag.cli import main

    lat, lon = np.arange(-87.1875, 90, 5.625), np.arange(0, 360, 5.625)
    times = np.array(["2020-01-01", "2020-01-02", "2020-01-03"], dtype="datetime64[ns]")
    truth = xr.Dataset(
        {"z500": (("time", "latitude", "longitude"), np.ones((3, 32, 64), np.float32))},
        coords={"time": times, "latitude": lat, "longitude": lon},
    )
    fc = truth.isel(time=[0]).expand_dims(prediction_timedelta=[np.timedelta64(24, "h")], axis=1)
    fc["z500"][0, 0, 3, 3] = np.nan
    truth.to_zarr(tmp_path / "truth.zarr")
    fc.to_zarr(tmp_path / "fc.zarr")
    status = main(
        [
            "score",
            "--forecast",
            str(tmp_path / "fc.zarr"),
            "--truth",
            str(tmp_path / "truth.zarr"),
            "--convention",
            "climax",
            "--metrics",
            "rmse",
            "--output",
            str(tmp_path / "s.csv"),
        ]
    )
    assert status == 2 and not (tmp_path / "s.csv").exists()


# -- forecast pairs by timestamp, never across a gap ---------------------------------------------------
def test_forecast_pairs_never_span_a_gap_between_years(data_root, tmp_path):
    import pandas as pd

    from dchag.era5.split import build_split
    from dchag.store import open_zarr
    from dchag.train.data import ForecastDataset

    root, _ = data_root
    store = build_split("train", [root / "y2001.zarr", root / "y2003.zarr"], root / "stats.json", tmp_path / "t.zarr")
    with open_zarr(store) as ds:
        times = pd.DatetimeIndex(ds.time.values)
        names = list(ds.attrs["channel_names"])
    d = ForecastDataset(store, names, list(range(len(names))), ["z500"], (24, 96), seed=1)
    assert len(d) == len(times) - 2 * 4  # 12 days a year: 8 anchors per year reach 96 h inside it
    for i in range(len(d)):
        lead = d.lead_of(i)
        anchor, target = d.anchors[i], d.targets[list(d.leads).index(lead), i]
        assert times[target] - times[anchor] == pd.Timedelta(hours=lead), (i, times[anchor], times[target])


def _rows(run: Path) -> list[dict]:
    import csv

    with open(run / "log.csv") as f:
        return list(csv.DictReader(f))


def test_checkpoints_survive_reruns_damage_and_shorter_runs(data_root, tmp_path):
    root, base = data_root
    out = tmp_path / "run"
    text = train_in_ranks(short_run(base, steps=8), out, root, nproc=1)
    ckpts = out / "checkpoints"
    # keep_checkpoints 2: step 6 and the last step's, kept beside final/
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_6", "step_8"], text[-2000:]
    first = _rows(out)
    assert [r["step"] for r in first] == [str(s) for s in range(1, 9)]
    assert json.loads((ckpts / "step_6" / "fingerprint.json").read_text())["task"] == "forecast"

    # A longer rerun as Snakemake makes it (its outputs deleted, final/ among them), with the
    # temporaries of killed writers: it continues from the end of the first, its log keeps
    # their history.
    shutil.rmtree(out / "final")
    (out / "log.csv").unlink()
    (ckpts / ".step_99.tmp").mkdir()
    (out / ".final.tmp").mkdir()
    text = train_in_ranks(short_run(base, steps=10), out, root, nproc=1)
    assert "resuming from" in text and "(step 8)" in text, text[-3000:]
    longer = _rows(out)
    assert [r["step"] for r in longer] == [str(s) for s in range(1, 11)]
    assert [r["loss"] for r in longer[:8]] == [r["loss"] for r in first]
    assert not (ckpts / ".step_99.tmp").exists() and not (out / ".final.tmp").exists()

    # A damaged newest checkpoint: the previous complete one is resumed, the damaged one moved aside.
    shutil.rmtree(out / "final")
    shard = max((p for p in (ckpts / "step_10").iterdir() if p.suffix == ".distcp"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    text = train_in_ranks(short_run(base, steps=12), out, root, nproc=1)
    assert "checkpoint" in text and "step_10 is damaged" in text and "truncated" in text, text[-3000:]
    assert "resuming from" in text and text.count("(step 8)") == 1, text[-3000:]
    assert [r["step"] for r in _rows(out)] == [str(s) for s in range(1, 13)]
    (aside,) = (out / "superseded").iterdir()
    assert (aside / "step_10").is_dir() and "damaged" in (aside / "why.txt").read_text()

    # Fewer steps than the newest checkpoint: it is kept, not used; final/ holds step 3.
    text = train_in_ranks(short_run(base, steps=3), out, root, nproc=1)
    assert "lie beyond it and are not used" in text, text[-3000:]
    info = json.loads((out / "run.json").read_text())
    assert info["final_step"] == 3 and [r["step"] for r in _rows(out)] == ["1", "2", "3"]
    assert (ckpts / "step_12").is_dir()

    # A damaged fingerprint: that checkpoint is moved aside, the previous one resumed.
    (ckpts / "step_12" / "fingerprint.json").write_text('{"task": "fore')
    text = train_in_ranks(short_run(base, steps=12), out, root, nproc=1)
    assert "step_12 is damaged" in text and "not readable JSON" in text and "(step 10)" in text, text[-3000:]


def test_a_config_change_moves_checkpoints_aside_and_an_older_record_counts_its_defaults():
    new = {"task": "forecast", "train.lr": 0.001, "train.mae.loss": "masked", "data.channels": ["z500"]}
    older = {k: v for k, v in new.items() if k != "train.mae.loss"}  # made before the key existed
    assert ckpt.changed_keys(older, new) == []
    assert ckpt.changed_keys(older, {**new, "train.mae.loss": "full"}) == ['train.mae.loss: "masked" -> "full"']
    assert ckpt.changed_keys({**new, "train.gone": 1}, new) == []  # a setting dchag no longer has
    assert ckpt.changed_keys({"task": "forecast"}, {"task": "forecast", "data.x": 1}) == ["data.x: (absent) -> 1"]


def test_the_fingerprint_covers_only_what_the_run_reads():
    """Renaming classes, moving input files or another time chunk make the same stores: an
    MAE run's fingerprint (config part) is the same; its data part comes from the store."""
    import yaml
    from support import REPO

    from dchag.config import run_settings, validate

    raw = yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    base = run_settings(validate(json.loads(json.dumps(raw)), check_files=False), "mae-dchag")
    raw["hsi"]["classification"]["class_names"] = ["a", "b", "c", "d"]
    raw["era5"]["time_chunk"] = 4
    raw["hsi"]["mae"]["images"] = ["/elsewhere/*.hdr"]
    other = run_settings(validate(raw, check_files=False), "mae-dchag")
    data = {"shape": [10, 200, 16, 16]}
    assert ckpt.fingerprint(base, data) == ckpt.fingerprint(other, data)
    assert ckpt.fingerprint(base, data) != ckpt.fingerprint(base, {"shape": [11, 200, 16, 16]})

    # Another task's settings: forecast leads do not concern an MAE run, nor the mask ratio and
    # the MAE decoder a forecast or classification run; the task's own settings do.
    def prints(change):
        cfg = json.loads(json.dumps(raw))
        change(cfg)
        cfg = validate(cfg, check_files=False)
        return {
            r: ckpt.fingerprint(run_settings(cfg, r), data)
            for r in ("mae-dchag", "forecast-dchag", "classification-dchag")
        }

    before = prints(lambda c: None)
    leads = prints(lambda c: c["train"]["forecast"].update(lead_hours=[24, 48]))
    mask = prints(lambda c: c["train"]["mae"].update(mask_ratio=0.5))
    decoder = prints(lambda c: c["model"].setdefault("decoder", {}).update(depth=3))
    assert leads["mae-dchag"] == before["mae-dchag"] and leads["classification-dchag"] == before["classification-dchag"]
    assert leads["forecast-dchag"] != before["forecast-dchag"]
    for changed in (mask, decoder):
        assert changed["forecast-dchag"] == before["forecast-dchag"]
        assert changed["classification-dchag"] == before["classification-dchag"]
        assert changed["mae-dchag"] != before["mae-dchag"]


def test_a_checkpoint_with_damaged_bytes_of_the_right_size_falls_back_to_the_previous(tmp_path, caplog):
    """check_intact compares sizes; bytes overwritten in place are found when the data is read."""
    model = torch.nn.Linear(4, 3)
    manager = ckpt.CheckpointManager(tmp_path, {"task": "t"}, every=2, keep=None, rank=0, parts={"model": model})
    manager.prepare()
    manager.save_step(2)
    at_2 = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1.0)
    manager.save_step(4)
    for shard in (tmp_path / "checkpoints" / "step_4").glob("*.distcp"):
        shard.write_bytes(b"A" * shard.stat().st_size)
    manager.prepare()  # sizes are right: not found here
    assert (tmp_path / "checkpoints" / "step_4").is_dir()
    with caplog.at_level("WARNING"):
        assert manager.resume(10) == tmp_path / "checkpoints" / "step_2"
    assert "step_4 is damaged: its data cannot be read" in caplog.text
    assert all(torch.equal(v, at_2[k]) for k, v in model.state_dict().items())
    (aside,) = (tmp_path / "superseded").iterdir()
    assert (aside / "step_4").is_dir() and "cannot be read" in (aside / "why.txt").read_text()
    # the only checkpoint damaged: no silent fresh start from half-loaded weights
    for shard in (tmp_path / "checkpoints" / "step_2").glob("*.distcp"):
        shard.write_bytes(b"A" * shard.stat().st_size)
    with pytest.raises(ckpt.CheckpointError, match="no earlier complete checkpoint"):
        manager.resume(10)


# -- one writer per run --------------------------------------------------------------------------------------
def test_one_writer_per_run_and_workers_die_with_their_launcher(data_root, tmp_path):
    root, base = data_root
    out = tmp_path / "run"
    # long enough to outlast the second start under any load (it is killed below; 400 steps took 31 s)
    first = launch_train(run_config(base, steps=100_000, checkpoint_every=100, val_every=100), out, root)
    try:
        from dchag.train.lock import RunLock

        def training() -> bool:  # a live worker (rank 0) wrote itself into the lock and the steps have begun
            if first.poll() is not None:
                return False
            lock = out / ".lock"
            holder = lock.read_text() if lock.exists() else ""
            return (out / "log.csv.partial").exists() and any(f"pid {w} " in holder for w in ranks(first.pid))

        deadline = time.time() + 300
        while time.time() < deadline and first.poll() is None and not training():
            time.sleep(0.2)
        if not training():
            first.kill()  # a run of 100 000 steps would not end by itself in finish()'s time
            pytest.fail(finish(first, out)[-3000:])
        workers = ranks(first.pid)
        assert len(workers) == 2, workers
        second = train_once(run_config(base, steps=100_000), tmp_path, root)  # the same run directory (tmp_path/run)
        assert second.returncode == 2 and "is in use by pid" in second.stderr, second.stderr[-2000:]
        assert "Traceback" not in second.stderr
        os.kill(first.pid, signal.SIGKILL)  # the launcher, as a cluster's job kill or an OOM killer does
        first.wait()
        deadline = time.time() + 30
        while time.time() < deadline and any(Path(f"/proc/{w}").exists() for w in workers):
            time.sleep(0.2)
        alive = [
            w for w in workers if Path(f"/proc/{w}").exists() and "zombie" not in Path(f"/proc/{w}/status").read_text()
        ]
        assert not alive, f"workers {alive} outlived their launcher"
        # the lock died with them: the run can be resumed at once
        lock = out / ".lock"
        RunLock(out).check_free()
        assert lock.exists()
    finally:  # a failed check must not leave a run of 100 000 steps behind (it would train on for an hour)
        if first.poll() is None:
            first.kill()
            first.wait()


@pytest.fixture
def small_disks(tmp_path):
    full, ro = tmp_path / "full", tmp_path / "ro"
    if os.geteuid() != 0 or not (mount(full, "size=64k") and mount(ro, "size=64k,ro")):
        pytest.skip("mounting a small or read-only tmpfs needs root")
    yield full, ro
    for p in (full, ro):
        subprocess.run(["umount", str(p)], capture_output=True)


def test_a_full_or_read_only_disk_is_one_line_and_leaves_nothing(data_root, small_disks, tmp_path):
    root, base = data_root
    full, ro = small_disks
    for disk in (full, ro):
        cmd = [
            sys.executable,
            "-m",
            "dchag",
            "era5-truth",
            "--data",
            str(root / "era5" / "val.zarr"),
            "--variables",
            "z500",
            "t2m",
            "--output",
            str(disk / "truth.zarr"),
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        assert proc.returncode == 2 and "cannot write" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert not list(disk.glob("*truth*")), list(disk.iterdir())
    cfg = run_config(base, steps=4, checkpoint_every=2, val_every=2)
    cfg["parallel"] = {"tp": 1, "strategy": "baseline", "data_parallel": "none"}
    proc = train_once(cfg, full, root)  # writes full / "run"
    assert proc.returncode == 2 and "cannot write" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[
        -2000:
    ]
    assert not (full / "run" / "final").exists()


def test_dead_writers_temporaries_are_removed(tmp_path):
    import socket

    from dchag.store import atomic_path

    target = tmp_path / "x.json"
    dead = tmp_path / f".x.json.tmp-{socket.gethostname()}-99999999"
    live = tmp_path / f".x.json.tmp-{socket.gethostname()}-{os.getppid()}"
    dead.mkdir()
    live.mkdir()
    with atomic_path(target) as tmp:
        tmp.write_text("{}")
    assert target.read_text() == "{}" and not dead.exists() and live.exists()


def test_a_perfect_reconstruction_scores_infinite_psnr_as_scikit_image(tmp_path):
    from skimage.metrics import peak_signal_noise_ratio

    from dchag.cli import main

    cube = np.random.default_rng(0).random((16, 16, 4)).astype(np.float32)
    np.save(tmp_path / "t.npy", cube)
    assert (
        main(
            [
                "score-recon",
                "--truth",
                str(tmp_path / "t.npy"),
                "--pred",
                str(tmp_path / "t.npy"),
                "--output",
                str(tmp_path / "r.json"),
            ]
        )
        == 0
    )
    scores = json.loads((tmp_path / "r.json").read_text())
    with np.errstate(divide="ignore"):
        assert peak_signal_noise_ratio(cube, cube, data_range=float(cube.max() - cube.min())) == np.inf
    assert scores["psnr"] is None and scores["rmse"] == 0.0 and scores["ssim"] == 1.0  # inf is null in strict JSON
