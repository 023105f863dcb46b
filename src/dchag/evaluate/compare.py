"""Tables across runs: one run's weather scores against another's with their uncertainty (the
paper's % change of D-CHAG against the baseline, with confidence intervals, p-values and an
equivalence verdict), and one long table of the hyperspectral scores of every run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from ..store import InputError
from . import perinit, significance

LOWER_IS_BETTER = {"rmse", "mse"}


def _common(base: xr.Dataset, cand: xr.Dataset, baseline: str, candidate: str):
    """The variables, leads (hours) and regions both files score, and the initialisation
    times they share (evenly spaced: the methods model serial dependence)."""
    for key in ("convention", "climax_batch_size"):
        if base.attrs[key] != cand.attrs[key]:
            raise InputError(
                f"{baseline} and {candidate} differ in {key} ({base.attrs[key]} and {cand.attrs[key]}): "
                "compare scores of one convention"
            )
    variables = sorted(set(base.data_vars) & set(cand.data_vars))
    leads = sorted(set(perinit.lead_hours(base)) & set(perinit.lead_hours(cand)))
    regions = [r for r in base[perinit.REGION].values if r in set(cand[perinit.REGION].values)]
    inits = np.intersect1d(base[perinit.INIT].values, cand[perinit.INIT].values)
    if not variables or not leads or not regions or inits.size < 3:
        raise InputError(
            f"{baseline} and {candidate} share {len(variables)} variable(s), {len(leads)} lead(s), "
            f"{len(regions)} region(s) and {inits.size} initialisation time(s): nothing to compare "
            "(at least 3 common initialisation times are needed)"
        )
    steps = np.unique(np.diff(inits))
    if steps.size > 1:
        raise InputError(
            f"the initialisation times {baseline} and {candidate} share are not evenly spaced "
            f"(steps {', '.join(str(pd.Timedelta(x)) for x in steps[:4])}): the significance tests model "
            "the dependence between consecutive ones"
        )
    return variables, leads, regions, inits


def compare_scores(
    baseline: str | Path,
    candidate: str | Path,
    baseline_name: str = "baseline",
    candidate_name: str = "dchag",
    method: str = "t_test_ar2",
    alpha: float = 0.05,
    margin: float = 1.0,
    replicates: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """The candidate's scores against the baseline's for every (variable, lead, region, metric)
    both per-init statistics files hold, over their common initialisation times: the two runs'
    names (``baseline``, ``candidate``) and scores (``baseline_score``, ``candidate_score``),
    the difference and percent difference (100 (c - b) / |b|) with their 1 - alpha intervals,
    the difference's p-value (:mod:`dchag.evaluate.significance`), the verdict (better or worse
    where p < alpha, else no significant difference; lower RMSE and MSE and higher ACC are
    better) and the equivalence within +-margin percent."""
    if method not in significance.METHODS or not 0 < alpha < 0.5:
        raise InputError(
            f"evaluate.significance: method {method!r} and alpha {alpha}: expected one of "
            f"{', '.join(significance.METHODS)} and 0 < alpha < 0.5"
        )
    base, cand = perinit.open_statistics(baseline), perinit.open_statistics(candidate)
    variables, leads, regions, inits = _common(base, cand, str(baseline), str(candidate))
    chosen = [m for m in perinit.metrics(base) if m.name in cand.attrs["metrics"].split()]
    batch, rng = perinit.batch_size(base), np.random.default_rng(seed)
    rows = []
    for var in variables:
        b_da, c_da = (ds[var].sel({perinit.INIT: inits}) for ds in (base, cand))
        for lead in leads:
            i_b, i_c = (int(np.flatnonzero(perinit.lead_hours(ds) == lead)[0]) for ds in (base, cand))
            for region in regions:
                s_b, s_c = perinit.series(b_da, region, i_b), perinit.series(c_da, region, i_c)
                for metric in chosen:
                    est = significance.compare(metric, s_c, s_b, batch, method, replicates, rng)
                    row = {"variable": var, "lead_time_hours": lead, "region": region, "metric": metric.name}
                    row |= {"convention": base.attrs["convention"], "baseline_score": metric(s_b, batch)}
                    row |= {"candidate_score": metric(s_c, batch)}
                    rows.append(row | _judged(est, metric.name, alpha, margin))
    out = pd.DataFrame(rows)
    out["baseline"], out["candidate"] = baseline_name, candidate_name
    out["method"], out["alpha"], out["n_init"] = method, alpha, inits.size
    return out.sort_values(["convention", "metric", "variable", "lead_time_hours", "region"]).reset_index(drop=True)


def _judged(est: dict, metric: str, alpha: float, margin: float) -> dict:
    """The estimates' columns and verdicts."""
    diff, pct = est["difference"], est["percent"]
    (d_lo, d_hi), (p_lo, p_hi) = diff.interval(alpha), pct.interval(alpha)
    p = diff.p_value()
    if p < alpha and diff.value != 0:
        gain = -diff.value if metric in LOWER_IS_BETTER else diff.value
        verdict = "better" if gain > 0 else "worse"
    else:
        verdict = "no significant difference"
    e_lo, e_hi = pct.interval(2 * alpha)  # two one-sided tests at level alpha
    equivalent = bool(-margin < e_lo and e_hi < margin)
    return {
        "difference": diff.value,
        "difference_lower": d_lo,
        "difference_upper": d_hi,
        "percent_change": pct.value,
        "percent_lower": p_lo,
        "percent_upper": p_hi,
        "p_value": p,
        "verdict": verdict,
        "equivalence": f"within {margin:g}%" if equivalent else f"not shown within {margin:g}%",
    }


