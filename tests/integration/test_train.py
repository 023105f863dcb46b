"""Training on CPU/gloo. Through torchrun: kill-and-resume equals an uninterrupted run, a signal
checkpoints, two "nodes" train as one group, bad inputs give clear errors. What the trainer does
(the lightweight alternatives, resuming after a change) on gloo ranks without torchrun's agent
(`train_in_ranks`). Checkpoints refuse foreign models and pickled code."""

from __future__ import annotations

import json
import math
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from support import BIN
from support.commands import final_weights, finish, launch_train, run_config, store_args, train_in_ranks, train_once
from support.distributed import free_port, run_distributed

from dchag.bench.procs import ranks


@pytest.mark.parametrize("block", ["contiguous", "scattered"])
def test_the_forecast_dataset_reads_the_same_samples_from_memory_or_zarr(data_root, block):
    """A rank's channels and the outputs at t + lead: batches read from Zarr (in one read),
    from the in-memory copy (train.cache_mb) and one sample at a time are the same samples,
    for a block of the store's channels and for a run's channel subset out of store order."""
    from dchag.store import open_store
    from dchag.train.data import ForecastDataset

    root, _ = data_root
    store = root / "era5" / "train.zarr"
    ds = open_store(store)
    names = list(ds.channel.values)
    if block == "contiguous":
        channels, rank, want, outputs = names, [2, 3, 4], [2, 3, 4], ["z500", "t2m"]
    else:  # the run's channels in another order than the store's; rank 0 holds 6, 1, 2
        channels, rank, want, outputs = [names[6], names[1], names[2], names[0]], [0, 1, 2], [6, 1, 2], ["t2m", "z500"]
    args = (store, channels, rank, outputs, (24, 48), 7)
    zarr_read, cached = ForecastDataset(*args), ForecastDataset(*args, cache_bytes=2**20)
    assert zarr_read.x_mem is None and cached.x_mem is not None
    values = ds.data.values
    out = [names.index(o) for o in outputs]
    for d in (zarr_read, cached):
        for i, (x, lead, y) in zip([5, 0, 5], d.__getitems__([5, 0, 5])):
            assert lead.item() in (24.0, 48.0) and lead.item() == d.lead_of(i)
            assert x.dtype == y.dtype == torch.float32
            assert np.array_equal(x.numpy(), values[i, want]) and np.array_equal(
                y.numpy(), values[i + int(lead) // 24, out]
            )
        assert all(torch.equal(a, b) for a, b in zip(d[1], zarr_read[1]))


def test_sigkill_a_worker_then_resume_equals_uninterrupted_run(data_root, tmp_path):
    root, base = data_root
    cfg = run_config(base)
    clean = launch_train(cfg, tmp_path / "clean", root)
    out = finish(clean, tmp_path / "clean")
    assert clean.returncode == 0, out[-3000:]

    killed = launch_train(cfg, tmp_path / "killed", root)
    log = tmp_path / "killed" / "log.csv.partial"
    deadline = time.time() + 240
    victim = None
    while time.time() < deadline and victim is None:
        if log.exists() and len(log.read_text().splitlines()) > 15:  # past the step-10 checkpoint
            workers = ranks(killed.pid)
            if len(workers) == 2:
                victim = max(workers)
                os.kill(victim, signal.SIGKILL)
        time.sleep(0.1)
    assert victim is not None, "the run ended before a worker could be killed"
    out = finish(killed, tmp_path / "killed")
    assert killed.returncode == 0, out[-3000:]
    assert "resuming from" in out

    a, b = final_weights(tmp_path / "clean"), final_weights(tmp_path / "killed")
    assert a.keys() == b.keys() and any(k.startswith("model.tokenizer[") for k in a)
    for k in a:
        assert torch.equal(a[k], b[k]), k
    rows = (tmp_path / "killed" / "log.csv").read_text().splitlines()
    assert len(rows) == 31 and rows[-1].startswith("30,")  # one row per step, none repeated
    losses = [float(r.split(",")[2]) for r in rows[1:]]
    assert sum(losses[-5:]) < sum(losses[:5])
    # TensorBoard: read back with TensorBoard's own reader; the resumed run replaced the steps
    # its killed attempt had logged past the checkpoint, so each step is there once, as in log.csv.
    for run in ("clean", "killed"):
        scalars = _tensorboard_scalars(tmp_path / run / "tensorboard")
        assert [s for s, _ in scalars["train/loss"]] == list(range(1, 31)), run
        assert [v for _, v in scalars["train/loss"]] == pytest.approx(losses, rel=1e-6), run
        assert [s for s, _ in scalars["val/loss"]] == [10, 20, 30]
    # the communication timer and memory tracker are off by default: no step is instrumented
    assert all(not r.split(",")[12] for r in rows[1:]) and "instrumented" in rows[0].split(",")[12]


def test_a_signal_checkpoints_the_step_and_a_rerun_continues(data_root, tmp_path):
    """SIGUSR1 (a Slurm warning before the time limit; SIGTERM takes the same path) to the
    launcher: every rank finishes its step, the step is checkpointed, the launch ends in one
    line naming the checkpoint, and the rerun continues from it, each step logged once; in
    MLflow too (train.mlflow, the default SQLite store beside the run): the rerun continues the
    same MLflow run, and the export logs the model folder to it."""
    root, base = data_root
    cfg = run_config(base, steps=400, checkpoint_every=1000, val_every=1000, num_workers=1, mlflow={"enabled": True})
    out = tmp_path / "run"
    launch = [sys.executable, "-m", "dchag", "launch-train", "--config", json.dumps(cfg), "--run-name", "f"]
    launch += ["--output", str(out), *store_args(root), "--nproc", "2", "--threads-per-rank", "1"]
    proc = subprocess.Popen(launch, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline, sent = time.time() + 240, False
    while time.time() < deadline and proc.poll() is None and not sent:
        partial = out / "log.csv.partial"
        if partial.exists() and len(partial.read_text().splitlines()) > 5:
            os.kill(proc.pid, signal.SIGUSR1)
            sent = True
        time.sleep(0.1)
    stdout, stderr = proc.communicate(timeout=240)
    assert sent, stderr[-3000:]
    last = stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and "stopped by SIGUSR1; a rerun continues from" in last, stderr[-3000:]
    stopped = [line for line in stderr.splitlines() if "stopped by SIGUSR1 after step" in line]
    step = int(stopped[0].split("after step ")[1].split()[0])
    assert 5 <= step < 400 and last.endswith(f"checkpoints/step_{step}") and not (out / "final").exists()
    # the rerun (Snakemake's retry of the job) continues from that step to the end
    longer = json.dumps({**cfg, "train": {**cfg["train"], "steps": step + 3}})
    done = subprocess.run([*launch[:5], longer, *launch[6:]], capture_output=True, text=True)
    assert done.returncode == 0 and f"(step {step})" in done.stderr, done.stderr[-3000:]
    rows = (out / "log.csv").read_text().splitlines()[1:]
    assert [int(r.split(",")[0]) for r in rows] == list(range(1, step + 4))
    _check_mlflow_run(json.loads(longer), root, out, step)


def _check_mlflow_run(cfg: dict, root: Path, out: Path, stopped: int) -> None:
    """The MLflow store beside the run, read by MLflow's client: one run, FINISHED, with the
    config as params, every step's metrics once at its step, and the exported model folder."""
    from mlflow import MlflowClient

    from dchag.predict.export import export

    export(cfg, "f", out / "final", out / "model", root / "era5" / "train.zarr")
    client = MlflowClient(f"sqlite:///{out.parent / 'mlflow' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(cfg["name"])
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == "f" and run.info.status == "FINISHED"
    assert json.loads((out / "final" / "mlflow.json").read_text())["run_id"] == run.info.run_id
    params, tags = run.data.params, run.data.tags
    assert params["train.lr"] == "0.003" and params["parallel.tp"] == "2" and params["train.steps"] == "400"
    assert tags["changed.train.steps"] == f"400 -> {stopped + 3} at step {stopped}"
    assert tags["resumed_at_step"] == str(stopped) and tags["version.torch"] == torch.__version__
    losses = client.get_metric_history(run.info.run_id, "train/loss")
    assert sorted(m.step for m in losses) == list(range(1, stopped + 4))
    logged = {int(r.split(",")[0]): float(r.split(",")[2]) for r in (out / "log.csv").read_text().splitlines()[1:]}
    assert all(math.isclose(m.value, logged[m.step], rel_tol=1e-6) for m in losses)
    assert [m.step for m in client.get_metric_history(run.info.run_id, "val/loss")] == [stopped + 3]
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id, "model")}
    assert artifacts == {"model/model.json", "model/model.safetensors"}
    assert "config.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


def _tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(directory), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c["parallel"].update(tp=2), "world size 1 is not a multiple of the tensor-parallel size tp=2"),
        (
            lambda c: c["era5"]["channels"]["single_level"].append("mean_sea_level_pressure"),
            "lacks channel(s) the model expects: msl",
        ),
        (lambda c: c["train"]["forecast"].update(lead_hours=[24, 2400]), "lead time 2400 h is beyond the data's range"),
    ],
    ids=["world vs tp", "missing channel", "lead time"],
)
def test_bad_training_inputs(data_root, tmp_path, edit, message):
    root, base = data_root
    cfg = json.loads(json.dumps(run_config(base)))
    cfg["parallel"]["tp"] = 1
    edit(cfg)
    proc = train_once(cfg, tmp_path, root)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "final").exists() and not (tmp_path / "run" / "log.csv").exists()


