"""Datasets over the Zarr stores, reading only the channels a rank holds.

Under D-CHAG, tensor-parallel rank r's tokenizer holds channel block r; the datasets take
those channel ids and read only that block (one chunk per time step and channel for ERA5,
band-group chunks for hyperspectral data), so I/O per rank falls with T. A batch's chunks are
read in one concurrent read (:class:`ChunkReader`).

Randomness (lead times) is a pure function of (seed, epoch, index), and the sampler can
start mid-epoch, so a resumed run sees exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import zarr
from torch.utils.data import Dataset, Sampler

from ..store import InputError, select_channels

log = logging.getLogger(__name__)


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


# The process that started tensorstore's threads: a process forked from it (a DataLoader
# worker) cannot use tensorstore (it aborts), so the training process leaves the reads to its
# workers when they read from Zarr (then its in-memory copies are read with zarr, ChunkReader.load).
_TENSORSTORE_PID: int | None = None


class ChunkReader:
    """A Zarr array of a local store read through tensorstore: the chunks of a batch (every
    selection given to :meth:`read`) are read and decoded concurrently in one call, where
    zarr-python reads a chunk at a time at about half a millisecond each (one rank's batches
    at 5.625 deg: benchmarks/results/loader.md). The array is opened in each process on first
    use; a process forked from one that used tensorstore reads with zarr (the same values,
    slowly) and says so."""

    def __init__(self, store: str | Path, path: str):
        self.store, self.path = str(store), path
        self._array, self._pid = None, None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_array": None, "_pid": None}

    def _open(self):
        global _TENSORSTORE_PID
        if self._pid == os.getpid():
            return self._array
        self._pid = os.getpid()
        if _TENSORSTORE_PID not in (None, self._pid):
            log.warning(
                "%s: read with zarr, slowly: this process was forked from one that read with tensorstore "
                "(read nothing in the training process before its DataLoader workers start)",
                self.store,
            )
            self._array = zarr.open_array(store=self.store, path=self.path, mode="r")
            return self._array
        import tensorstore as ts

        # A store is written under a temporary name and renamed when complete, never changed
        # in place: tensorstore need not check whether what it read is still current (1.2-1.3x
        # faster at 5.625 deg)
        spec = {
            "driver": "zarr3",
            "kvstore": {"driver": "file", "path": str(Path(self.store) / self.path)},
            "recheck_cached_data": False,
            "recheck_cached_metadata": False,
        }
        _TENSORSTORE_PID = self._pid
        try:
            self._array = ts.open(spec, read=True).result()
        except Exception as err:
            raise DataError(f"cannot read array {self.path!r} of {self.store}: {_first_line(err)}") from err
        return self._array

    def read(self, *selections: tuple) -> list[np.ndarray]:
        """Each orthogonal selection (an index array or a slice per dimension, as
        ``zarr.Array.get_orthogonal_selection`` takes) as float32; all read at once."""
        array = self._open()
        try:
            if isinstance(array, zarr.Array):
                out = [array.get_orthogonal_selection(sel) for sel in selections]
            else:
                out = [f.result() for f in [array.oindex[sel].read() for sel in selections]]
        except Exception as err:  # a damaged chunk or shard file
            raise DataError(f"cannot read array {self.path!r} of {self.store}: {_first_line(err)}") from err
        return [np.asarray(a).astype(np.float32, copy=False) for a in out]

    def load(self, selection: tuple, workers_read_zarr: bool) -> np.ndarray:
        """``selection`` as float32, to be held in memory: read as :meth:`read` reads, unless
        DataLoader workers forked from this process will read from Zarr (they could not use
        tensorstore), then with zarr, 20-25x slower (the demo's training store, 1200 chunks:
        1.1-1.5 CPU-s against 0.06)."""
        if not workers_read_zarr:
            return self.read(selection)[0]
        array = zarr.open_array(store=self.store, path=self.path, mode="r")
        return np.asarray(array.get_orthogonal_selection(selection)).astype(np.float32, copy=False)


class Batch(list):
    """A batch's samples, each a tuple of views into the batch's arrays, which the trainer's
    collate (:func:`collate`) takes whole: a batch read at once is not copied again into a
    stacked one (at 1.40625 deg a rank's batch is 100-340 MB)."""

    def __init__(self, *arrays: np.ndarray):
        self.tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in arrays]
        super().__init__(zip(*(t.unbind(0) for t in self.tensors), strict=True))


