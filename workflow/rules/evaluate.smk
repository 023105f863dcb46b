# Evaluation: forecasts of every forecast run and of persistence and climatology on the test
# split, scored under each convention; the % change tables; hyperspectral test scores. Forecasts,
# truth and climatology are in WeatherBench 2's layout (dchag.evaluate.wb2).


rule era5_truth:
    """The test split denormalised: the truth the forecasts are scored against."""
    input:
        f"{RESULTS}/era5/test.zarr",
    output:
        directory(f"{EVAL_DIR}/era5/truth.zarr"),
    log:
        f"{LOGS}/era5_truth.log",
    conda:
        "../../envs/train.yaml"
    params:
        store_format=STORE_FORMAT,
        dchag=DCHAG,
        variables=P.forecast_variables(),
    shell:
        "{params.dchag} era5-truth --data {input:q} --variables {params.variables:q} "
        "--output {output:q} > {log:q} 2>&1"


rule wb2_climatology:
    """The climatology in WeatherBench 2's layout (for ACC under the wb2 convention)."""
    input:
        f"{RESULTS}/era5/climatology.zarr",
    output:
        directory(f"{EVAL_DIR}/era5/climatology.zarr"),
    log:
        f"{LOGS}/wb2_climatology.log",
    conda:
        "../../envs/train.yaml"
    params:
        store_format=STORE_FORMAT,
        dchag=DCHAG,
    shell:
        "{params.dchag} wb2-climatology --climatology {input:q} --output {output:q} > {log:q} 2>&1"


# The run's model folder over the test split: the initialisation times whose every lead is in
# it (`dchag predict --verifiable`), what the scores compare over.
rule forecast:
    """A run's hindcast over the test period: dchag predict on its model folder."""
    input:
        model=RUN.model_json,
        test=f"{RESULTS}/era5/test.zarr",
    output:
        directory(f"{EVAL_DIR}/era5/forecast_{{run}}.zarr"),
    log:
        f"{LOGS}/forecast_{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/forecast_{{run}}.tsv"
    wildcard_constraints:
        run=one_of(P.forecast_runs),
    conda:
        "../../envs/train.yaml"
    params:
        store_format=STORE_FORMAT,
        dchag=DCHAG,
        model=model_folder,
        leads=EVAL["lead_hours"],
        batch=EVAL["inference_batch_size"],
    shell:
        "{params.dchag} predict --model {params.model:q} --store {input.test:q} --verifiable "
        "--lead-hours {params.leads:q} --batch-size {params.batch} --output {output:q} > {log:q} 2>&1"


rule baseline_forecast:
    """A baseline forecast (persistence or climatology) over the test period."""
    input:
        test=f"{RESULTS}/era5/test.zarr",
        climatology=f"{EVAL_DIR}/era5/climatology.zarr",
    output:
        directory(f"{EVAL_DIR}/era5/forecast_{{kind}}.zarr"),
    log:
        f"{LOGS}/forecast_{{kind}}.log",
    wildcard_constraints:
        kind=one_of(BASELINE_FORECASTS),
    conda:
        "../../envs/train.yaml"
    params:
        store_format=STORE_FORMAT,
        dchag=DCHAG,
        variables=P.forecast_variables(),
        leads=EVAL["lead_hours"],
    shell:
        "{params.dchag} baseline-forecast --kind {wildcards.kind} --data {input.test:q} "
        "--variables {params.variables:q} --lead-hours {params.leads:q} "
        "--climatology {input.climatology:q} --output {output:q} > {log:q} 2>&1"