def _checkpoint_other_model(rank, world, tmp):
    from dchag.model import ChannelViT
    from dchag.model.build import model_config_of
    from dchag.train import checkpoint as ckpt
    from dchag.train import state

    a = ChannelViT(
        model_config_of(
            in_channels=6,
            img_size=(8, 8),
            embed_dim=16,
            depth=1,
            num_heads=2,
            aggregation="linear",
            groups=2,
            out_channels=[0],
            task="forecast",
        )
    )
    b = ChannelViT(
        model_config_of(
            in_channels=6,
            img_size=(8, 8),
            embed_dim=32,
            depth=2,
            num_heads=2,
            aggregation="linear",
            groups=2,
            out_channels=[0],
            task="forecast",
        )
    )

    def parts(model):
        return {
            "model": state.ModelState(model),
            "optim": state.OptimizerState(model, torch.optim.AdamW(model.parameters())),
            "trainer": state.CountersState({"step": 1}),
        }

    ckpt.save(ckpt.flatten(parts(a)), Path(tmp) / "ck")
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load(ckpt.flatten(parts(b)), Path(tmp) / "ck")
    msg = str(err.value)
    assert "another model" in msg and "missing from the checkpoint: model.blocks.1.attn.inner.proj.bias" in msg
    assert "model.blocks.0.mlp.fc1.weight (64, 16) vs (128, 32)" in msg
    # Metadata that names code instead of data is refused, never executed.
    evil = Path(tmp) / "evil"
    evil.mkdir()

    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(Path(tmp) / "pwned"),))

    (evil / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(ckpt.CheckpointError, match="refusing"):
        ckpt.SafeReader(str(evil)).read_metadata()
    assert not (Path(tmp) / "pwned").exists()


def test_checkpoints_refuse_other_models_and_code(tmp_path):
    run_distributed(_checkpoint_other_model, 1, str(tmp_path))


def test_cluster_launch_command_from_a_slurm_allocation():
    from dchag.train.launch import RANK_ENTRY, expand_hostlist, torchrun_command

    assert expand_hostlist("gpu[01-03,07],login1") == ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "node[07-08]", "SLURM_NNODES": "2", "PATH": "/nonexistent"}
    cmd = torchrun_command(4, 2, ["--config", "c.yaml"], env)
    assert cmd[:3] == ["torchrun", "--nproc-per-node=4", "--max-restarts=2"]
    # the port follows the job id (two jobs on one head node do not share it), or DCHAG_RDZV_PORT
    assert {"--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=node07:29742", "--rdzv-id=4242"} <= set(cmd)
    assert "--rdzv-endpoint=node07:31000" in torchrun_command(4, 2, [], {**env, "DCHAG_RDZV_PORT": "31000"})
    # every rank `python -m dchag train ...`, forked from a server that has imported the trainer
    assert cmd[-7:] == ["--start-method=forkserver", "--run-path", RANK_ENTRY, "dchag", "train", "--config", "c.yaml"]
    assert "--standalone" in torchrun_command(2, 1, [], {"PATH": "/nonexistent"})
    # A one-node allocation: standalone (a free port), so jobs sharing a node do not collide.
    one = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node07", "SLURM_NNODES": "1", "PATH": "/nonexistent"}
    assert "--standalone" in torchrun_command(2, 1, [], one) and "--rdzv-backend=c10d" not in torchrun_command(
        2, 1, [], one
    )


