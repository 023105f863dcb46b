# Training: one torchrun job per run of config train.runs (the demo: baseline and D-CHAG for
# each task). A crashed worker restarts the group (--max-restarts), which resumes from the
# newest checkpoint; so does a rerun or a Slurm resubmission of the job. `dchag launch-train`
# starts torchrun standalone on one node, or, on several Slurm nodes (one task per node,
# started by srun), with c10d rendezvous on the first.


rule train:
    input:
        unpack(train_inputs),
    output:
        final=directory(f"{RESULTS}/train/{{run}}/final"),
        log=f"{RESULTS}/train/{{run}}/log.csv",
    log:
        f"{LOGS}/train_{{run}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train_{{run}}.tsv"
    wildcard_constraints:
        run="|".join(ALL_RUNS) or "NO_RUNS",
    conda:
        "../envs/train.yaml"
    threads: lambda w: run_train(w.run).nproc
    resources:
        **train_resources(),
    params:
        launch=train_launcher,
        cfg=train_config_arg,
        nproc=lambda w: run_train(w.run).nproc,
        restarts=lambda w: run_train(w.run).max_restarts,
        # the job's threads over its ranks (Snakemake exports OMP/MKL/BLAS thread counts =
        # the job's threads, which torchrun would pass to every rank)
        rank_threads=lambda w, threads: max(1, threads // run_train(w.run).nproc),
        outdir=lambda w, output: Path(output.log).parent,
    shell:
        "{params.launch} launch-train --config {params.cfg} --run-name {wildcards.run} --output {params.outdir} "
        "--train-data {input.train} --val-data {input.val} --nproc {params.nproc} --max-restarts {params.restarts} "
        "--threads-per-rank {params.rank_threads} > {log} 2>&1"


rule train_summary:
    input:
        [f"{RESULTS}/train/{run}/log.csv" for run in TRAIN_RUNS],
    output:
        f"{RESULTS}/train/summary.csv",
    log:
        f"{LOGS}/train_summary.log",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} train-summary {input} --output {output} > {log} 2>&1"
