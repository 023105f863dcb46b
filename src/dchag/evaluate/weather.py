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


# -- per-initialisation statistics --------------------------------------------------------------
# Each is a mean over a region's grid cells per initialisation time, latitude-weighted with the
# region's weights (mean 1 over its cells) unless named unweighted; fa, ta: the forecast's and
# the truth's anomalies against the climatology. Every metric is a function of them.
STATISTICS = {
    "squared_error": "weighted mean of (forecast - truth)**2",
    "anomaly_product": "weighted mean of fa * ta",
    "forecast_anomaly_squared": "weighted mean of fa**2",
    "truth_anomaly_squared": "weighted mean of ta**2",
    "forecast_anomaly": "weighted mean of fa",
    "truth_anomaly": "weighted mean of ta",
    "forecast_anomaly_unweighted": "mean of fa",
    "truth_anomaly_unweighted": "mean of ta",
}


def statistics(
    forecast: np.ndarray,
    truth: np.ndarray,
    w: np.ndarray,
    clim: np.ndarray | None,
    names,
    cells: np.ndarray | None = None,
) -> dict[str, np.ndarray]:
    """The per-time statistics ``names`` (of :data:`STATISTICS`) of (time, lat, lon) fields with
    weights ``w`` (lat, 1), or (lat, lon) for a region of cells, whose unweighted means are then
    weighted by its cells' share ``cells`` (lat, lon), both of mean 1; ``clim`` broadcasts
    against the fields (anomalies need it)."""
    f = np.asarray(forecast, np.float64)

    def mean(x, weighted=True):
        if not weighted:
            return np.mean(x if cells is None else x * cells, axis=(-2, -1))
        return np.mean(x * w, axis=(-2, -1))

    out = {}
    if "squared_error" in names:
        out["squared_error"] = mean((f - truth) ** 2)
    if any(n != "squared_error" for n in names):
        fa, ta = f - clim, np.asarray(truth, np.float64) - clim
        terms = {
            "anomaly_product": lambda: mean(fa * ta),
            "forecast_anomaly_squared": lambda: mean(fa**2),
            "truth_anomaly_squared": lambda: mean(ta**2),
            "forecast_anomaly": lambda: mean(fa),
            "truth_anomaly": lambda: mean(ta),
            "forecast_anomaly_unweighted": lambda: mean(fa, False),
            "truth_anomaly_unweighted": lambda: mean(ta, False),
        }
        out |= {n: terms[n]() for n in names if n in terms}
    return out


# WeatherBench 2's standard regions (its SliceRegion and ExtraTropicalRegion), by latitude
# (degrees, bounds included): a region's mean is weighted by the grid's latitude weights over
# its rows, normalised to mean 1 there, as WB2 weights a region's cells.
REGIONS = {
    "global": lambda lat: np.ones_like(lat, bool),
    "tropics": lambda lat: (lat >= -20) & (lat <= 20),
    "extra-tropics": lambda lat: np.abs(lat) >= 20,
    "northern-extra-tropics": lambda lat: lat >= 20,
    "southern-extra-tropics": lambda lat: lat <= -20,
}


# WeatherBench 2's land region (its LandRegion: the latitude weights times the land-sea mask, a
# land fraction, unthresholded) and the sea as its complement, where the truth has a mask.
MASK_REGIONS = {"land": lambda lsm: lsm, "sea": lambda lsm: 1.0 - lsm}
LAND_SEA = "lsm"  # the dchag channel of the mask