def test_launch_sets_every_math_library_thread_count_per_rank():
    """Snakemake exports OMP/MKL/BLAS thread counts = the job's threads; torchrun would pass
    them to every rank. MKL_NUM_THREADS=2 alone made the demo's DDP forward 2-3x slower."""
    from dchag.train.launch import THREAD_VARS, rank_thread_env

    job = {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "PATH": "/bin"}
    env = rank_thread_env(job, 1)
    assert {k: env[k] for k in THREAD_VARS} == dict.fromkeys(THREAD_VARS, "1") and env["PATH"] == "/bin"
    code = "import torch; print(torch.get_num_threads())"
    out = subprocess.run(
        [sys.executable, "-c", code], env=rank_thread_env({**os.environ, **job}, 1), capture_output=True, text=True
    )
    assert out.stdout.strip() == "1", out.stderr


ALTERNATIVES = {
    "ddp int8-ef, fixed groups, rotation": (
        {"aggregation": "linear", "groups": 4},
        {"tp": 1, "strategy": "baseline", "data_parallel": "ddp", "comm_hook": "int8_ef", "ddp_bucket_mb": 0.05},
        {"rotation": {"fraction": 0.5, "lr_scale": 2.0}},
    ),
    "ddp powersgd": (
        {"aggregation": "baseline"},
        {"tp": 1, "strategy": "baseline", "data_parallel": "ddp", "comm_hook": "powersgd"},
        {},
    ),
    "fsdp zero2": (
        {"aggregation": "baseline"},
        {"tp": 1, "strategy": "baseline", "data_parallel": "fsdp", "fsdp_reshard_after_forward": False},
        {},
    ),
}