rule score:
    """Latitude-weighted RMSE, MSE and ACC of a forecast per region and their per-init statistics."""
    input:
        forecast=f"{EVAL_DIR}/era5/forecast_{{source}}.zarr",
        truth=f"{EVAL_DIR}/era5/truth.zarr",
        climatology=f"{EVAL_DIR}/era5/climatology.zarr",
    output:
        csv=report(
            f"{EVAL_DIR}/era5/scores_{{source}}_{{convention}}.csv",
            caption="../report/scores.rst",
            category="Weather scores",
            subcategory="{convention}",
            labels={"forecast": "{source}", "convention": "{convention}"},
        ),
        statistics=f"{EVAL_DIR}/era5/scores_{{source}}_{{convention}}.nc",
    log:
        f"{LOGS}/score_{{source}}_{{convention}}.log",
    wildcard_constraints:
        source=one_of(scored_sources()),
        convention=one_of(schema_enum("evaluate.conventions")),
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        options=score_options,
    shell:
        "{params.dchag} score --forecast {input.forecast:q} --truth {input.truth:q} {params.options:q} "
        "--convention {wildcards.convention} --output {output.csv:q} --statistics {output.statistics:q} "
        "> {log:q} 2>&1"


rule compare_scores:
    """A run's scores against a baseline's with intervals, p-values and verdicts."""
    input:
        baseline=f"{EVAL_DIR}/era5/scores_{{baseline}}_{{convention}}.nc",
        candidate=f"{EVAL_DIR}/era5/scores_{{candidate}}_{{convention}}.nc",
    output:
        report(
            f"{EVAL_DIR}/era5/comparison_{{candidate}}_vs_{{baseline}}_{{convention}}.csv",
            caption="../report/comparison.rst",
            category="Weather scores",
            subcategory="comparisons",
            labels={
                "candidate": "{candidate}",
                "baseline": "{baseline}",
                "convention": "{convention}",
            },
        ),
    log:
        f"{LOGS}/compare_{{candidate}}_vs_{{baseline}}_{{convention}}.log",
    wildcard_constraints:
        candidate=one_of(compared_sources()),
        baseline=one_of(compared_sources()),
        convention=one_of(schema_enum("evaluate.conventions")),
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        method=EVAL["significance"]["method"],
        alpha=EVAL["significance"]["alpha"],
        margin=EVAL["significance"]["equivalence_margin_percent"],
        replicates=EVAL["significance"]["bootstrap_replicates"],
        seed=EVAL["significance"]["seed"],
    shell:
        "{params.dchag} compare-scores --baseline {input.baseline:q} --candidate {input.candidate:q} "
        "--baseline-name {wildcards.baseline:q} --candidate-name {wildcards.candidate:q} "
        "--method {params.method:q} --alpha {params.alpha:q} --equivalence-margin {params.margin:q} "
        "--replicates {params.replicates:q} --seed {params.seed:q} --output {output:q} > {log:q} 2>&1"


rule evaluate_mae:
    """Reconstruction scores (masked and full) of an MAE run on the test tiles."""
    input:
        model=RUN.model_json,
        store=f"{RESULTS}/hsi/mae.zarr",
    output:
        scores=f"{EVAL_DIR}/hsi/recon_{{run}}.json",
        samples=f"{EVAL_DIR}/hsi/recon_{{run}}.npz",
    log:
        f"{LOGS}/evaluate_{{run}}.log",
    wildcard_constraints:
        run=one_of(P.mae_runs),
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        model=model_folder,
        batch=EVAL["inference_batch_size"],
    shell:
        "{params.dchag} evaluate-mae --model {params.model:q} --data {input.store:q} --batch-size {params.batch} "
        "--output {output.scores:q} --samples {output.samples:q} > {log:q} 2>&1"


rule evaluate_classification:
    """Classification scores (overall and per-class accuracy) of a run on the test patches."""
    input:
        model=RUN.model_json,
        store=f"{RESULTS}/hsi/classification.zarr",
    output:
        scores=f"{EVAL_DIR}/hsi/classification_{{run}}.json",
        per_class=report(
            f"{EVAL_DIR}/hsi/classification_{{run}}_per_class.csv",
            caption="../report/per_class.rst",
            category="Hyperspectral scores",
            labels={"run": "{run}", "table": "per class"},
        ),
        map=f"{EVAL_DIR}/hsi/classification_{{run}}_map.npz",
    log:
        f"{LOGS}/evaluate_{{run}}.log",
    wildcard_constraints:
        run=one_of(P.classification_runs),
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        model=model_folder,
        batch=EVAL["inference_batch_size"],
    shell:
        "{params.dchag} evaluate-classification --model {params.model:q} --data {input.store:q} "
        "--batch-size {params.batch} --output {output.scores:q} "
        "--per-class {output.per_class:q} --map {output.map:q} > {log:q} 2>&1"


