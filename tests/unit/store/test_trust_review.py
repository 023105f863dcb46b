"""Cases found by trying the trust guarantees as a careless or hostile user would: a file output
that would replace a file of a run, a checkpoint or another output, and a model description
whose output names disagree with the network's head."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import xarray as xr
from support.commands import dchag, digest, one_line, short_run

from dchag.cli import main
from dchag.model import folder as model_folder
from dchag.model.folder import ModelFolderError
from dchag.store import OutputError, atomic_path, write_zarr


def _holders(tmp_path: Path) -> dict[Path, str]:
    """A file inside each thing no other writer may touch, and how the refusal names it."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step_2").mkdir(parents=True)
    (run / "log.csv").write_text("step,loss\n1,0.5\n")
    checkpoint = tmp_path / "copied_final"
    checkpoint.mkdir()
    (checkpoint / ".metadata").write_bytes(b"DCP metadata")
    (checkpoint / "__0_0.distcp").write_bytes(b"tensor data")
    store = tmp_path / "truth.zarr"
    write_zarr(xr.Dataset({"a": (("x",), np.arange(3.0))}), store, kind="truth")
    model = tmp_path / "model"
    with atomic_path(model, "model") as tmp:
        tmp.mkdir()
        (tmp / "model.json").write_text("{}")
    return {
        run / "log.csv": f"the training run {run.resolve()}",
        checkpoint / ".metadata": f"the checkpoint {checkpoint.resolve()}",
        checkpoint / "__0_0.distcp": "the checkpoint",
        store / "zarr.json": "the dchag truth output",
        store / "a" / "zarr.json": "the dchag truth output",
        model / "model.json": "the dchag model output",
    }


def test_a_file_output_never_replaces_a_file_of_a_run_checkpoint_or_other_output(tmp_path):
    for path, holder in _holders(tmp_path).items():
        before = path.read_bytes()
        with pytest.raises(OutputError, match=f"refusing to replace {path}: a file of {holder}") as err:
            with atomic_path(path) as tmp:
                tmp.write_text("variable,value\n")
        assert "\n" not in str(err.value)
        assert path.read_bytes() == before, path
    # through a command, exit 2 in one line, the run's log kept byte for byte
    cube = np.random.default_rng(0).random((16, 16, 3))
    np.save(tmp_path / "truth.npy", cube)
    np.save(tmp_path / "pred.npy", cube * 0.9)
    recon = ["score-recon", "--truth", str(tmp_path / "truth.npy"), "--pred", str(tmp_path / "pred.npy"), "--output"]
    kept = digest(tmp_path / "run")
    one_line(dchag(*recon, str(tmp_path / "run" / "log.csv")), "a file of the training run")
    assert digest(tmp_path / "run") == kept
    # a file of no run or output is still replaced by a rerun, and a new file may go anywhere
    for name in ("scores.csv", "scores.csv", "run/final_scores.csv"):
        proc = dchag(*recon, str(tmp_path / name))
        assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.fixture(scope="module")
def forecast_model(data_root, tmp_path_factory):
    """An untrained (seeded) forecast model of two outputs, as export describes and saves it."""
    from dchag.config import run_settings
    from dchag.model import ChannelViT
    from dchag.predict import export
    from dchag.train.tasks import build_task

    root, base = data_root
    store = root / "era5" / "train.zarr"
    t = build_task(run_settings(short_run(base), "f"), {"train": store, "val": store})
    torch.manual_seed(0)
    model = export.describe(t, store, ChannelViT(t.model_cfg), {"run": "f"})
    return model_folder.save(model, tmp_path_factory.mktemp("fm") / "model")


def test_a_models_outputs_must_name_its_heads_channels_in_order(forecast_model, tmp_path):
    meta = json.loads((forecast_model / "model.json").read_text())
    assert meta["outputs"] == ["z500", "t2m"]
    assert model_folder.load(forecast_model).meta["outputs"] == ["z500", "t2m"]
    # swapped: the z500 head would be written as t2m in t2m's units (plausible values, all wrong);
    # repeated: t2m silently dropped
    for outputs in (["t2m", "z500"], ["z500", "z500"]):
        d = tmp_path / "_".join(outputs)
        shutil.copytree(forecast_model, d)
        (d / "model.json").write_text(json.dumps({**meta, "outputs": outputs}))
        with pytest.raises(ModelFolderError, match=r"key 'outputs' is .*; expected \['z500', 't2m'\]") as err:
            model_folder.load(d)
        assert str(d / "model.json") in str(err.value) and "\n" not in str(err.value)


def test_a_forecast_of_one_level_saved_as_netcdf_is_scored(scored, capsys):  # noqa: F811 (the fixture)
    """The levels a WeatherBench 2 variable holds (a list attribute) come back from netCDF as a
    number when there is one; scoring such a file was a TypeError traceback. An attribute that
    names no levels is one line naming the file."""
    from support.era5 import score_cli

    from dchag.evaluate import wb2
    from dchag.evaluate.forecast import forecast_dataset

    root, truth = scored
    assert score_cli(capsys, root / "forecast.nc", root / "truth.nc", root / "ref.csv")[0] == 0
    fc = xr.open_dataset(root / "forecast.nc").load()
    values = {v: fc[v].values[:, None] for v in ("z500", "t2m")}  # (time, lead, lat, lon)
    layout = forecast_dataset(values, fc.indexes["time"], [24], fc.lat.values, fc.lon.values, {})
    layout.to_netcdf(root / "wb2_forecast.nc")
    assert isinstance(xr.open_dataset(root / "wb2_forecast.nc").geopotential.attrs[wb2.GIVEN_LEVELS], np.integer)
    code, err = score_cli(capsys, root / "wb2_forecast.nc", root / "truth.nc", root / "wb2.csv")
    assert code == 0, err
    ref, got = (
        pd.read_csv(root / f"{n}.csv").query("region == 'global'").set_index("variable").value for n in ("ref", "wb2")
    )
    assert got["z500"] == pytest.approx(ref["z500"], rel=1e-6) and got["t2m"] == pytest.approx(ref["t2m"], rel=1e-6)
    layout.geopotential.attrs[wb2.GIVEN_LEVELS] = "all"
    layout.to_netcdf(root / "bad.nc")
    code, err = score_cli(capsys, root / "bad.nc", root / "truth.nc", root / "bad.csv")
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert f"forecast {root / 'bad.nc'}: variable 'geopotential': attribute {wb2.GIVEN_LEVELS} is 'all'" in err
    assert not (root / "bad.csv").exists()


