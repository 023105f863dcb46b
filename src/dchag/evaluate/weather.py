"""Latitude-weighted weather scores under the two conventions in use.

Arrays are (time, lat, lon) in physical units, one variable and one lead time; NaN-free.

``wb2`` (WeatherBench 2, ECMWF): the weighted spatial MSE per time is averaged over time and
the RMSE is its square root; the ACC is the uncentred correlation per time of the anomalies
against a day-of-year(-and-hour) climatology, averaged over time.

``climax`` (ClimaX's ``lat_weighted_rmse`` / ``lat_weighted_acc``): the RMSE is the square root
per sample, then the mean over samples; the ACC subtracts a climatology, centres the anomalies
by their mean over the whole scored set (all samples, latitudes, longitudes, unweighted), and
pools each batch into one weighted correlation. Batches are consecutive ``batch_size`` samples
(all of them by default) and the score is the mean over batches weighted by their size, as
Lightning's epoch average does — so, unlike wb2, the ClimaX ACC depends on the batch size.
(ClimaX's code centres by each batch's own mean; with all times in one batch, the default,
the two are the same number.)

The MSE is the same under both: the mean over times of the weighted spatial MSE.
"""

from __future__ import annotations

import numpy as np

CONVENTIONS = ("wb2", "climax")
METRICS = ("rmse", "mse", "acc")


def lat_weights(lat: np.ndarray) -> np.ndarray:
    """cos(lat) / mean(cos(lat)), shape (lat, 1). On the pole-free WeatherBench grids this equals
    WeatherBench 2's cell-area weights."""
    w = np.cos(np.deg2rad(np.asarray(lat, dtype=np.float64)))
    return (w / w.mean())[:, None]


def spatial_mse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(time,) weighted mean over lat and lon of the squared error."""
    return np.mean((np.asarray(forecast, np.float64) - truth) ** 2 * w, axis=(-2, -1))


def mse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray) -> float:
    return float(spatial_mse(forecast, truth, w).mean())


def rmse(forecast: np.ndarray, truth: np.ndarray, w: np.ndarray, convention: str) -> float:
    per_time = spatial_mse(forecast, truth, w)
    if convention == "wb2":
        return float(np.sqrt(per_time.mean()))
    if convention == "climax":
        return float(np.sqrt(per_time).mean())
    raise ValueError(f"convention {convention!r}: expected one of {', '.join(CONVENTIONS)}")


def acc_wb2(forecast: np.ndarray, truth: np.ndarray, clim: np.ndarray, w: np.ndarray) -> float:
    """Uncentred anomaly correlation per time, averaged over time; ``clim`` is the climatology at
    each valid time, (time, lat, lon)."""
    fa = np.asarray(forecast, np.float64) - clim
    ta = np.asarray(truth, np.float64) - clim
    num = np.mean(w * fa * ta, axis=(-2, -1))
    den = np.sqrt(np.mean(w * fa**2, axis=(-2, -1)) * np.mean(w * ta**2, axis=(-2, -1)))
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.mean(num / den))


def acc_climax(forecast: np.ndarray, truth: np.ndarray, clim: np.ndarray, w: np.ndarray, batch_size: int | None = None) -> float:
    """ClimaX's pooled ACC (anomalies centred over the whole set); ``clim`` broadcasts against (time, lat, lon)."""
    fa = np.asarray(forecast, np.float64) - clim
    ta = np.asarray(truth, np.float64) - clim
    fa = fa - fa.mean()
    ta = ta - ta.mean()
    n = fa.shape[0]
    size = n if not batch_size else int(batch_size)
    values, counts = [], []
    for start in range(0, n, size):
        f = fa[start:start + size]
        t = ta[start:start + size]
        with np.errstate(invalid="ignore", divide="ignore"):
            values.append(np.sum(w * f * t) / np.sqrt(np.sum(w * f**2) * np.sum(w * t**2)))
        counts.append(f.shape[0])
    return float(np.average(values, weights=counts))