def _hsi_samples(path: str | Path) -> tuple[str, dict[str, np.ndarray]]:
    """A run's per-sample results: the test patches' labels of a classification map (0-based,
    ``dchag evaluate-classification --map``) or the test tiles' errors of a reconstruction
    (``dchag evaluate-mae --samples``)."""
    if not Path(path).exists():
        raise InputError(f"per-sample results not found: {path}")
    with np.load(path) as z:
        if {"truth", "pred", "split", "class_names"} <= set(z.files):
            test = z["split"] == 2
            k = len(z["class_names"])
            return "classification", {"truth": z["truth"][test] - 1, "pred": z["pred"][test] - 1, "classes": k}
        if "tile_masked_se" in z.files:
            return "mae", {k: z[k] for k in z.files if k.startswith("tile_")}
    raise InputError(
        f"{path} is neither a classification map (dchag evaluate-classification) nor reconstruction samples with "
        "per-tile errors (dchag evaluate-mae; one from an older dchag lacks them: snakemake --forcerun evaluate_mae)"
    )


def _oa(d, i):
    return (d["pred"][i] == d["truth"][i]).mean(-1)


def _aa(d, i):
    t, hit = d["truth"][i], d["pred"][i] == d["truth"][i]
    support = np.stack([(t == k).sum(-1) for k in range(d["classes"])], -1)
    correct = np.stack([((t == k) & hit).sum(-1) for k in range(d["classes"])], -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nanmean(np.where(support > 0, correct / support, np.nan), -1)  # classes absent: left out


def _kappa(d, i):
    t, p, n = d["truth"][i], d["pred"][i], i.shape[-1]
    chance = sum((t == k).sum(-1) * (p == k).sum(-1) for k in range(d["classes"])) / n**2
    return (_oa(d, i) - chance) / (1 - chance)


HSI_METRICS = {  # task -> (metric, region, f(per-sample results, indices)); higher is better but for RMSE
    "classification": [
        ("overall_accuracy", "test", _oa),
        ("average_accuracy", "test", _aa),
        ("kappa", "test", _kappa),
    ],
    "mae": [
        (
            "rmse",
            region,
            lambda d, i, r=region: np.sqrt(d[f"tile_{r}_se"][i].sum(-1) / d[f"tile_{r}_count"][i].sum(-1)),
        )
        for region in ("masked", "full")
    ],
}


def compare_hsi(
    baseline: str | Path,
    candidate: str | Path,
    baseline_name: str = "baseline",
    candidate_name: str = "dchag",
    alpha: float = 0.05,
    margin: float = 1.0,
    replicates: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """The candidate's hyperspectral test scores against the baseline's with a paired bootstrap
    over the test samples (patches, or tiles of a reconstruction: the same resampled samples
    for both runs; percentile intervals, the p-value where the interval reaches 0), in the
    columns of :func:`compare_scores`: classification accuracy (overall, average) and kappa;
    the RMSE of a reconstruction on the masked patches and on the whole tiles."""
    (task, b), (task_c, c) = _hsi_samples(baseline), _hsi_samples(candidate)
    same = task == task_c and all(
        np.array_equal(b[k], c[k]) for k in ("truth", "tile_masked_count", "tile_full_count") if k in b
    )
    if not same:
        raise InputError(f"{baseline} and {candidate} are not results on the same test samples: nothing to compare")
    n = len(b["truth"] if task == "classification" else b["tile_full_se"])
    if n < 2:
        raise InputError(f"{baseline} holds {n} test sample(s): a bootstrap needs at least 2")
    metrics, rng = HSI_METRICS[task], np.random.default_rng(seed)
    resampled = [([], []) for _ in metrics]
    for start in range(0, replicates, chunk := max(1, 2**22 // n)):  # indices of at most 32 MiB at a time
        draws = rng.integers(n, size=(min(chunk, replicates - start), n))
        for (_, _, f), (r_b, r_c) in zip(metrics, resampled, strict=True):
            r_b.append(f(b, draws))
            r_c.append(f(c, draws))
    everything, rows = np.arange(n), []
    for (metric, region, f), parts in zip(metrics, resampled, strict=True):
        s_b, s_c = float(f(b, everything)), float(f(c, everything))
        r_b, r_c = (np.concatenate(p) for p in parts)
        # resamples whose baseline is 0 have no percent change and drop out of its interval
        with np.errstate(divide="ignore", invalid="ignore"):
            est = {
                "difference": significance.Bootstrap(s_c - s_b, r_c - r_b),
                "percent": significance.Bootstrap(
                    100 * (s_c - s_b) / significance.magnitude(s_b), 100 * (r_c - r_b) / significance.magnitude(r_b)
                ),
            }
        row = {"task": task, "region": region, "metric": metric, "baseline_score": s_b, "candidate_score": s_c}
        rows.append(row | _judged(est, metric, alpha, margin))
    out = pd.DataFrame(rows)
    out["baseline"], out["candidate"] = baseline_name, candidate_name
    out["method"], out["alpha"], out["n_samples"] = "paired_bootstrap", alpha, n
    return out


def hsi_table(files: list[str]) -> pd.DataFrame:
    """run, task, region, metric, value from `dchag evaluate-mae` / `evaluate-classification` JSON."""
    rows = []
    for path in files:
        if not Path(path).exists():
            raise InputError(f"score file not found: {path}")
        d = json.loads(Path(path).read_text())
        if "masked" in d:
            for region in ("masked", "full"):
                for k in ("rmse", "psnr", "psnr_band_mean", "ssim", "sam", "ergas"):
                    rows.append({"run": d["run"], "task": "mae", "region": region, "metric": k, "value": d[region][k]})
        elif "overall_accuracy" in d:
            for k in ("overall_accuracy", "average_accuracy", "kappa"):
                rows.append(
                    {
                        "run": d["run"],
                        "task": "classification",
                        "region": d.get("split", "test"),
                        "metric": k,
                        "value": d[k],
                    }
                )
        else:
            raise InputError(f"{path} is neither a reconstruction nor a classification score file")
    return pd.DataFrame(rows, columns=["run", "task", "region", "metric", "value"])
