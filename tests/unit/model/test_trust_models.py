"""Untrusted model folders and checkpoints, tried as a hostile user would: a model folder is
checked as a whole (description, header, size, shapes, parameter count) before it costs memory
or time, at load and at plan time; checkpoint metadata reaches nothing outside its folder and
is compared with the model before anything is allocated; bytes damaged in place are found by
the checksums written at save."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import pickle
import resource
import shutil
import signal
from pathlib import Path

import pytest
import scipy.io
import torch
from support.hsi import hsi_model

from dchag.cli import main
from dchag.config import ConfigError, settings, validate
from dchag.hsi import demo
from dchag.model import ChannelViT
from dchag.model import folder as model_folder
from dchag.model.folder import ModelFolderError
from dchag.plan import check_run
from dchag.train import checkpoint as ckpt


@contextlib.contextmanager
def _within(seconds: float):
    """Fail (not hang) when the body runs longer than ``seconds``."""

    def late(*_):
        raise TimeoutError(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, late)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


# -- model folders ------------------------------------------------------------------------
MODEL = {"patch_size": 1, "embed_dim": 16, "depth": 1, "num_heads": 2, "aggregation": "linear", "groups": 2}


def _section(tmp: Path) -> dict:
    cube, labels, _, _ = demo.scene(20, 20, seed=3)
    scipy.io.savemat(tmp / "img.mat", {"indian_pines": cube})
    scipy.io.savemat(tmp / "gt.mat", {"indian_pines_gt": labels})
    return {"image": str(tmp / "img.mat"), "labels": str(tmp / "gt.mat"), "patch": 5}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A small classification model as `dchag export` writes it (real preprocessing, real
    safetensors writer), and the hsi section it was made from."""
    tmp = tmp_path_factory.mktemp("model")
    section = _section(tmp)
    model, _ = hsi_model(tmp, "classification", section, MODEL)
    model_folder.save(model, tmp / "model")
    return tmp / "model", section


def _copy(good: Path, to: Path, meta_edit=None) -> Path:
    shutil.copytree(good, to)
    if meta_edit is not None:
        meta = json.loads((to / "model.json").read_text())
        meta = meta_edit(meta)
        (to / "model.json").write_text(json.dumps(meta))
    return to


def _set(path: str, value):
    """An edit of model.json setting the dotted key ``path`` (deleting it for ``...``)."""

    def edit(meta):
        *parents, last = path.split(".")
        d = meta
        for p in parents:
            d = d[p]
        if value is ...:
            del d[last]
        else:
            d[last] = value
        return meta

    return edit


