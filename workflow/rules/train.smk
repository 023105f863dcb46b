# Training: one torchrun job per run of config train.runs (the demo: baseline and D-CHAG for
# each task). A crashed worker restarts the group (--max-restarts), which resumes from the
# newest checkpoint; so does a rerun or a Slurm resubmission of the job. `dchag launch-train`
# starts torchrun standalone on one node, or, on several Slurm nodes (one task per node,
# started by srun), with c10d rendezvous on the first.


rule train:
    """Train one run under torchrun (resumes from its newest checkpoint)."""
    input:
        unpack(train_inputs),
    output:
        final=directory(RUN.final),
        log=RUN.log,
    log:
        f"{LOGS}/train_{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_{{run}}.tsv"
    wildcard_constraints:
        run=one_of(P.all_runs),
    conda:
        "../../envs/train.yaml"
    threads: train_threads
    resources:
        **torchrun_resources(train_shape, "mem_mb"),
    params:
        launch=train_launcher,
        cfg=run_config,
        nproc=run_processes,
        restarts=run_restarts,
        rank_threads=rank_threads,
        outdir=run_dir,
        init=init_option,
    shell:
        "{params.launch} launch-train --config {params.cfg:q} --run-name {wildcards.run:q} --output {params.outdir:q} "
        "--train-data {input.train:q} --val-data {input.val:q} --nproc {params.nproc} "
        "--max-restarts {params.restarts} --threads-per-rank {params.rank_threads} {params.init:q} > {log:q} 2>&1"


# A run as one self-describing model folder (model.safetensors + model.json): what another
# run's init_from starts from, and what `dchag predict --model` takes.
rule export_model:
    """A run's model folder (weights, normalisation, channels, layout) from its final checkpoint."""
    input:
        unpack(export_inputs),
    output:
        meta=RUN.model_json,
        weights=RUN.model_weights,
    log:
        f"{LOGS}/export_{{run}}.log",
    wildcard_constraints:
        run=one_of(P.all_runs),
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        cfg=run_config,
        outdir=model_dir,
    shell:
        "{params.dchag} export --config {params.cfg:q} --run-name {wildcards.run:q} --checkpoint {input.final:q} "
        "--data {input.store:q} --output {params.outdir:q} > {log:q} 2>&1"


rule train_summary:
    """Every run's training losses in one table."""
    input:
        [P.run_paths(run).log for run in P.train_runs],
    output:
        f"{RESULTS}/train/summary.csv",
    log:
        f"{LOGS}/train_summary.log",
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} train-summary {input:q} --output {output:q} > {log:q} 2>&1"