rule hsi_scores:
    """The hyperspectral runs' scores in one table."""
    input:
        [f"{EVAL_DIR}/hsi/recon_{run}.json" for run in P.mae_runs]
        + [
            f"{EVAL_DIR}/hsi/classification_{run}.json"
            for run in P.classification_runs
        ],
    output:
        report(
            f"{EVAL_DIR}/hsi/scores.csv",
            caption="../report/hsi_scores.rst",
            category="Hyperspectral scores",
            labels={"run": "all", "table": "scores"},
        ),
    log:
        f"{LOGS}/hsi_scores.log",
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} hsi-scores {input:q} --output {output:q} > {log:q} 2>&1"


rule compare_hsi:
    """A hyperspectral run's test scores against a baseline's, bootstrapped over test samples."""
    input:
        baseline=hsi_samples("baseline"),
        candidate=hsi_samples("candidate"),
    output:
        report(
            f"{EVAL_DIR}/hsi/comparison_{{candidate}}_vs_{{baseline}}.csv",
            caption="../report/hsi_comparison.rst",
            category="Hyperspectral scores",
            labels={"run": "{candidate} vs {baseline}", "table": "comparison"},
        ),
    log:
        f"{LOGS}/compare_{{candidate}}_vs_{{baseline}}.log",
    wildcard_constraints:
        candidate=one_of(P.mae_runs + P.classification_runs),
        baseline=one_of(P.mae_runs + P.classification_runs),
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        alpha=EVAL["significance"]["alpha"],
        margin=EVAL["significance"]["equivalence_margin_percent"],
        replicates=EVAL["significance"]["bootstrap_replicates"],
        seed=EVAL["significance"]["seed"],
    shell:
        "{params.dchag} compare-scores --baseline {input.baseline:q} --candidate {input.candidate:q} "
        "--baseline-name {wildcards.baseline:q} --candidate-name {wildcards.candidate:q} "
        "--alpha {params.alpha:q} --equivalence-margin {params.margin:q} --replicates {params.replicates:q} "
        "--seed {params.seed:q} --output {output:q} > {log:q} 2>&1"


# Using what was trained (named targets, not part of `all`): a run's model folder over the
# classification scene, or reconstructing the first unlabelled image. (Its hindcast over the
# test period is the evaluation's forecast_<run>.zarr.)
rule predict_scene:
    """A classification run's map of the whole scene (a named target, not part of all)."""
    input:
        model=RUN.model_json,
        image=classification_scene,
    output:
        store=directory(f"{RESULTS}/predict/{{run}}/scene.zarr"),
        png=f"{RESULTS}/predict/{{run}}/scene.png",
    log:
        f"{LOGS}/predict_scene_{{run}}.log",
    wildcard_constraints:
        run=one_of(P.classification_runs),
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        model=model_folder,
        key=classification_scene_key,
    shell:
        "{params.dchag} predict --model {params.model:q} --image {input.image:q} {params.key:q} "
        "--output {output.store:q} > {log:q} 2>&1"


rule predict_reconstruction:
    """An MAE run's reconstruction of an unlabelled image (a named target, not part of all)."""
    input:
        model=RUN.model_json,
        image=mae_image_input,
    output:
        store=directory(f"{RESULTS}/predict/{{run}}/reconstruction.zarr"),
        png=f"{RESULTS}/predict/{{run}}/reconstruction.png",
    log:
        f"{LOGS}/predict_reconstruction_{{run}}.log",
    wildcard_constraints:
        run=one_of(P.mae_runs),
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        model=model_folder,
        image=mae_image,
        key=mae_image_key,
        batch=EVAL["inference_batch_size"],
    shell:
        "{params.dchag} predict --model {params.model:q} --image {params.image:q} {params.key:q} "
        "--batch-size {params.batch} --output {output.store:q} > {log:q} 2>&1"