def collate(items: list[tuple]) -> list[torch.Tensor]:
    """The DataLoader's collate: a :class:`Batch` as it is, any other list of samples stacked."""
    if isinstance(items, Batch):
        return list(items.tensors)
    return [torch.stack(parts) for parts in zip(*items)]


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def held_in_memory(array: zarr.Array, channels: int, cache_bytes: int) -> bool:
    """Whether ``channels`` channels (axis 1) of every sample of ``array``, as float32, fit in
    ``cache_bytes``: a dataset reading them holds them in memory."""
    return array.shape[0] * channels * int(np.prod(array.shape[2:])) * 4 <= cache_bytes


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
        workers_read_zarr: bool = False,
    ):
        self.store = str(store)
        self.data = open_array(store, "data")
        self.reader = ChunkReader(store, "data")
        attrs = _attrs(store)
        index = select_channels(attrs["channel_names"], channels, store)
        self.in_ids = np.asarray([index[c] for c in rank_channels])
        self.out_ids = np.asarray(select_channels(attrs["channel_names"], outputs, store))
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
        if held_in_memory(self.data, len(self.in_ids) + len(self.out_ids), cache_bytes):
            self.x_mem = self._load(self.in_ids, workers_read_zarr)
            self.y_mem = self._load(self.out_ids, workers_read_zarr)

    def _times(self):
        from ..store import open_zarr

        with open_zarr(self.store, chunks=None) as ds:  # no dask: only the coordinate is read
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

    def _load(self, ids: np.ndarray, workers_read_zarr: bool) -> np.ndarray:
        """Every step of the channels ``ids`` in one float32 array: in one read (a float32
        store), or a channel at a time (a float64 store is never held whole in float64)
        (:meth:`ChunkReader.load`)."""
        if self.data.dtype == np.float32:
            return self.reader.load((slice(None), np.asarray(ids)), workers_read_zarr)
        shape = self.data.shape
        out = np.empty((shape[0], len(ids), *shape[2:]), np.float32)
        for k, c in enumerate(ids):
            out[:, k] = self.reader.load((slice(None), int(c)), workers_read_zarr)
        return out

    def __getitems__(self, indices: list[int]) -> list[tuple]:
        """A batch from memory, or from Zarr in one concurrent read of its chunks (every
        sample's inputs and targets); the DataLoader uses this when batching."""
        which = [self._lead_index(i) for i in indices]
        leads = [int(self.leads[k]) for k in which]
        now = self.anchors[np.asarray(indices)]
        later = np.asarray([self.targets[k, i] for i, k in zip(indices, which)])
        if self.x_mem is not None:
            x, y = self.x_mem[now], self.y_mem[later]
        else:
            x, y = self.reader.read((now, self.in_ids), (later, self.out_ids))
        return Batch(x, np.asarray(leads, np.float32), y)


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
        self.reader = ChunkReader(store, f"{split}/{var}")
        total = self.array.shape[1]
        if num_bands is not None and num_bands != total:
            raise DataError(f"{store} ({split}) has {total} bands, the model expects {num_bands}")
        self.lo, self.hi = rank_bands[0], rank_bands[-1] + 1
        self.labels = (
            np.asarray(open_array(store, f"{split}/label")[:], dtype=np.int64) - 1 if var == "patches" else None
        )
        fits = held_in_memory(self.array, self.hi - self.lo, cache_bytes)
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
            (x,) = self.reader.read((np.asarray(indices), slice(self.lo, self.hi)))
        if self.labels is None:
            return Batch(x)
        return Batch(x, self.labels[np.asarray(indices)])


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
    sample of an epoch (resume). Every rank of a tensor-parallel group gets the same indices.

    The epoch's order is one sequence for every layout; data-parallel rank r of D takes its
    samples ``offset + r, offset + r + D, ...``, where ``offset`` counts the samples every rank
    together has consumed: a run resumed on another number of ranks continues the same order
    where it stopped, and every rank gets as many samples as the others."""

    def __init__(self, size: int, dp_size: int, dp_rank: int, seed: int, shuffle: bool = True):
        self.size, self.dp_size, self.dp_rank, self.seed, self.shuffle = size, dp_size, dp_rank, seed, shuffle
        self.per_rank = size // dp_size
        if self.per_rank == 0 and shuffle:
            raise DataError(f"{size} samples cannot be split over {dp_size} data-parallel ranks")
        self.epoch = 0
        self.offset = 0

    def indices(self, epoch: int, offset: int = 0) -> list[int]:
        """This rank's samples of ``epoch`` from the epoch's sample ``offset`` on."""
        order = (
            np.random.default_rng([self.seed, epoch]).permutation(self.size) if self.shuffle else np.arange(self.size)
        )
        return order[offset + self.dp_rank :: self.dp_size][: self._count(offset)].tolist()

    def _count(self, offset: int) -> int:
        """Each rank's samples from the epoch's sample ``offset`` on (as many on every rank)."""
        return max(0, self.per_rank * self.dp_size - offset) // self.dp_size

    def __iter__(self):
        return iter(self.indices(self.epoch, self.offset))

    def __len__(self) -> int:
        return self._count(self.offset)
