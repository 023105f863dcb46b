"""Datasets over the Zarr stores, reading only the channels a rank holds.

Under D-CHAG, tensor-parallel rank r's tokenizer holds channel block r; the datasets take
those channel ids and read only that block (one chunk per time step and channel for ERA5,
band-group chunks for hyperspectral data), so I/O per rank falls with T.

Randomness (lead times) is a pure function of (seed, epoch, index), and the sampler can
start mid-epoch, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import torch
import zarr
from torch.utils.data import Dataset, Sampler

from ..store import InputError, select_channels


class DataError(InputError):
    pass


def open_array(store: str | Path, path: str) -> zarr.Array:
    if not Path(store).exists():
        raise DataError(f"Zarr store not found: {store}")
    try:
        return zarr.open_array(store=str(store), path=path, mode="r")
    except Exception as err:
        raise DataError(f"cannot read array {path!r} of {store}: {err}") from err


def _attrs(store: str | Path, group: str = "") -> dict:
    if not Path(store).exists():
        raise DataError(f"Zarr store not found: {store}")
    try:
        return dict(zarr.open_group(store=str(store), path=group, mode="r").attrs)
    except Exception as err:
        raise DataError(f"cannot read group {group or '/'!r} of {store}: {err}") from err


def _block_bytes(array: zarr.Array, channels: int) -> int:
    """Bytes of ``channels`` channels (axis 1) of every sample of ``array`` as float32."""
    return array.shape[0] * channels * int(np.prod(array.shape[2:])) * 4


class ForecastDataset(Dataset):
    """ERA5 forecasting pairs: inputs at t (the rank's channels), targets at t + lead (the
    output channels), lead drawn uniformly from the configured multiples of the time step."""

    def __init__(
        self,
        store: str | Path,
        channels: list[str],
        rank_channels: list[int],
        outputs: list[str],
        lead_hours: tuple[int, int],
        seed: int,
        cache_bytes: int = 0,
    ):
        self.store = str(store)
        self.data = open_array(store, "data")
        attrs = _attrs(store)
        index = select_channels(attrs["channel_names"], channels, store)
        self.in_ids = [index[c] for c in rank_channels]
        self.out_ids = select_channels(attrs["channel_names"], outputs, store)
        # a block of the store's channels is one slice; a run's channel subset, or the outputs,
        # a few slices: Zarr reads slices of one step far faster than fancy selections
        self.in_runs, self.out_runs = channel_runs(self.in_ids), channel_runs(self.out_ids)
        times = self._times()
        step_h = time_step_hours(times, store)
        lo, hi = lead_hours
        if step_h <= 0 or lo % step_h or hi % step_h or lo < step_h or hi < lo:
            raise DataError(
                f"lead times {lo}-{hi} h must be positive multiples of the data's {step_h} h time step ({store})"
            )
        span = (len(times) - 1) * step_h
        if hi > span:
            raise DataError(
                f"lead time {hi} h is beyond the data's range: {store} spans {span} h ({times[0]} to {times[-1]})"
            )
        self.step_h = step_h
        self.leads = np.arange(lo, hi + 1, step_h)
        # Pairs by timestamp: a sample is an initial time whose every lead's target is in the
        # store, so no pair spans a gap (missing steps, years that do not follow each other).
        self.anchors, self.targets = lead_pairs(times, self.leads)
        self.count = len(self.anchors)
        if self.count == 0:
            raise DataError(
                f"{store} has no initial time with a target at every lead up to {hi} h "
                f"(its {len(times)} steps have gaps)"
            )
        self.seed = seed
        self.epoch = 0
        # the rank's inputs and the outputs, in memory when they fit (reading a batch from Zarr
        # costs a chunk per sample, channel and time step)
        self.x_mem = self.y_mem = None
        if _block_bytes(self.data, len(self.in_ids) + len(self.out_ids)) <= cache_bytes:
            self.x_mem, self.y_mem = self._load(self.in_runs), self._load(self.out_runs)

    def _times(self):
        from ..store import open_zarr

        with open_zarr(self.store) as ds:
            return pd.DatetimeIndex(ds.time.values)

    def __len__(self) -> int:
        return self.count

    def lead_of(self, index: int) -> int:
        return int(self.leads[self._lead_index(index)])

    def _lead_index(self, index: int) -> int:
        rng = np.random.default_rng([self.seed, self.epoch, index])
        return int(rng.integers(len(self.leads)))

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def _load(self, runs: list[slice]) -> np.ndarray:
        """Every step of the channels in ``runs``, read slice by slice into one array."""
        shape = self.data.shape
        out = np.empty((shape[0], sum(r.stop - r.start for r in runs), *shape[2:]), np.float32)
        at = 0
        for run in runs:
            out[:, at : at + run.stop - run.start] = self.data[:, run]
            at += run.stop - run.start
        return out

    def _read(self, step: int, runs: list[slice]) -> np.ndarray:
        parts = [self.data[int(step), run] for run in runs]
        return (parts[0] if len(parts) == 1 else np.concatenate(parts)).astype(np.float32, copy=False)

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        """A batch from memory, or from Zarr a step at a time, a slice of channels at a time
        (one fancy selection over the batch's steps and channels is 3 times slower: zarr's
        sharding indexes every chunk of the shard); the DataLoader uses this when batching."""
        which = [self._lead_index(i) for i in indices]
        leads = [int(self.leads[k]) for k in which]
        now = self.anchors[np.asarray(indices)]
        later = np.asarray([self.targets[k, i] for i, k in zip(indices, which)])
        if self.x_mem is not None:
            x, y = self.x_mem[now], self.y_mem[later]
        else:
            x = np.stack([self._read(t, self.in_runs) for t in now])
            y = np.stack([self._read(t, self.out_runs) for t in later])
        return [
            (torch.from_numpy(x[k]), torch.tensor(float(lead)), torch.from_numpy(y[k])) for k, lead in enumerate(leads)
        ]


class SampleDataset(Dataset):
    """Hyperspectral patches (with labels) or tiles, one split group of a store, the rank's bands."""

    def __init__(
        self,
        store: str | Path,
        split: str,
        var: str,
        rank_bands: list[int],
        num_bands: int | None = None,
        cache_bytes: int = 0,
    ):
        self.array = open_array(store, f"{split}/{var}")
        total = self.array.shape[1]
        if num_bands is not None and num_bands != total:
            raise DataError(f"{store} ({split}) has {total} bands, the model expects {num_bands}")
        self.lo, self.hi = rank_bands[0], rank_bands[-1] + 1
        self.labels = (
            np.asarray(open_array(store, f"{split}/label")[:], dtype=np.int64) - 1 if var == "patches" else None
        )
        fits = _block_bytes(self.array, self.hi - self.lo) <= cache_bytes
        self.x_mem = np.asarray(self.array[:, self.lo : self.hi], dtype=np.float32) if fits else None

    def __len__(self) -> int:
        return self.array.shape[0]

    def __getitem__(self, index: int):
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        """A batch in one read (see ForecastDataset.__getitems__)."""
        if self.x_mem is not None:
            x = self.x_mem[np.asarray(indices)]
        else:
            x = np.asarray(
                self.array.get_orthogonal_selection((np.asarray(indices), slice(self.lo, self.hi))), dtype=np.float32
            )
        if self.labels is None:
            return [(torch.from_numpy(x[k]),) for k in range(len(indices))]
        return [(torch.from_numpy(x[k]), torch.tensor(self.labels[i])) for k, i in enumerate(indices)]