@pytest.mark.parametrize(
    "text",
    ["name: [t\n", "name: t\nname: u\n", "a: &a xx\nb: {? [*a, 1]\n : 1}\n"],
    ids=["unclosed list", "key twice", "unhashable key"],
)
def test_a_yaml_syntax_error_is_one_line(tmp_path, capsys, text):
    """YAML's parser puts each position it reports on a line of its own."""
    from dchag.cli import main

    path = tmp_path / "config.yaml"
    path.write_text(text)
    assert main(["describe-model", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"dchag describe-model: error: config file {path} is not valid YAML: ") and "line " in err


@pytest.mark.parametrize("flag", ["--init-start", "--init-end"])
def test_an_initialisation_time_that_is_no_time_is_a_usage_error(tmp_path, flag):
    """It was pandas' DateParseError traceback, after the model was loaded."""
    for text in ("garbage", "", "99999-01-01"):
        proc = dchag("predict", "--model", "m", "--store", "s.zarr", flag, text, "--output", str(tmp_path / "o.zarr"))
        one_line(proc, f"argument {flag}: expected a date and time", repr(text))


def test_a_lead_time_given_twice_is_refused_by_predict_and_score(forecast_model, data_root, scored, capsys):  # noqa: F811
    """predict --lead-hours 24 24 wrote each forecast twice, and score gave each row twice."""
    from support.era5 import score_cli

    root, _ = data_root
    out = root / "twice.zarr"
    argv = ["predict", "--model", str(forecast_model), "--store", str(root / "era5" / "val.zarr"), "--output", str(out)]
    from dchag.cli import main

    assert main([*argv, "--lead-hours", "24", "48", "24"]) == 2
    err = capsys.readouterr().err
    assert "lead time(s) [24] h given more than once" in err and len(err.strip().splitlines()) == 1, err
    assert not out.exists()
    folder, _ = scored
    fc = xr.open_dataset(folder / "forecast.nc").load()
    twice = xr.concat([fc.expand_dims("prediction_timedelta")] * 2, "prediction_timedelta")
    twice.to_netcdf(folder / "fc_leads.nc")
    code, err = score_cli(capsys, folder / "fc_leads.nc", folder / "truth.nc", folder / "s.csv")
    assert code == 2 and "fc_leads.nc repeats lead time(s) 1 days" in err and len(err.strip().splitlines()) == 1, err
    assert not (folder / "s.csv").exists()


def test_the_run_lock_is_no_hard_link_to_another_file(tmp_path):
    """A `.lock` hard-linked to a file (the same file under two names) was emptied by taking
    the lock, as a symbolic link was."""
    from dchag.train.lock import LockFileError, RunLock

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    lock = tmp_path / "run" / ".lock"
    lock.parent.mkdir()
    os.link(victim, lock)
    with pytest.raises(LockFileError, match=r"\.lock is a hard link \(2 names of one file\)"):
        RunLock(lock.parent).check_free()
    assert victim.read_text() == "precious\n"
    lock.unlink()
    RunLock(lock.parent).check_free()  # a file of its own
    assert lock.is_file() and victim.read_text() == "precious\n"


@pytest.mark.parametrize("flag", ["--intra-bw", "--inter-bw"])
def test_advise_refuses_numbers_that_give_times_that_are_not_finite(tmp_path, capsys, flag):
    """Positive but absurd numbers (1e-300 B/s) gave 'inf ms' or 'R = inf' and a
    recommendation; now one line saying the times are not finite."""
    args = {"--alpha": "50e-6", "--intra-bw": "200e9", "--inter-bw": "12.5e9", "--compute-s": "0.18"}
    args[flag] = "1e-300"
    argv = ["advise", *[x for kv in args.items() for x in kv], "--gradient-bytes", "200e6"]
    out = tmp_path / "r.json"
    assert main([*argv, "--gpus", "16", "--gpus-per-node", "4", "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "not finite" in err, err
    assert not out.exists()


def test_advise_with_a_flop_rate_and_no_profile_counts_flops_only(tmp_path, capsys):
    """--flops-per-s without a calibrated profile leaves the other rates out (infinite
    bandwidth): the advice is given, with the token and fused front ends side by side."""
    out = tmp_path / "advice.md"
    argv = ["advise", "--alpha", "50e-6", "--intra-bw", "200e9", "--inter-bw", "12.5e9", "--flops-per-s", "100e12"]
    argv += ["--model", "config/era5.yaml", "--channels", "512", "--gpus", "16", "--gpus-per-node", "8"]
    assert main([*argv, "--gpu-memory-gb", "80", "--output", str(out)]) == 0
    text = out.read_text()
    assert "| dchag-l | fused | 8 |" in text and "| dp | tokens | 1 |" in text
    assert "Recommendation: dchag-" in text and "; both: dchag-" in text
