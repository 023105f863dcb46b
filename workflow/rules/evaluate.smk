# Evaluation: forecasts of every forecast run and of persistence and climatology on the test
# split, scored under each convention; the % change tables; hyperspectral test scores.


rule era5_truth:
    input:
        f"{RESULTS}/era5/test.zarr",
    output:
        directory(f"{EVAL_DIR}/era5/truth.zarr"),
    log:
        f"{LOGS}/era5_truth.log",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
        variables=" ".join(forecast_outputs()) if FORECAST_RUNS else "",
    shell:
        "{params.dchag} era5-truth --data {input} --variables {params.variables} "
        "--output {output} > {log} 2>&1"


rule forecast:
    input:
        final=f"{RESULTS}/train/{{run}}/final",
        test=f"{RESULTS}/era5/test.zarr",
    output:
        directory(f"{EVAL_DIR}/era5/forecast_{{run}}.zarr"),
    log:
        f"{LOGS}/forecast_{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/forecast_{{run}}.tsv"
    wildcard_constraints:
        run="|".join(FORECAST_RUNS) or "NO_RUNS",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
        cfg=train_config_arg,
        leads=" ".join(map(str, EVAL["lead_hours"])),
        batch=EVAL["inference_batch_size"],
    shell:
        "{params.dchag} forecast --config {params.cfg} --run-name {wildcards.run} --checkpoint {input.final} "
        "--data {input.test} --lead-hours {params.leads} "
        "--batch-size {params.batch} --output {output} > {log} 2>&1"


rule baseline_forecast:
    input:
        test=f"{RESULTS}/era5/test.zarr",
        climatology=f"{RESULTS}/era5/climatology.zarr",
    output:
        directory(f"{EVAL_DIR}/era5/forecast_{{kind}}.zarr"),
    log:
        f"{LOGS}/forecast_{{kind}}.log",
    wildcard_constraints:
        kind="|".join(BASELINE_FORECASTS),
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
        variables=" ".join(forecast_outputs()) if FORECAST_RUNS else "",
        leads=" ".join(map(str, EVAL["lead_hours"])),
    shell:
        "{params.dchag} baseline-forecast --kind {wildcards.kind} --data {input.test} "
        "--variables {params.variables} --lead-hours {params.leads} "
        "--climatology {input.climatology} --output {output} > {log} 2>&1"


rule score:
    input:
        forecast=f"{EVAL_DIR}/era5/forecast_{{source}}.zarr",
        truth=f"{EVAL_DIR}/era5/truth.zarr",
        climatology=f"{RESULTS}/era5/climatology.zarr",
    output:
        report(
            f"{EVAL_DIR}/era5/scores_{{source}}_{{convention}}.csv",
            caption="../report/scores.rst",
            category="Weather scores",
            subcategory="{convention}",
            labels={"forecast": "{source}", "convention": "{convention}"},
        ),
    log:
        f"{LOGS}/score_{{source}}_{{convention}}.log",
    wildcard_constraints:
        source="|".join([*FORECAST_RUNS, *BASELINE_FORECASTS]),
        convention="wb2|climax",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
        batch=lambda w: (
            f"--batch-size {EVAL['climax_batch_size']}"
            if EVAL["climax_batch_size"] and w.convention == "climax"
            else ""
        ),
        # ClimaX scores ACC against the scored period's time mean unless given one.
        clim=lambda w, input: (
            f"--climatology {input.climatology}" if w.convention == "wb2" else ""
        ),
    shell:
        "{params.dchag} score --forecast {input.forecast} --truth {input.truth} {params.clim} "
        "--convention {wildcards.convention} {params.batch} --output {output} > {log} 2>&1"


rule compare_scores:
    input:
        baseline=lambda w: f"{EVAL_DIR}/era5/scores_{COMPARISONS[w.candidate]}_{w.convention}.csv",
        candidate=f"{EVAL_DIR}/era5/scores_{{candidate}}_{{convention}}.csv",
    output:
        report(
            f"{EVAL_DIR}/era5/comparison_{{candidate}}_{{convention}}.csv",
            caption="../report/comparison.rst",
            category="Weather scores",
            subcategory="D-CHAG vs baseline",
            labels={"candidate": "{candidate}", "convention": "{convention}"},
        ),
    log:
        f"{LOGS}/compare_{{candidate}}_{{convention}}.log",
    wildcard_constraints:
        candidate="|".join(COMPARISONS) or "NO_RUNS",
        convention="wb2|climax",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
        base=lambda w: COMPARISONS[w.candidate],
    shell:
        "{params.dchag} compare-scores --baseline {input.baseline} --candidate {input.candidate} "
        "--baseline-name {params.base} --candidate-name {wildcards.candidate} --output {output} > {log} 2>&1"


rule evaluate_mae:
    input:
        final=f"{RESULTS}/train/{{run}}/final",
        store=f"{RESULTS}/hsi/mae.zarr",
    output:
        scores=f"{EVAL_DIR}/hsi/recon_{{run}}.json",
        samples=f"{EVAL_DIR}/hsi/recon_{{run}}.npz",
    log:
        f"{LOGS}/evaluate_{{run}}.log",
    wildcard_constraints:
        run="|".join(MAE_RUNS) or "NO_RUNS",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
        cfg=train_config_arg,
    shell:
        "{params.dchag} evaluate-mae --config {params.cfg} --run-name {wildcards.run} --checkpoint {input.final} "
        "--data {input.store} --output {output.scores} --samples {output.samples} > {log} 2>&1"


rule evaluate_classify:
    input:
        final=f"{RESULTS}/train/{{run}}/final",
        store=f"{RESULTS}/hsi/classification.zarr",
    output:
        scores=f"{EVAL_DIR}/hsi/classify_{{run}}.json",
        per_class=report(
            f"{EVAL_DIR}/hsi/classify_{{run}}_per_class.csv",
            caption="../report/per_class.rst",
            category="Hyperspectral scores",
            labels={"run": "{run}", "table": "per class"},
        ),
        map=f"{EVAL_DIR}/hsi/classify_{{run}}_map.npz",
    log:
        f"{LOGS}/evaluate_{{run}}.log",
    wildcard_constraints:
        run="|".join(CLASSIFY_RUNS) or "NO_RUNS",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
        cfg=train_config_arg,
    shell:
        "{params.dchag} evaluate-classify --config {params.cfg} --run-name {wildcards.run} "
        "--checkpoint {input.final} --data {input.store} --output {output.scores} "
        "--per-class {output.per_class} --map {output.map} > {log} 2>&1"


rule hsi_scores:
    input:
        [f"{EVAL_DIR}/hsi/recon_{run}.json" for run in MAE_RUNS]
        + [f"{EVAL_DIR}/hsi/classify_{run}.json" for run in CLASSIFY_RUNS],
    output:
        report(
            f"{EVAL_DIR}/hsi/scores.csv",
            caption="../report/hsi_scores.rst",
            category="Hyperspectral scores",
            labels={"run": "all", "table": "scores"},
        ),
    log:
        f"{LOGS}/hsi_scores.log",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} hsi-scores {input} --output {output} > {log} 2>&1"
