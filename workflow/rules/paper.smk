# The paper's experiments (config `paper`, a named target: `snakemake paper`). Each sweep point
# is one benchmark job under torchrun with tp x dp processes (GPUs) on as few nodes as hold
# them, so on Slurm every point is its own job; each figure is drawn from the points' results
# (and the accuracy figure from this config's training runs), beside the published values.


rule paper_point:
    output:
        f"{PAPER_DIR}/points/{{point}}.json",
    log:
        f"{LOGS}/paper/{{point}}.log",
    wildcard_constraints:
        point="|".join(PAPER_POINTS) or "NO_POINTS",
    conda:
        "../envs/train.yaml"
    threads: lambda w: paper_resources(w.point).per_node
    resources:
        **paper_point_resources(),
    params:
        launch=paper_launcher,
        cfg=paper_point_config,
        # the job's threads over its ranks (Snakemake exports the job's thread count, which
        # torchrun would give every rank)
        rank_threads=lambda w, threads: PAPER["threads_per_rank"]
        or max(1, threads // paper_resources(w.point).per_node),
    shell:
        "{params.launch} paper-point --config {params.cfg} --point {wildcards.point} --output {output} "
        "--threads-per-rank {params.rank_threads} > {log} 2>&1"


rule fig_paper:
    input:
        lambda w: paper_point_files(w.kind),
    output:
        png=report(
            f"{FIGURES}/paper/{{kind}}.png",
            caption="../report/paper.rst",
            category="Paper",
            subcategory="{kind}",
        ),
        pdf=f"{FIGURES}/paper/{{kind}}.pdf",
        table=f"{FIGURES}/paper/{{kind}}.csv",
    log:
        f"{LOGS}/fig_paper_{{kind}}.log",
    wildcard_constraints:
        kind="front_share|tokenization|tree|full_models|tp_scaling",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} paper-figure {wildcards.kind} {input} --output {output.png} > {log} 2>&1"


rule fig_paper_accuracy:
    input:
        unpack(paper_accuracy_inputs),
    output:
        png=report(
            f"{FIGURES}/paper/accuracy.png",
            caption="../report/paper_accuracy.rst",
            category="Paper",
            subcategory="accuracy",
        ),
        pdf=f"{FIGURES}/paper/accuracy.pdf",
        table=f"{FIGURES}/paper/accuracy.csv",
    log:
        f"{LOGS}/fig_paper_accuracy.log",
    conda:
        "../envs/train.yaml"
    params:
        dchag=DCHAG,
        mae=lambda w, input: " ".join(
            f"{v}={input[f'mae_{v}']}" for v in PAPER_ACCURACY.get("mae", {})
        ),
        forecast=lambda w, input: " ".join(
            f"{v}={input[f'forecast_{v}']}" for v in PAPER_ACCURACY.get("forecast", {})
        ),
    shell:
        "{params.dchag} paper-figure accuracy {input.comparisons} --mae {params.mae} --forecast {params.forecast} "
        "--output {output.png} > {log} 2>&1"


rule paper:
    input:
        paper_outputs,
    localrule: True
