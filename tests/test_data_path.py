"""The data path: every store the pipeline writes holds its fields as float32, and the
training datasets read a batch's chunks in one concurrent read, the same values as memory."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import zarr

# Arrays that are not float32 fields on purpose: a climatology part's float64 time sum (summed
# over the parts, then divided by the step count; temporary).
NOT_FIELDS = {"time_sum"}


def float_arrays(store: str | Path) -> dict[str, np.dtype]:
    """Every floating-point array of a Zarr store with 2 or more dimensions (a field: not a
    per-channel, per-band or per-sample coordinate), by path, with its dtype on disk."""
    found = {}

    def walk(group: zarr.Group, prefix: str) -> None:
        for name, member in group.members():
            path = f"{prefix}{name}"
            if isinstance(member, zarr.Group):
                walk(member, f"{path}/")
            elif member.dtype.kind == "f" and member.ndim >= 2 and name not in NOT_FIELDS:
                found[path] = member.dtype

    walk(zarr.open_group(store=str(store), mode="r"), "")
    return found


def assert_float32(stores: list[Path]) -> None:
    empty = [str(s) for s in stores if not float_arrays(s)]
    assert not empty, f"no field in {empty}"
    wrong = {f"{s.name}:{k}": str(v) for s in stores for k, v in float_arrays(s).items() if v != np.float32}
    assert not wrong, wrong


def _forecast_model(root: Path, cfg: dict, store: Path):
    """An untrained (seeded) forecasting model described from ``store`` as export does."""
    from test_train import run_config

    from dchag.config import run_settings, validate
    from dchag.model import ChannelViT
    from dchag.predict import artifact
    from dchag.train.tasks import build_task

    c = validate(run_config(cfg, steps=1))
    t = build_task(run_settings(c, "f"), {"train": store, "val": store})
    torch.manual_seed(0)
    return artifact.describe(t, store, ChannelViT(t.model_cfg), {"run": "f"})


def test_every_era5_store_the_pipeline_writes_is_float32(data_root, tmp_path):
    from dchag.era5.climatology import climatology_part, combine_climatology
    from dchag.evaluate.forecast import baseline_forecast, wb2_climatology, write_truth
    from dchag.predict.weather import forecast, from_store

    root, cfg = data_root
    train, val = root / "era5" / "train.zarr", root / "era5" / "val.zarr"
    years = [root / "y2001.zarr", root / "y2002.zarr"]
    parts = [climatology_part(years, k, 2, tmp_path / f"part{k}.zarr") for k in (1, 2)]
    clim = combine_climatology(parts, tmp_path / "climatology.zarr")
    wb2_climatology(str(clim), str(tmp_path / "clim_wb2.zarr"))
    variables = ["z500", "t850", "t2m"]
    write_truth(str(val), variables, str(tmp_path / "truth.zarr"))
    for kind in ("persistence", "climatology"):
        baseline_forecast(kind, str(val), variables, [24, 48], str(tmp_path / f"{kind}.zarr"), str(clim))
    model = _forecast_model(root, cfg, train)
    forecast(model, from_store(model, str(val)), [24, 48], str(tmp_path / "forecast.zarr"), batch_size=4)
    stores = [
        *years,
        train,
        val,
        *parts,
        clim,
        tmp_path / "clim_wb2.zarr",
        tmp_path / "truth.zarr",
        tmp_path / "persistence.zarr",
        tmp_path / "climatology.zarr",
        tmp_path / "forecast.zarr",
    ]
    assert_float32(stores)


def test_every_hyperspectral_store_and_prediction_is_float32(tmp_path):
    import scipy.io
    from test_predict import _hsi_model

    from dchag.hsi import demo
    from dchag.predict.hsi import classify_scene, reconstruct_image

    cube, labels, _, _ = demo.scene(24, 24, seed=3)
    scipy.io.savemat(tmp_path / "img.mat", {"indian_pines": cube})
    scipy.io.savemat(tmp_path / "gt.mat", {"indian_pines_gt": labels})
    small = {"patch_size": 1, "embed_dim": 16, "depth": 1, "num_heads": 2, "aggregation": "linear", "groups": 2}
    scene = {"image": str(tmp_path / "img.mat"), "labels": str(tmp_path / "gt.mat"), "patch": 5}
    classifier, patches = _hsi_model(tmp_path, "classification", scene, small)
    images = demo.write_envi(tmp_path / "envi", count=2, rows=32, cols=32)
    section = {"images": [str(p) for p in images], "tile": 16}
    mae, tiles = _hsi_model(tmp_path, "mae", section, {**small, "patch_size": 4})
    classify_scene(classifier, str(tmp_path / "img.mat"), str(tmp_path / "map.zarr"))
    reconstruct_image(mae, str(images[0]), str(tmp_path / "recon.zarr"), None, 2)
    assert_float32([Path(patches), Path(tiles), tmp_path / "map.zarr", tmp_path / "recon.zarr"])