def channel_runs(ids: list[int]) -> list[slice]:
    """``ids`` as slices of consecutive channels, in order: [3, 4, 5, 9, 1] -> 3:6, 9:10, 1:2."""
    runs: list[slice] = []
    for i in ids:
        if runs and runs[-1].stop == i:
            runs[-1] = slice(runs[-1].start, i + 1)
        else:
            runs.append(slice(i, i + 1))
    return runs


def time_step_hours(times: pd.DatetimeIndex, store) -> int:
    """The time axis's step in hours: the smallest difference; every difference must be a
    multiple of it (a gap is missing steps, not another step)."""
    if len(times) < 2:
        return 0
    diffs = np.diff(times.values).astype("timedelta64[m]").astype(np.int64)
    step = int(diffs.min())
    if step <= 0 or step % 60:
        raise DataError(f"{store}: its time axis is not increasing in whole hours (smallest step {step} min)")
    if np.any(diffs % step):
        raise DataError(f"{store}: its time steps are not multiples of {step // 60} h")
    return step // 60


def lead_pairs(times: pd.DatetimeIndex, leads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(anchors, targets): the indices of the times whose every lead (hours) is in ``times``,
    and for each lead (rows) and sample (columns) the index of its target time."""
    t = times.values.astype("datetime64[h]").astype(np.int64)
    idx = np.stack([np.searchsorted(t, t + int(lead)) for lead in leads])
    ok = np.all((idx < len(t)) & (t[np.minimum(idx, len(t) - 1)] == t[None, :] + leads[:, None]), axis=0)
    anchors = np.flatnonzero(ok)
    return anchors, idx[:, anchors]


def store_info(store: str | Path, group: str = "") -> dict:
    return _attrs(store, group)


class ResumableSampler(Sampler[int]):
    """Seeded shuffling per epoch, sharded over the data-parallel ranks, able to start at any
    position of an epoch (resume). Every rank of a tensor-parallel group gets the same indices."""

    def __init__(self, size: int, dp_size: int, dp_rank: int, seed: int, shuffle: bool = True):
        self.size, self.dp_size, self.dp_rank, self.seed, self.shuffle = size, dp_size, dp_rank, seed, shuffle
        self.per_rank = size // dp_size
        if self.per_rank == 0 and shuffle:
            raise DataError(f"{size} samples cannot be split over {dp_size} data-parallel ranks")
        self.epoch = 0
        self.start = 0

    def indices(self, epoch: int) -> list[int]:
        order = (
            np.random.default_rng([self.seed, epoch]).permutation(self.size) if self.shuffle else np.arange(self.size)
        )
        return order[: self.per_rank * self.dp_size][self.dp_rank :: self.dp_size].tolist()

    def __iter__(self):
        return iter(self.indices(self.epoch)[self.start :])

    def __len__(self) -> int:
        return self.per_rank - self.start