# The runs continued on another number of ranks (an allocation of another size): FSDP's shards
# resharded onto more ranks; int8-EF's per-rank residuals, a new rank starting without one.
RESHAPED = {"fsdp zero2": 4, "ddp int8-ef, fixed groups, rotation": 3}


@pytest.mark.parametrize("name", list(ALTERNATIVES))
def test_lightweight_alternatives_train(data_root, tmp_path, name):
    """The alternatives to D-CHAG as training options: DDP with bucketing and a compression
    hook, fixed channel groups without TP, channel-subset rotation, FSDP2 sharding levels; a
    longer rerun on another number of ranks resumes at the step the first one ended."""
    root, base = data_root
    model, parallel, train = ALTERNATIVES[name]
    cfg = run_config(base, steps=12, checkpoint_every=6, val_every=6, **train)
    cfg["model"].update(model)
    cfg["parallel"] = parallel
    out = tmp_path / "run"
    text = train_in_ranks(cfg, out, root)
    assert (out / "final" / ".metadata").exists(), text[-3000:]
    import csv

    rows = list(csv.DictReader(open(out / "log.csv")))
    assert len(rows) == 12 and all(math.isfinite(float(r["loss"])) for r in rows)
    info = json.loads((out / "run.json").read_text())
    if "comm_hook" in parallel:
        assert info["compression"]["hook"] == parallel["comm_hook"]
    if name in RESHAPED:
        ranks = RESHAPED[name]
        longer = run_config(base, steps=14, checkpoint_every=6, val_every=7, nproc=ranks, **train)
        longer["model"].update(model)
        longer["parallel"] = parallel
        text = train_in_ranks(longer, out, root, nproc=ranks)
        assert "resuming from" in text and "(step 12)" in text and "another configuration" not in text, text[-3000:]
        assert f"trained on 2 data-parallel rank(s), this run has {ranks}" in text, text[-3000:]
        assert "the epoch continues at its sample" in text and "a step now takes" in text
        rows = list(csv.DictReader(open(out / "log.csv")))
        assert [int(r["step"]) for r in rows] == list(range(1, 15))
        assert all(math.isfinite(float(r["loss"])) for r in rows)
        assert json.loads((out / "run.json").read_text())["parallel"]["world_size"] == ranks


