"""Is one forecast's score different from another's? Confidence intervals and p-values for the
difference of two forecasts' scores over the same initialisation times.

A score is a function of the means over initialisation times of per-time values
(:class:`dchag.evaluate.weather.Metric`: ``of_means`` of the means of ``units``), and the
comparison (the difference, or the percent difference) a function of two such scores. Errors on
consecutive initialisation times are correlated, so the per-time values are not independent.

* **Delta method** (linearisation): a nonlinear function f of means (RMSE = sqrt of the mean
  squared error; ClimaX's pooled ACC; the percent difference) is replaced by its first-order
  expansion at the means; its per-time *influence values* psi_t = grad f . (u_t - mean u) have
  mean 0, and the variance of the score is approximately that of the mean of psi. The gradient
  is taken by complex step (exact to rounding for these analytic functions). For a score that
  pools consecutive batches (ClimaX's ACC with a batch size) each time is linearised at its
  batch's means.
* **t-test with AR(2) correction** (Geer 2016, Tellus A 68, 30229): the standard error of the
  mean of psi, s / sqrt(n) with s the sample standard deviation, is inflated by
  k = sqrt((1 - r1 phi1 - r2 phi2) / (1 - phi1 - phi2)^2), where r1, r2 are the lag-1 and
  lag-2 autocorrelations of psi (the mean of the n - lag lagged products over the variance)
  and phi1 = r1 (1 - r2) / (1 - r1^2), phi2 = (r2 - r1^2) / (1 - r1^2) the AR(2) coefficients
  they imply (Yule-Walker); the interval and two-sided p-value are Student's t with n - 1
  degrees of freedom.
* **Stationary bootstrap** (Politis & Romano 1994): the initialisation times are resampled in
  blocks of geometric length with mean b, wrapping around the end, the same times for both
  forecasts (a paired resampling); the score is recomputed on every replicate; the interval is
  the replicates' percentiles (linear interpolation) and the p-value the level at which that
  interval just reaches 0 (2 min(F(0), 1 - F(0)), F the inverse of the percentile function).
  b is Politis & White's (2004) automatic choice with Patton, Politis & White's (2009)
  correction, computed from psi of the compared quantity: the flat-top lag window over M = 2 m
  lags, m the first lag of the first K = max(5, floor(log10 n)) consecutive autocorrelations
  within +-2 sqrt(log10(n) / n) (at most ceil(sqrt n) + K), b = (2 G^2 / (2 sigma^4))^(1/3)
  n^(1/3), capped at ceil(min(3 sqrt n, n / 3)). m and the autocorrelations that choose it are
  those of Patton's program as ``arch`` computes them (m is the first lag of the run, where
  the paper's m is the lag before it; each lag-k autocorrelation is normalised by the norms
  of the series' two parts k + 1 apart), so that b is WeatherBench-X's.

These are the definitions WeatherBench-X's ``statistical_inference`` (``t_test.GeerAR2Corrected``,
``bootstrap.StationaryBootstrap``, through ``arch``'s block length) uses, and
``tests/unit/evaluate/test_significance.py`` holds its values on recorded statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as scipy_stats

from .weather import Metric

STEP = 1e-20  # complex-step size: no cancellation, so tiny


def gradient(f, m: np.ndarray) -> np.ndarray:
    """d f / d m at real ``m`` (k,), by complex step."""
    m = np.asarray(m, np.float64)
    steps = m[None, :] + 1j * STEP * np.eye(m.size)
    return np.imag(f(steps)) / STEP


def linearise(metric: Metric, s: dict[str, np.ndarray], batch_size: int | None = None) -> tuple[float, np.ndarray]:
    """The score of the per-time statistics ``s`` and its influence values psi (time,)."""
    u = metric.units(s)
    psi = np.empty(u.shape[0])
    for pool in metric.pools(u.shape[0], batch_size):
        mean = u[pool].mean(axis=0)
        psi[pool] = (u[pool] - mean) @ gradient(metric.of_means, mean)
    return float(metric.of_units(u, batch_size)), psi


def magnitude(value):
    """|value|, NaN where it is 0: the percent change of a zero score (a kappa of 0) is undefined."""
    size = np.abs(value)
    return np.where(size == 0, np.nan, size)[()]


def combine(value_c: float, value_b: float, psi_c: np.ndarray, psi_b: np.ndarray, percent: bool):
    """The difference candidate - baseline (or 100 (c - b) / |b|) and its influence values."""
    if not percent:
        return value_c - value_b, psi_c - psi_b
    with np.errstate(divide="ignore", invalid="ignore"):
        size = magnitude(value_b)
        pct = 100 * (value_c - value_b) / size
        return pct, 100 / size * psi_c - 100 * value_c / (value_b * size) * psi_b


@dataclass(frozen=True)
class TTest:
    """Student's t for ``value`` with ``standard_error`` and ``dof`` degrees of freedom."""

    value: float
    standard_error: float
    dof: int

    def interval(self, alpha: float) -> tuple[float, float]:
        half = self.standard_error * scipy_stats.t.ppf(1 - alpha / 2, self.dof)
        return self.value - half, self.value + half

    def p_value(self) -> float:
        if self.value == 0 and self.standard_error == 0:
            return 1.0
        with np.errstate(divide="ignore", invalid="ignore"):
            return float(2 * scipy_stats.t.sf(abs(self.value / self.standard_error), self.dof))


def autocorrelation(psi: np.ndarray, lag: int) -> float:
    """The mean of the lagged products of the deviations ``psi`` (mean 0) over their variance
    (ddof 1); 0 for a constant series."""
    var = np.sum(psi**2) / (psi.size - 1)
    return float(np.mean(psi[:-lag] * psi[lag:]) / var) if var > 0 else 0.0


