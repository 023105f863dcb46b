"""Latitude-weighted weather scores under the two conventions in use.

Arrays are (time, lat, lon) in physical units, one variable and one lead time; NaN-free.

``wb2`` (WeatherBench 2, ECMWF): the weighted spatial MSE per time is averaged over time and
the RMSE is its square root; the ACC is the uncentred correlation per time of the anomalies
against a day-of-year(-and-hour) climatology, averaged over time.

``climax`` (ClimaX's ``lat_weighted_rmse`` / ``lat_weighted_acc``): the RMSE is the square root
per sample, then the mean over samples; the ACC subtracts a climatology (ClimaX: the time mean
of the scored split), centres each batch's anomalies by that batch's own mean (over its
samples, latitudes and longitudes, unweighted) and pools the batch into one weighted
correlation. Batches are consecutive ``batch_size`` samples (all of them by default) and the
score is the mean over batches weighted by their size, as Lightning's epoch average does —
so, unlike wb2, the ClimaX ACC depends on the batch size.

Latitude weights: under ``wb2`` WeatherBench 2's cell-area weights (``get_lat_weights``: the
integral of cos(latitude) between cell bounds halfway between rows, the outer bounds at the
poles, normalised to mean 1), right on any grid; under ``climax`` ClimaX's cos(lat) /
mean(cos(lat)). They are equal on the pole-free, equally spaced WeatherBench grids.

The MSE is the same under both: the mean over times of the weighted spatial MSE.

The metrics are small objects, as WeatherBench 2's ``metrics.py`` has them, and each
convention is a table of them (:data:`SCORING`): `dchag score` looks a metric up by name and
never branches on the convention; a new metric is one class and one table entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from ..errors import DchagError

METRICS = ("rmse", "mse", "acc")


class WeatherScoreError(DchagError, ValueError):
    """A score was asked for on inputs it is not defined for."""


def _ascending_radians(lat: np.ndarray) -> np.ndarray:
    deg = np.asarray(lat, dtype=np.float64)
    if deg.size > 1 and not (np.diff(deg) > 0).all():
        raise WeatherScoreError(f"latitudes must be strictly increasing, got {deg.tolist()}")
    return np.deg2rad(deg)


def cell_area_weights(lat: np.ndarray) -> np.ndarray:
    """WeatherBench 2's latitude weights (``get_lat_weights``: each row's cell area, from the
    midpoints to the poles), right on any grid; mean 1, shape (lat, 1), ``lat`` ascending."""
    rad = _ascending_radians(lat)
    bounds = np.concatenate([[-np.pi / 2], (rad[:-1] + rad[1:]) / 2, [np.pi / 2]])
    w = np.sin(bounds[1:]) - np.sin(bounds[:-1])
    return (w / w.mean())[:, None]


def cos_weights(lat: np.ndarray) -> np.ndarray:
    """ClimaX's cos(lat) / mean(cos(lat)), shape (lat, 1). Equal to :func:`cell_area_weights`
    on pole-free, equally spaced grids (the WeatherBench grids); on a grid with pole rows they
    give the poles no weight, while their cells have an area."""
    w = np.cos(_ascending_radians(lat))
    return (w / w.mean())[:, None]


def lat_weights(lat: np.ndarray, name: str = "wb2") -> np.ndarray:
    """The latitude weights of convention ``name`` (:data:`SCORING`)."""
    return convention(name).weights(lat)


def spatial_mse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(time,) weighted mean over lat and lon of the squared error."""
    return np.mean((np.asarray(forecast, np.float64) - truth) ** 2 * w, axis=(-2, -1))


def mse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray) -> float:
    return float(spatial_mse(forecast, truth, w).mean())


def rmse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray, name: str) -> float:
    """The RMSE of convention ``name`` (:data:`SCORING`): WB2's root of the time-mean MSE, or
    ClimaX's time mean of the roots."""
    return convention(name).metrics["rmse"](Fields(forecast, truth, w))