def _int8_hook_check(rank, world):
    from dchag.parallel.compression import CompressionHook

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    ddp = torch.nn.parallel.DistributedDataParallel(lin)
    hook = CompressionHook("int8_ef")
    ddp.register_comm_hook(hook, CompressionHook.hook)
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(rank))
    ddp(x).square().sum().backward()
    # the reference: the exact mean of every rank's gradient
    exact = torch.autograd.grad(lin(x).square().sum(), lin.weight)[0]
    everyone = [torch.empty_like(exact) for _ in range(world)]
    dist.all_gather(everyone, exact)
    mean = torch.stack(everyone).mean(0)
    scale = max(float(g.abs().max()) for g in everyone) / 127
    assert (lin.weight.grad - mean).abs().max() <= scale  # within one quantisation step
    assert hook.residuals and all(r.abs().max() <= scale for r in hook.residuals.values())
    state = hook.checkpoint_part(ddp).state_dict()  # per parameter, this rank's
    assert set(state) == {f"rank{rank}.weight", f"rank{rank}.bias"}
    assert state[f"rank{rank}.weight"].numel() == lin.weight.numel()
    assert hook.fall_back(5) and hook.active == "fp16" and not hook.fall_back(6)


def test_int8_error_feedback_hook_averages_within_one_quantisation_step():
    run_distributed(_int8_hook_check, 2)


def _int8_ef_over_steps_check(rank, world):
    """The real hook under DDP over 20 steps of fixed weights: what DDP applied, summed, equals
    the exact mean gradients, summed, less the ranks' mean residual (error feedback's
    invariant), so the accumulated error stays within one quantisation step."""
    from dchag.parallel.compression import CompressionHook

    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 32)
    ddp = torch.nn.parallel.DistributedDataParallel(lin)
    hook = CompressionHook("int8_ef")
    ddp.register_comm_hook(hook, CompressionHook.hook)
    applied, exact_sum, scale = torch.zeros_like(lin.weight), torch.zeros_like(lin.weight), 0.0
    for step in range(20):
        x = torch.randn(8, 64, generator=torch.Generator().manual_seed(100 * step + rank)) * (1 + step % 3)
        lin.zero_grad()
        ddp(x).square().sum().backward()
        applied += lin.weight.grad
        exact = torch.autograd.grad(lin(x).square().sum(), lin.weight)[0]
        everyone = [torch.empty_like(exact) for _ in range(world)]
        dist.all_gather(everyone, exact)
        exact_sum += torch.stack(everyone).mean(0)
        scale = max(scale, max(float(g.abs().max()) for g in everyone) / 127)
    residual = hook.residuals[lin.weight].reshape(lin.weight.shape)
    residuals = [torch.empty_like(residual) for _ in range(world)]
    dist.all_gather(residuals, residual)
    drift = exact_sum - applied
    assert torch.allclose(drift, torch.stack(residuals).mean(0), atol=1e-4 * scale)
    assert drift.abs().max() <= 1.01 * scale  # one quantisation step after 20 steps, not 20


def test_int8_error_feedback_carries_the_quantisation_error_across_steps():
    run_distributed(_int8_ef_over_steps_check, 2)