CRAFTED = {
    "not a mapping": (lambda meta: [meta], "does not describe a dchag model"),
    "model not a mapping": (_set("model", [1, 2]), "'model'"),
    "width a string": (_set("model.embed_dim", "16"), "'model.embed_dim'"),
    "width negative": (_set("model.embed_dim", -16), "'model.embed_dim'"),
    "width zero": (_set("model.embed_dim", 0), "'model.embed_dim'"),
    "width huge": (_set("model.embed_dim", 2**40), "'model.embed_dim'"),
    "depth a boolean": (_set("model.depth", True), "'model.depth'"),
    "depth 10**7": (_set("model.depth", 10**7), "'model.depth'"),
    "heads do not divide the width": (_set("model.num_heads", 3), "'model.num_heads'"),
    "unknown aggregation": (_set("model.aggregation", "dchag"), "'model.aggregation'"),
    "missing key": (_set("model.patch_size", ...), "'model.patch_size' is missing"),
    "unknown key": (_set("model.dropout", 0.1), "'model.dropout'"),
    "image size a string": (_set("model.img_size", "5x5"), "'model.img_size'"),
    "mlp ratio negative": (_set("model.mlp_ratio", -4), "'model.mlp_ratio'"),
    "groups beyond the channels": (_set("model.groups", 1000), "model.groups 1000"),
    "one class": (_set("model.num_classes", 1), "'model'"),
    "task unknown": (_set("task", "segmentation"), "'task'"),
    "wavelengths not numbers": (_set("model.wavelengths", ["a"] * 200), "'model.wavelengths'"),
    "normalisation too short": (_set("normalisation.mean", [0.0]), "'normalisation.mean'"),
    "std zero": (_set("normalisation.std", [0.0] * 200), "'normalisation.std'"),
    "weights not a mapping": (_set("weights", "model.safetensors"), "'weights'"),
    "class names of another count": (_set("class_names", ["a"]), "'class_names'"),
    "sample size another": (_set("sample_size", 7), "'sample_size'"),
    "bands missing": (_set("bands", ...), "'bands' is missing"),
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_every_malformed_model_description_is_one_line_naming_file_and_key(exported, tmp_path, capsys, case):
    edit, key = CRAFTED[case]
    d = _copy(exported[0], tmp_path / "m", edit)
    with _within(20), pytest.raises(ModelFolderError, match=key) as err:
        model_folder.load(d)
    assert str(d / "model.json") in str(err.value) and "\n" not in str(err.value)
    code = main(["predict", "--model", str(d), "--image", exported[1]["image"], "--output", str(tmp_path / "o.zarr")])
    stderr = capsys.readouterr().err
    assert code == 2 and len(stderr.strip().splitlines()) == 1 and "Traceback" not in stderr, stderr
    assert not (tmp_path / "o.zarr").exists()


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_the_tensor_shapes_are_compared_before_the_network_is_built(exported, tmp_path):
    """A wider model.json with the small model's weights: refused from the header, not after
    building the network it describes (0.8 GB for width 4000; 100 GB for 40000)."""
    for width, message in ((4000, "does not fit the model .* other shape or dtype: .*blocks.0"),
                           (40000, r"describes a network of 27,218,000,206 parameters")):  # fmt: skip
        d = _copy(exported[0], tmp_path / str(width), _set("model.embed_dim", width))
        before = _peak_rss_mb()
        with pytest.raises(ModelFolderError, match=message):
            model_folder.load(d)
        assert _peak_rss_mb() - before < 200


def test_the_weights_are_hashed_only_after_header_and_size_are_checked(exported, tmp_path):
    """A sparse 1 TB model.safetensors: refused at once from its size, never hashed."""
    d = _copy(exported[0], tmp_path / "m")
    with open(d / "model.safetensors", "r+b") as f:
        f.truncate(2**40)
    with _within(10), pytest.raises(ModelFolderError, match=r"model.safetensors is 1099511627776 bytes; its header"):
        model_folder.load(d)
    # a header claiming 2**62 bytes, the hash made to match
    (d / "model.safetensors").write_bytes((2**62).to_bytes(8, "little") + b"{}")
    meta = json.loads((d / "model.json").read_text())
    meta["weights"]["sha256"] = model_folder._sha256(d / "model.safetensors")
    (d / "model.json").write_text(json.dumps(meta))
    with _within(10), pytest.raises(ModelFolderError, match="a header of 4611686018427387904 bytes"):
        model_folder.load(d)


def test_a_description_too_large_to_load_is_refused_by_its_parameter_count(exported, tmp_path):
    """Every size within its bound, the network beyond the parameter bound: refused from the
    description, built on the meta device only."""
    big = {"embed_dim": 2**14, "depth": 512, "num_heads": 16}
    d = _copy(exported[0], tmp_path / "m", lambda meta: {**meta, "model": {**meta["model"], **big}})
    before = _peak_rss_mb()
    with _within(20), pytest.raises(ModelFolderError, match=r"describes a network of [\d,]+ parameters"):
        model_folder.load(d)
    assert _peak_rss_mb() - before < 500


@pytest.mark.parametrize("where", ["absolute", "parent"])
def test_the_weights_file_is_a_bare_name_inside_the_folder(exported, tmp_path, where):
    """model.json may not send the loader to a file outside its folder (here: another copy of
    the weights, whose hash matches)."""
    outside = _copy(exported[0], tmp_path / "elsewhere")
    name = str(outside / "model.safetensors") if where == "absolute" else "../elsewhere/model.safetensors"
    d = _copy(exported[0], tmp_path / "m", _set("weights.file", name))
    (d / "model.safetensors").unlink()
    with pytest.raises(ModelFolderError, match="'weights.file' .* the bare name model.safetensors inside the model"):
        model_folder.load(d)


def test_weights_of_the_right_shapes_are_still_compared_with_their_hash(exported, tmp_path):
    d = _copy(exported[0], tmp_path / "m")
    data = bytearray((d / "model.safetensors").read_bytes())
    data[-16:] = bytes(b ^ 0xFF for b in data[-16:])
    (d / "model.safetensors").write_bytes(bytes(data))
    model_folder.check(d)  # header, size and shapes are right
    with pytest.raises(ModelFolderError, match="is not the file .* describes"):
        model_folder.load(d)


def test_a_well_formed_folder_still_checks_and_loads(exported, tmp_path):
    # both files readable by whoever may read the folder (the umask's, as model.json's): a
    # shared project directory's model (safetensors alone writes 0600)
    mask = os.umask(0)
    os.umask(mask)
    for name in ("model.safetensors", "model.json"):
        assert (exported[0] / name).stat().st_mode & 0o777 == 0o666 & ~mask, name
    model = model_folder.load(exported[0])
    assert model.config.embed_dim == 16 and model.task == "classification"
    meta, cfg = model_folder.check(exported[0])
    assert cfg == model.config and meta["weights"]["file"] == "model.safetensors"


# -- at plan time --------------------------------------------------------------------------------
def _config(section: dict, model: dict | None = None, **run) -> dict:
    from support.hsi import hsi_config

    cfg = hsi_config("classification", section, preset="indian_pines")
    return validate(
        {
            **cfg,
            "model": model or MODEL,
            "parallel": {"tp": 1},
            "train": {"runs": {"r": {"task": "classification", **run}}},
        }
    )


def _plan(section: dict, model: dict | None = None, **run):
    return check_run(settings(_config(section, model, **run)), "r")


def test_init_from_a_crafted_folder_is_refused_at_plan_time(exported, tmp_path):
    good, section = exported
    _plan(section, init_from=str(good))  # fine
    cases = {
        "depth": (_set("model.depth", 10**7), "'model.depth'"),
        "width": (_set("model.embed_dim", 4000), "does not fit the model"),
    }
    for name, (edit, message) in cases.items():
        d = _copy(good, tmp_path / name, edit)
        with _within(20), pytest.raises(ConfigError, match=f"config key 'train.runs.r.init_from': .*{message}"):
            _plan(section, init_from=str(d))
    sparse = _copy(good, tmp_path / "sparse")
    with open(sparse / "model.safetensors", "r+b") as f:
        f.truncate(2**40)
    with _within(10), pytest.raises(ConfigError, match="init_from': .* is 1099511627776 bytes"):
        _plan(section, init_from=str(sparse))


def test_model_sizes_beyond_the_memory_of_the_node_are_refused(exported, tmp_path):
    from dchag.checks import check_model_size
    from dchag.train.preflight import check_launch

    section = exported[1]
    wide = {**MODEL, "embed_dim": 1024, "depth": 8, "num_heads": 2}  # 400 MB of blocks
    run = _plan(section, wide, train={"nproc": 4}).settings
    with pytest.raises(ConfigError, match=r"on each of the 4 processes of a node, more than the 1,000 MB of a limit"):
        check_model_size("train.runs.r", run, 1000, "a limit")
    check_model_size("train.runs.r", run, 2000, "a limit")  # 4 x 400 MB: fits
    # launch-train, before torchrun or any store: against what this machine (its cgroup) allows
    huge = _config(section, {**MODEL, "embed_dim": 2**20, "num_heads": 2})
    with pytest.raises(
        ConfigError, match=r"model.embed_dim 1048576, model.depth 1 .* MB of (this machine's memory|the cgroup)"
    ):
        check_launch(huge, "r", tmp_path / "run", {"train": tmp_path / "none", "val": tmp_path / "none"}, None, 2)
    assert not (tmp_path / "run").exists()


# -- checkpoints ---------------------------------------------------------------------------------
def _manager(run: Path, model: torch.nn.Module) -> ckpt.CheckpointManager:
    return ckpt.CheckpointManager(run, {"task": "t"}, every=2, keep=None, rank=0, parts={"model": model})


def _two_steps(run: Path) -> tuple[torch.nn.Module, dict]:
    """Checkpoints step_2 and step_4 of a small model; its weights at step 2."""
    model = torch.nn.Linear(64, 32)
    manager = _manager(run, model)
    manager.prepare()
    manager.save_step(2)
    at_2 = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.fill_(1.25)
    manager.save_step(4)
    return model, at_2


def _flip(path: Path, pattern: bytes, count: int = 16) -> None:
    data = bytearray(path.read_bytes())
    at = data.index(pattern)
    data[at : at + count] = bytes(b ^ 0xFF for b in data[at : at + count])
    path.write_bytes(bytes(data))


def test_bytes_flipped_in_a_checkpoint_are_found_and_the_previous_one_loads(tmp_path, caplog):
    model, at_2 = _two_steps(tmp_path)
    step_4 = tmp_path / "checkpoints" / "step_4"
    (shard,) = step_4.glob("*.distcp")
    _flip(shard, torch.tensor([1.25] * 4).numpy().tobytes())  # 16 bytes of the weight, still parseable
    manager = _manager(tmp_path, model)
    manager.prepare()  # sizes are right: not found here
    with caplog.at_level("WARNING"):
        assert manager.resume(10) == tmp_path / "checkpoints" / "step_2"
    assert f"{shard.name} differs from the SHA-256 written when it was saved" in caplog.text
    assert all(torch.equal(v, at_2[k]) for k, v in model.state_dict().items())
    (aside,) = (tmp_path / "superseded").iterdir()
    assert (aside / "step_4").is_dir() and shard.name in (aside / "why.txt").read_text()
    listed = json.loads((aside / "step_4" / "checksums.json").read_text())["sha256"]
    assert {".metadata", "fingerprint.json", shard.name} == set(listed)


def test_a_damaged_checkpoint_is_refused_when_its_weights_are_exported(tmp_path):
    """load_weights (export, evaluation) verifies the files it reads."""
    _two_steps(tmp_path)
    step_4 = tmp_path / "checkpoints" / "step_4"
    fresh = torch.nn.Linear(64, 32)
    ckpt.load_weights(fresh, step_4)
    assert torch.all(fresh.weight == 1.25)
    (shard,) = step_4.glob("*.distcp")
    _flip(shard, torch.tensor([1.25] * 4).numpy().tobytes())
    with pytest.raises(ckpt.CheckpointError, match=f"{shard.name} differs from the SHA-256"):
        ckpt.load_weights(torch.nn.Linear(64, 32), step_4)


def _as_older_dchag(directory: Path) -> None:
    """Make ``directory`` look like a checkpoint of a dchag before checksums: no checksums.json,
    no mark of them in its fingerprint."""
    (directory / "checksums.json").unlink(missing_ok=True)
    stamp = json.loads((directory / "fingerprint.json").read_text())
    stamp.pop(ckpt.HAS_CHECKSUMS, None)
    (directory / "fingerprint.json").write_text(json.dumps(stamp))


def _rewrite_metadata(directory: Path, edit) -> None:
    meta = ckpt.read_metadata(directory)
    edit(meta)
    meta.storage_meta = None
    (directory / ".metadata").write_bytes(pickle.dumps(meta))
    _as_older_dchag(directory)  # only the metadata is there to believe


def test_dcp_storage_paths_must_be_bare_names_inside_the_checkpoint(tmp_path):
    """A shard path ``../elsewhere/...`` is refused, not opened (here it names a real shard
    outside the checkpoint, which would load)."""
    model, _ = _two_steps(tmp_path)
    step_4 = tmp_path / "checkpoints" / "step_4"
    (shard,) = step_4.glob("*.distcp")
    (tmp_path / "elsewhere").mkdir()
    shutil.move(shard, tmp_path / "elsewhere" / shard.name)

    def outside(meta):
        for info in meta.storage_data.values():
            info.relative_path = f"../../elsewhere/{shard.name}"

    _rewrite_metadata(step_4, outside)
    with pytest.raises(ckpt.CheckpointError, match=r"in '../../elsewhere/.*'; expected the bare name of a file"):
        ckpt.load(ckpt.flatten({"model": model}), step_4)
    with pytest.raises(ckpt.CheckpointError, match="expected the bare name"):
        ckpt.load_weights(torch.nn.Linear(64, 32), step_4)


def test_dcp_tensor_sizes_are_compared_with_the_model_before_any_allocation(tmp_path):
    """A stated size of 10^6 x 10^6 (4 TB) is refused from the metadata."""
    _two_steps(tmp_path)
    step_4 = tmp_path / "checkpoints" / "step_4"

    def huge(meta):
        meta.state_dict_metadata["model.weight"].size = torch.Size([10**6, 10**6])

    _rewrite_metadata(step_4, huge)
    before = _peak_rss_mb()
    with pytest.raises(ckpt.CheckpointError, match=r"weight has shape \(1000000, 1000000\) in the checkpoint"):
        ckpt.load_weights(torch.nn.Linear(64, 32), step_4)
    assert _peak_rss_mb() - before < 500

    def double(meta):
        meta.state_dict_metadata["model.weight"].size = torch.Size([32, 64])
        meta.state_dict_metadata["model.weight"].properties.dtype = torch.float64

    _rewrite_metadata(step_4, double)
    with pytest.raises(ckpt.CheckpointError, match=r"weight is torch.float64 in the checkpoint"):
        ckpt.load_weights(torch.nn.Linear(64, 32), step_4)
    model = torch.nn.Linear(64, 32)
    with pytest.raises(ckpt.CheckpointError, match=r"other shape or dtype: model.weight float64 vs float32"):
        ckpt.load(ckpt.flatten({"model": model}), step_4)


def test_a_checkpoint_without_checksums_still_loads(tmp_path):
    """An older dchag's checkpoint (no checksums.json) loads, its sizes checked."""
    _two_steps(tmp_path)
    step_4 = tmp_path / "checkpoints" / "step_4"
    _as_older_dchag(step_4)
    fresh = torch.nn.Linear(64, 32)
    ckpt.load(ckpt.flatten({"model": fresh}), step_4)
    assert torch.all(fresh.weight == 1.25)


def test_a_checkpoint_that_lost_its_checksums_is_damaged(tmp_path, caplog):
    """Deleting checksums.json does not turn the check off: the fingerprint says they were
    written, so the checkpoint moves aside and the previous one resumes."""
    model, at_2 = _two_steps(tmp_path)
    step_4 = tmp_path / "checkpoints" / "step_4"
    (shard,) = step_4.glob("*.distcp")
    _flip(shard, torch.tensor([1.25] * 4).numpy().tobytes())
    (step_4 / "checksums.json").unlink()
    manager = _manager(tmp_path, model)
    manager.prepare()
    with caplog.at_level("WARNING"):
        assert manager.resume(10) == tmp_path / "checkpoints" / "step_2"
    assert "checksums.json is missing" in caplog.text
    assert all(torch.equal(v, at_2[k]) for k, v in model.state_dict().items())


def test_a_model_folder_from_before_the_fused_front_end_loads_and_runs_either_way(exported, tmp_path):
    """A model folder whose model.json has no fused_front_end (written before it existed)
    loads with the schema's default, and gives the token path's outputs."""
    old = _copy(exported[0], tmp_path / "old", _set("model.fused_front_end", ...))
    loaded = model_folder.load(old)
    assert loaded.config.fused_front_end is True
    tokens = ChannelViT(dataclasses.replace(loaded.config, fused_front_end=False)).eval()
    tokens.load_state_dict(loaded.network.state_dict())
    x = torch.randn(2, loaded.config.in_channels, *loaded.config.img_size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded.network(x), tokens(x), rtol=1e-5, atol=1e-6)
    bad = _copy(exported[0], tmp_path / "bad", _set("model.fused_front_end", "yes"))
    with pytest.raises(model_folder.ModelFolderError, match="model.fused_front_end"):
        model_folder.load(bad)