def acc_wb2(forecast: np.ndarray, truth: np.ndarray, clim: np.ndarray, w: np.ndarray) -> float:
    """Uncentred anomaly correlation per time, averaged over time; ``clim`` is the climatology at
    each valid time, (time, lat, lon)."""
    fa = np.asarray(forecast, np.float64) - clim
    ta = np.asarray(truth, np.float64) - clim
    num = np.mean(w * fa * ta, axis=(-2, -1))
    den = np.sqrt(np.mean(w * fa**2, axis=(-2, -1)) * np.mean(w * ta**2, axis=(-2, -1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.mean(num / den))


def acc_climax(
    forecast: np.ndarray, truth: np.ndarray, clim: np.ndarray, w: np.ndarray, batch_size: int | None = None
) -> float:
    """ClimaX's pooled ACC: per batch, anomalies centred by the batch's own mean, one weighted
    correlation; batches averaged by size. ``clim`` broadcasts against (time, lat, lon)."""
    fa = np.asarray(forecast, np.float64) - clim
    ta = np.asarray(truth, np.float64) - clim
    n = fa.shape[0]
    size = n if not batch_size else int(batch_size)
    values, counts = [], []
    for start in range(0, n, size):
        f = fa[start : start + size]
        t = ta[start : start + size]
        f, t = f - f.mean(), t - t.mean()
        with np.errstate(invalid="ignore", divide="ignore"):  # no variance: NaN, as acc_wb2
            values.append(np.sum(w * f * t) / np.sqrt(np.sum(w * f**2) * np.sum(w * t**2)))
        counts.append(f.shape[0])
    return float(np.average(values, weights=counts))


# -- the metrics as objects, and the conventions as tables of them --------------------------------
@dataclass(frozen=True)
class Fields:
    """What a metric scores: one variable at one lead, (time, lat, lon) in physical units, the
    latitude weights, and the climatology (at each valid time, or one field for every time)
    where the metric needs one."""

    forecast: np.ndarray
    truth: np.ndarray
    weights: np.ndarray
    climatology: np.ndarray | None = None
    batch_size: int | None = None


class Metric:
    """A score of :class:`Fields`; ``needs_climatology`` says whether it reads one."""

    name = ""
    needs_climatology = False

    def __call__(self, f: Fields) -> float:
        raise NotImplementedError


class MSE(Metric):
    """The mean over times of the weighted spatial MSE (WB2's ``MSE``)."""

    name = "mse"

    def __call__(self, f: Fields) -> float:
        return mse(f.forecast, f.truth, f.weights)


class RMSE(Metric):
    """The square root of the MSE averaged over time (WB2's recommended RMSE: its ``MSE``,
    then the root)."""

    name = "rmse"

    def __call__(self, f: Fields) -> float:
        return float(np.sqrt(spatial_mse(f.forecast, f.truth, f.weights).mean()))


class RMSESqrtBeforeTimeAvg(Metric):
    """The root per time, then the mean (WB2's ``RMSESqrtBeforeTimeAvg``; ClimaX's RMSE)."""

    name = "rmse"

    def __call__(self, f: Fields) -> float:
        return float(np.sqrt(spatial_mse(f.forecast, f.truth, f.weights)).mean())


class ACC(Metric):
    """WB2's ``ACC``: uncentred anomaly correlation per time against the climatology at each
    valid time, averaged over time."""

    name = "acc"
    needs_climatology = True

    def __call__(self, f: Fields) -> float:
        return acc_wb2(f.forecast, f.truth, f.climatology, f.weights)


class PooledACC(Metric):
    """ClimaX's ``lat_weighted_acc``: batch-centred anomalies pooled per batch."""

    name = "acc"
    needs_climatology = True

    def __call__(self, f: Fields) -> float:
        return acc_climax(f.forecast, f.truth, f.climatology, f.weights, f.batch_size)


@dataclass(frozen=True)
class Convention:
    """A scoring convention: its latitude weights, its metrics by name, and where its
    climatology comes from (``day_of_year``: a climatology file at each valid time;
    ``period_mean``: the truth's mean over the scored period unless a file is given)."""

    name: str
    climatology: str
    weights: Callable[[np.ndarray], np.ndarray]
    metrics: dict[str, Metric] = field(default_factory=dict)

    def select(self, names: list[str] | None) -> list[Metric]:
        names = list(names or self.metrics)
        bad = [m for m in names if m not in self.metrics]
        if bad:
            raise WeatherScoreError(f"metric(s) {bad}: expected some of {', '.join(self.metrics)}")
        return [self.metrics[m] for m in names]


SCORING: dict[str, Convention] = {
    c.name: c
    for c in (
        Convention("wb2", "day_of_year", cell_area_weights, {m.name: m for m in (RMSE(), MSE(), ACC())}),
        Convention(
            "climax", "period_mean", cos_weights, {m.name: m for m in (RMSESqrtBeforeTimeAvg(), MSE(), PooledACC())}
        ),
    )
}


def convention(name: str) -> Convention:
    if name not in SCORING:
        raise WeatherScoreError(f"convention {name!r}: expected one of {', '.join(SCORING)}")
    return SCORING[name]