def test_int8_error_feedback_resumes_with_its_residuals(data_root, tmp_path):
    """The 8-bit hook's error-feedback residuals are in the checkpoint (per rank, per
    parameter): a run resumed from step 4 ends exactly where the uninterrupted run ends."""
    from dchag.train.checkpoint import saved_shapes

    root, base = data_root
    cfg = run_config(base, steps=8, checkpoint_every=4, val_every=8)
    cfg["model"].update({"aggregation": "baseline"})
    cfg["parallel"] = {
        "tp": 1,
        "strategy": "baseline",
        "data_parallel": "ddp",
        "comm_hook": "int8_ef",
        "ddp_bucket_mb": 0.05,
    }
    a, b = tmp_path / "a", tmp_path / "b"
    text = train_in_ranks(cfg, a, root)
    assert (a / "final" / ".metadata").exists(), text[-3000:]
    saved = saved_shapes(a / "checkpoints" / "step_4")
    for rank in (0, 1):
        residuals = {k: v for k, v in saved.items() if k.startswith(f"comm_hook.rank{rank}.")}
        assert f"comm_hook.rank{rank}.head.0.weight" in residuals and len(residuals) == sum(
            k.startswith("model.") for k in saved
        )
    (b / "checkpoints").mkdir(parents=True)
    shutil.copytree(a / "checkpoints" / "step_4", b / "checkpoints" / "step_4")
    text = train_in_ranks(cfg, b, root)
    assert "resuming from" in text and (b / "final" / ".metadata").exists(), text[-3000:]
    wa, wb = final_weights(a), final_weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_step_peak_on_the_cpu_with_a_frozen_parameter():
    """MemTracker on a model with a frozen parameter (the MAE decoder's fixed position
    embedding); the peak covers parameters, gradients, optimizer state and activations."""
    from dchag.model import ChannelViT
    from dchag.model.build import model_config_of
    from dchag.train.memory import step_peak

    cfg = model_config_of(
        in_channels=6,
        img_size=(16, 16),
        patch_size=4,
        embed_dim=32,
        depth=1,
        num_heads=4,
        task="mae",
        decoder={"dim": 16, "depth": 1, "num_heads": 2},
    )
    model = ChannelViT(cfg)
    assert any(not p.requires_grad for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters())
    x = torch.randn(4, 6, 16, 16)

    def step():
        model(x).square().mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()
    with step_peak(torch.device("cpu"), model, opt) as mem:
        step()
    params = sum(p.numel() * 4 for p in model.parameters()) / 2**20
    assert mem["parameters"] == pytest.approx(params, rel=0.05)
    assert mem["optimizer"] == pytest.approx(
        2 * sum(p.numel() * 4 for p in model.parameters() if p.requires_grad) / 2**20, rel=0.05
    )
    assert mem["total"] > mem["parameters"] + mem["optimizer"] and mem["activations"] > 0


def test_a_harmless_change_resumes_a_changed_model_restarts_naming_the_keys(data_root, tmp_path):
    """More steps, another validation cadence or worker count: the run resumes from its
    checkpoints (and ends as one uninterrupted run of the new length would). A new learning
    rate: the checkpoints are dropped with a message naming the key and both values."""
    root, base = data_root
    out = tmp_path / "run"
    first = train_in_ranks(run_config(base, steps=4, checkpoint_every=2, val_every=4), out, root)
    assert (out / "final" / ".metadata").exists(), first[-3000:]
    # the last step's checkpoint is kept beside final/; removed here, so that the rerun resumes
    # at step 2, inside the warm-up, where a 4-step and a 6-step schedule still agree
    shutil.rmtree(out / "checkpoints" / "step_4")
    longer = run_config(base, steps=6, checkpoint_every=2, val_every=3, num_workers=1, val_batches=1)
    text = train_in_ranks(longer, out, root)
    assert "resuming from" in text and "(step 2)" in text and "another configuration" not in text, text[-3000:]
    straight = tmp_path / "straight"
    train_in_ranks(run_config(base, steps=6, checkpoint_every=2, val_every=3), straight, root)
    # the resumed run replays the same batches: it ends where the uninterrupted one ends
    wa, wb = final_weights(out), final_weights(straight)
    for k in wa:
        assert torch.allclose(wa[k], wb[k], atol=1e-6), k
    changed = run_config(base, steps=6, checkpoint_every=2, val_every=3, lr=0.001)
    text = train_in_ranks(changed, out, root)
    assert "another configuration (train.lr: 0.003 -> 0.001); moved its checkpoints and record to" in text, text[-3000:]
    assert "resuming from" not in text
    # nothing was deleted: the other configuration's checkpoints are kept aside, with why
    (aside,) = (out / "superseded").iterdir()
    assert {"step_2", "step_4", "step_6", "why.txt", "final", "log.csv", "run.json"} <= {
        p.name for p in aside.iterdir()
    }
    assert "train.lr: 0.003 -> 0.001" in (aside / "why.txt").read_text()