def mask_weights(w: np.ndarray, lsm: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """The (lat, lon) weights of region ``name`` of :data:`MASK_REGIONS` for latitude weights
    ``w`` (lat, 1) and a land fraction ``lsm`` (lat, lon): the weights and the cells' shares,
    each normalised to mean 1."""
    share = MASK_REGIONS[name](np.asarray(lsm, np.float64))
    weights = w * share
    return weights / weights.mean(), share / share.mean()


def region_rows(lat: np.ndarray, name: str) -> np.ndarray:
    """The rows (a boolean mask over ``lat``, degrees) of region ``name``."""
    if name not in REGIONS:
        raise WeatherScoreError(f"region {name!r}: expected one of {', '.join(REGIONS)}")
    return REGIONS[name](np.asarray(lat, np.float64))


def region_weights(w: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The latitude weights ``w`` (lat, 1) of the region's ``rows``, normalised to mean 1."""
    part = w[rows]
    return part / part.mean()


def spatial_mse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(time,) weighted mean over lat and lon of the squared error."""
    return statistics(forecast, truth, w, None, ["squared_error"])["squared_error"]


def _score(metric: Metric, forecast, truth, w, clim=None, batch_size=None) -> float:
    return metric(statistics(forecast, truth, w, clim, metric.statistics), batch_size)


def mse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray) -> float:
    return _score(MSE(), forecast, truth, w)


def rmse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray, name: str) -> float:
    """The RMSE of convention ``name`` (:data:`SCORING`): WB2's root of the time-mean MSE, or
    ClimaX's time mean of the roots."""
    return _score(convention(name).metrics["rmse"], forecast, truth, w)


def acc_wb2(forecast: np.ndarray, truth: np.ndarray, clim: np.ndarray, w: np.ndarray) -> float:
    """Uncentred anomaly correlation per time, averaged over time; ``clim`` is the climatology at
    each valid time, (time, lat, lon)."""
    return _score(ACC(), forecast, truth, w, clim)


def acc_climax(
    forecast: np.ndarray, truth: np.ndarray, clim: np.ndarray, w: np.ndarray, batch_size: int | None = None
) -> float:
    """ClimaX's pooled ACC: per batch, anomalies centred by the batch's own mean, one weighted
    correlation; batches averaged by size. ``clim`` broadcasts against (time, lat, lon)."""
    return _score(PooledACC(), forecast, truth, w, clim, batch_size)


# -- the metrics as objects, and the conventions as tables of them --------------------------------
class Metric:
    """A score as a function of the per-time statistics: per time the values :meth:`units`
    (n, k) makes of them, and :meth:`of_means` of their means over a pool of times. A metric
    that is ``batched`` (ClimaX's) pools consecutive ``batch_size`` times and averages the
    pools' values weighted by size; the others pool every time. ``of_means`` takes complex
    input (its derivatives are taken by complex step in :mod:`dchag.evaluate.significance`)."""

    name = ""
    needs_climatology = False
    batched = False
    statistics: tuple[str, ...] = ("squared_error",)

    def units(self, s: dict[str, np.ndarray]) -> np.ndarray:
        return np.stack([np.asarray(s[n], np.float64) for n in self.statistics], axis=-1)

    def of_means(self, m: np.ndarray):
        return m[..., 0]

    def pools(self, n: int, batch_size: int | None) -> list[slice]:
        size = int(batch_size) if self.batched and batch_size else n
        return [slice(start, start + size) for start in range(0, n, size)]

    def of_units(self, u: np.ndarray, batch_size: int | None = None):
        """The metric of per-time values ``u`` (..., time, k): each pool's :meth:`of_means`,
        averaged weighted by the pools' sizes."""
        n = u.shape[-2]
        with np.errstate(invalid="ignore"):
            return sum(
                self.of_means(u[..., p, :].mean(axis=-2)) * len(range(n)[p]) / n for p in self.pools(n, batch_size)
            )

    def __call__(self, s: dict[str, np.ndarray], batch_size: int | None = None) -> float:
        return float(self.of_units(self.units(s), batch_size))


class MSE(Metric):
    """The mean over times of the weighted spatial MSE (WB2's ``MSE``)."""

    name = "mse"


class RMSE(Metric):
    """The square root of the MSE averaged over time (WB2's recommended RMSE: its ``MSE``,
    then the root)."""

    name = "rmse"

    def of_means(self, m):
        return np.sqrt(m[..., 0])


class RMSESqrtBeforeTimeAvg(Metric):
    """The root per time, then the mean (WB2's ``RMSESqrtBeforeTimeAvg``; ClimaX's RMSE)."""

    name = "rmse"

    def units(self, s):
        return np.sqrt(super().units(s))


class ACC(Metric):
    """WB2's ``ACC``: uncentred anomaly correlation per time against the climatology at each
    valid time, averaged over time (NaN where an anomaly has no variance)."""

    name = "acc"
    needs_climatology = True
    statistics = ("anomaly_product", "forecast_anomaly_squared", "truth_anomaly_squared")

    def units(self, s):
        with np.errstate(invalid="ignore", divide="ignore"):
            acc = s["anomaly_product"] / np.sqrt(s["forecast_anomaly_squared"] * s["truth_anomaly_squared"])
        return np.asarray(acc, np.float64)[:, None]


class PooledACC(Metric):
    """ClimaX's ``lat_weighted_acc``: per batch, the anomalies centred by their unweighted mean
    over the batch's times and cells, one weighted correlation; as means per time,
    sum w (fa - mf)(ta - mt) / cells = fa_ta - mt fa_w - mf ta_w + mf mt (the weights' mean
    is 1), and alike for the norms."""

    name = "acc"
    needs_climatology = True
    batched = True
    statistics = (
        "anomaly_product",
        "forecast_anomaly",
        "truth_anomaly",
        "forecast_anomaly_unweighted",
        "truth_anomaly_unweighted",
        "forecast_anomaly_squared",
        "truth_anomaly_squared",
    )

    def of_means(self, m):
        ft, fw, tw, mf, mt, ff, tt = (m[..., i] for i in range(7))
        with np.errstate(invalid="ignore", divide="ignore"):
            return (ft - mt * fw - mf * tw + mf * mt) / np.sqrt((ff - 2 * mf * fw + mf**2) * (tt - 2 * mt * tw + mt**2))


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
