# Figures (PNG for the report, PDF beside it), drawn from result files only: `snakemake
# figures` redraws them without retraining. Captions: workflow/report/*.rst.


rule fig_loss_curves:
    """Figure: training and validation loss of every run."""
    input:
        [P.run_paths(run).log for run in P.train_runs],
    output:
        png=report(
            f"{FIGURES}/loss_curves.png",
            caption="../report/loss_curves.rst",
            category="Figures",
            subcategory="Training",
        ),
        pdf=f"{FIGURES}/loss_curves.pdf",
    log:
        f"{LOGS}/fig_loss_curves.log",
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} figure loss-curves {input:q} --output {output.png:q} > {log:q} 2>&1"


rule fig_lead_time:
    """Figure: scores against lead time, D-CHAG beside the baseline and the reference forecasts."""
    input:
        lead_time_scores,
    output:
        png=report(
            f"{FIGURES}/lead_time_{{convention}}.png",
            caption="../report/lead_time.rst",
            category="Figures",
            subcategory="Weather",
        ),
        pdf=f"{FIGURES}/lead_time_{{convention}}.pdf",
    log:
        f"{LOGS}/fig_lead_time_{{convention}}.log",
    wildcard_constraints:
        convention=one_of(schema_enum("evaluate.conventions")),
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} figure lead-time {input:q} --output {output.png:q} > {log:q} 2>&1"


rule fig_scorecard:
    """Figure: the scorecard of every compared pair of runs, significant differences marked."""
    input:
        scorecard_comparisons,
    output:
        png=report(
            f"{FIGURES}/scorecard_{{convention}}.png",
            caption="../report/scorecard.rst",
            category="Figures",
            subcategory="Weather",
        ),
        pdf=f"{FIGURES}/scorecard_{{convention}}.pdf",
        table=f"{FIGURES}/scorecard_{{convention}}.csv",
    log:
        f"{LOGS}/fig_scorecard_{{convention}}.log",
    wildcard_constraints:
        convention=one_of(schema_enum("evaluate.conventions")),
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} figure scorecard {input:q} --output {output.png:q} > {log:q} 2>&1"


rule fig_forecast_maps:
    """Figure: maps of a forecast, the truth and their difference."""
    input:
        forecasts=[f"{EVAL_DIR}/era5/forecast_{run}.zarr" for run in P.forecast_runs],
        truth=f"{EVAL_DIR}/era5/truth.zarr",
    output:
        png=report(
            f"{FIGURES}/forecast_maps.png",
            caption="../report/forecast_maps.rst",
            category="Figures",
            subcategory="Weather",
        ),
        pdf=f"{FIGURES}/forecast_maps.pdf",
    log:
        f"{LOGS}/fig_forecast_maps.log",
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        variable=map_variable(),
    shell:
        "{params.dchag} figure forecast-maps {input.forecasts:q} --truth {input.truth:q} "
        "--variables {params.variable:q} --output {output.png:q} > {log:q} 2>&1"


rule fig_hsi_reconstruction:
    """Figure: an MAE run's reconstruction beside the image."""
    input:
        [f"{EVAL_DIR}/hsi/recon_{run}.npz" for run in P.mae_runs],
    output:
        png=report(
            f"{FIGURES}/hsi_reconstruction.png",
            caption="../report/hsi_reconstruction.rst",
            category="Figures",
            subcategory="Hyperspectral",
        ),
        pdf=f"{FIGURES}/hsi_reconstruction.pdf",
    log:
        f"{LOGS}/fig_hsi_reconstruction.log",
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} figure hsi-reconstruction {input:q} --output {output.png:q} > {log:q} 2>&1"


rule fig_classification:
    """Figure: the classification runs' results."""
    input:
        [
            f"{EVAL_DIR}/hsi/classification_{run}_map.npz"
            for run in P.classification_runs
        ],
    output:
        png=report(
            f"{FIGURES}/classification.png",
            caption="../report/classification.rst",
            category="Figures",
            subcategory="Hyperspectral",
        ),
        pdf=f"{FIGURES}/classification.pdf",
    log:
        f"{LOGS}/fig_classification.log",
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} figure classification {input:q} --output {output.png:q} > {log:q} 2>&1"


rule fig_foundation:
    """Figure: the foundation-model experiment (from scratch, fine-tuned, linear probe)."""
    input:
        unpack(foundation_inputs),
    output:
        png=report(
            f"{FIGURES}/foundation.png",
            caption="../report/foundation.rst",
            category="Figures",
            subcategory="Hyperspectral",
        ),
        pdf=f"{FIGURES}/foundation.pdf",
        table=f"{FIGURES}/foundation.csv",
    log:
        f"{LOGS}/fig_foundation.log",
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        words=foundation_words,
    shell:
        "{params.dchag} figure foundation {params.words:q} --output {output.png:q} > {log:q} 2>&1"


# Every figure, from existing results (a named target: `snakemake figures`).
rule figures:
    """Every figure, redrawn from the results (no training)."""
    input:
        P.figure_outputs(),
    localrule: True


# The verification experiment (config `verify`): a named target, not part of `all`.
rule verify_report:
    """The verification experiment's verdict table and figure."""
    input:
        verify_inputs,
    output:
        table=report(
            f"{EVAL_DIR}/verify/verdict.csv",
            caption="../report/verify_table.rst",
            category="Verification",
        ),
        png=report(
            f"{FIGURES}/verify.png",
            caption="../report/verify.rst",
            category="Verification",
        ),
        pdf=f"{FIGURES}/verify.pdf",
    log:
        f"{LOGS}/verify_report.log",
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        runs=verify_run_dirs,
        tolerance=P.settings.verify.tolerance if P.settings.verify else None,
    shell:
        "{params.dchag} verify-report {params.runs:q} --tolerance {params.tolerance} "
        "--output {output.table:q} --figure {output.png:q} > {log:q} 2>&1"


rule verify:
    """The verification experiment (a named target, not part of all)."""
    input:
        rules.verify_report.output,
    localrule: True