def test_single_process_groups_need_no_port():
    """`dchag` commands run without torchrun make a group of one in memory: two at once on one
    machine do not collide (there is no fixed port)."""
    code = (
        "import os, time; from dchag.parallel import init_distributed; import torch, torch.distributed as dist; "
        "init_distributed(); t = torch.ones(1); dist.all_reduce(t); time.sleep(2); "
        "assert 'MASTER_PORT' not in os.environ; print(dist.get_world_size())"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR", "LOCAL_RANK")
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    # the world size, printed last (torch 2.10's gloo prints a connection line on stdout first)
    assert [o.strip().splitlines()[-1] for o, _ in outs] == ["1", "1"]


@pytest.mark.minutes(0.5)
def test_two_nodes_as_srun_starts_them_train_as_one_four_rank_group(data_root, tmp_path):
    """Two `dchag launch-train` agents, one per "node", started with the environment srun gives
    one task per node (SLURM_*; c10d rendezvous on the first node), form one 4-rank group —
    TP 2 x FSDP 2 — and train to the weights of the same run as 4 processes on one node."""
    root, base = data_root
    cfg = run_config(base, steps=6, checkpoint_every=3, val_every=3)
    cfg["parallel"] = {"tp": 2, "strategy": "dchag", "data_parallel": "fsdp"}
    cfg["train"]["nproc"] = 2
    one = launch_train(cfg, tmp_path / "one", root, nproc=4)
    out = finish(one, tmp_path / "one")
    assert one.returncode == 0, out[-3000:]

    config = tmp_path / "two.json"
    config.write_text(json.dumps(cfg))
    port = free_port()
    agents = []
    for node in range(2):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "TORCHELASTIC_", "MASTER_"))}
        env.update(
            SLURM_JOB_ID="9001",
            SLURM_JOB_NODELIST="localhost,localhost",
            SLURM_NNODES="2",
            SLURM_NODEID=str(node),
            SLURM_PROCID=str(node),
            SLURM_NTASKS="2",
            SLURM_LOCALID="0",
            DCHAG_RDZV_PORT=str(port),
            OMP_NUM_THREADS="1",
            PATH=f"{BIN}:{env['PATH']}",
        )
        log = open(tmp_path / f"agent{node}.out", "w")
        agents.append(
            subprocess.Popen(
                [
                    str(BIN / "dchag"),
                    "launch-train",
                    "--config",
                    str(config),
                    "--run-name",
                    "f",
                    "--output",
                    str(tmp_path / "two"),
                    *store_args(root),
                    "--max-restarts",
                    "0",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
            )
        )
    for a in agents:
        a.wait(timeout=400)
    logs = [(tmp_path / f"agent{n}.out").read_text() for n in range(2)]
    assert [a.returncode for a in agents] == [0, 0], "\n".join(x[-2000:] for x in logs)
    assert all("--nnodes=2" in x and "--rdzv-backend=c10d" in x for x in logs), logs[0][:500]
    info = json.loads((tmp_path / "two" / "run.json").read_text())
    assert info["parallel"]["world_size"] == 4 and info["parallel"]["dp"] == 2 and info["parallel"]["tp"] == 2
    a, b = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-6, atol=1e-8), k