def ar2_inflation(psi: np.ndarray) -> float:
    """Geer's (2016) k: the factor an AR(2) process with psi's lag-1 and lag-2 autocorrelations
    inflates the standard error of its mean by."""
    r1, r2 = autocorrelation(psi, 1), autocorrelation(psi, 2)
    phi1, phi2 = r1 * (1 - r2) / (1 - r1**2), (r2 - r1**2) / (1 - r1**2)
    with np.errstate(invalid="ignore"):
        return float(np.sqrt((1 - r1 * phi1 - r2 * phi2) / (1 - phi1 - phi2) ** 2))


def t_test_ar2(value: float, psi: np.ndarray) -> TTest:
    n = psi.size
    se = np.sqrt(np.sum(psi**2) / (n - 1) / n) * ar2_inflation(psi)
    return TTest(value, float(se), n - 1)


@dataclass(frozen=True)
class Bootstrap:
    """Percentile interval and p-value of the ``replicates`` of an estimate ``value``."""

    value: float
    replicates: np.ndarray

    def interval(self, alpha: float) -> tuple[float, float]:
        r = self.replicates[np.isfinite(self.replicates)]
        if not r.size:
            return np.nan, np.nan
        lower, upper = np.quantile(r, [alpha / 2, 1 - alpha / 2])
        return float(lower), float(upper)

    def p_value(self) -> float:
        r = np.sort(self.replicates[np.isfinite(self.replicates)])
        if not r.size:
            return np.nan
        below = np.interp(0.0, r, np.linspace(0, 1, r.size))
        return float(2 * min(below, 1 - below))


def optimal_block_length(x: np.ndarray) -> float:
    """Politis & White's mean block length for the stationary bootstrap of the mean of ``x``
    (with Patton, Politis & White's correction; at least 1)."""
    n = x.size
    e = x - x.mean()
    k_n = max(5, int(np.log10(n)))
    m_max = int(np.ceil(np.sqrt(n))) + k_n
    acov = np.array([e[lag:] @ e[: n - lag] / n for lag in range(m_max + 1)])
    # the autocorrelations as arch (WeatherBench-X's block length) normalises them: over the
    # norms of the two parts one lag further apart
    norms = np.array(
        [np.sqrt((e[lag + 1 :] @ e[lag + 1 :]) * (e[: n - lag - 1] @ e[: n - lag - 1])) for lag in range(m_max + 1)]
    )
    with np.errstate(divide="ignore", invalid="ignore"):
        small = np.abs(acov * n) / norms < 2 * np.sqrt(np.log10(n) / n)
    first = next((m for m in range(m_max - k_n + 1) if small[m : m + k_n].all()), None)
    big_m = min(2 * max(first, 1), m_max) if first is not None else m_max
    lags = np.arange(1, big_m + 1)
    window = np.where(lags / big_m <= 0.5, 1.0, 2 * (1 - lags / big_m))
    g = 2 * np.sum(window * lags * acov[1 : big_m + 1])
    sigma2 = acov[0] + 2 * np.sum(window * acov[1 : big_m + 1])
    with np.errstate(divide="ignore", invalid="ignore"):
        b = (2 * g**2 / (2 * sigma2**2)) ** (1 / 3) * n ** (1 / 3)
    b = min(b, np.ceil(min(3 * np.sqrt(n), n / 3)))
    return float(max(1.0, b)) if np.isfinite(b) else 1.0


def stationary_indices(n: int, mean_block: float, replicates: int, rng: np.random.Generator) -> np.ndarray:
    """(replicates, n) indices of Politis & Romano's stationary bootstrap: each next index is
    the one after (wrapping around) or, with probability 1 / mean_block, a new uniform start."""
    out = np.empty((replicates, n), np.int64)
    out[:, 0] = rng.integers(n, size=replicates)
    for t in range(1, n):
        restart = rng.random(replicates) < 1 / mean_block
        out[:, t] = np.where(restart, rng.integers(n, size=replicates), (out[:, t - 1] + 1) % n)
    return out


METHODS = ("t_test_ar2", "stationary_bootstrap")


def compare(
    metric: Metric,
    candidate: dict[str, np.ndarray],
    baseline: dict[str, np.ndarray],
    batch_size: int | None = None,
    method: str = "t_test_ar2",
    replicates: int = 1000,
    rng: np.random.Generator | None = None,
) -> dict[str, TTest | Bootstrap]:
    """The candidate's score minus the baseline's (``difference``) and the same in percent of
    the baseline's (``percent``), over the same initialisation times, each with its
    uncertainty by ``method`` (:data:`METHODS`)."""
    value_c, psi_c = linearise(metric, candidate, batch_size)
    value_b, psi_b = linearise(metric, baseline, batch_size)
    out = {}
    for name, percent in (("difference", False), ("percent", True)):
        value, psi = combine(value_c, value_b, psi_c, psi_b, percent)
        if method == "t_test_ar2":
            out[name] = t_test_ar2(value, psi)
            continue
        u_c, u_b = metric.units(candidate), metric.units(baseline)
        rng = rng if rng is not None else np.random.default_rng(0)
        idx = stationary_indices(psi.size, optimal_block_length(psi), replicates, rng)
        reps_c, reps_b = metric.of_units(u_c[idx], batch_size), metric.of_units(u_b[idx], batch_size)
        out[name] = Bootstrap(value, combine(reps_c, reps_b, 0.0, 0.0, percent)[0])
    return out
