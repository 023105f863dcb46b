# The paper's experiments (config `paper`, a named target: `snakemake paper`). Each sweep point
# is one benchmark job under torchrun with tp x dp processes (GPUs) on as few nodes as hold
# them, so on Slurm every point is its own job; each figure is drawn from the points' results
# (and the accuracy figure from this config's training runs), beside the published values.


rule paper_point:
    """One point of the paper's sweep, measured under torchrun (throughput and memory)."""
    output:
        f"{RESULTS}/paper/points/{{point}}.json",
    log:
        f"{LOGS}/paper/{{point}}.log",
    wildcard_constraints:
        point=one_of(P.paper_points),
    conda:
        "../../envs/train.yaml"
    threads: paper_point_threads
    resources:
        **torchrun_resources(paper_shape),
    params:
        launch=paper_launcher,
        cfg=paper_point_config,
        rank_threads=paper_rank_threads,
    shell:
        "{params.launch} paper-point --config {params.cfg:q} --point {wildcards.point:q} --output {output:q} "
        "--threads-per-rank {params.rank_threads} > {log:q} 2>&1"


rule fig_paper:
    """Figure: one of the paper's memory/throughput figures, measured beside the published values."""
    input:
        paper_point_files,
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
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
    shell:
        "{params.dchag} paper-figure {wildcards.kind} {input:q} --output {output.png:q} > {log:q} 2>&1"


rule fig_paper_accuracy:
    """Figure: the paper's accuracy table from this config's own runs."""
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
    localrule: True
    conda:
        "../../envs/train.yaml"
    params:
        dchag=DCHAG,
        mae=paper_accuracy_runs("mae"),
        forecast=paper_accuracy_runs("forecast"),
    shell:
        "{params.dchag} paper-figure accuracy {input.comparisons:q} --mae {params.mae:q} "
        "--forecast {params.forecast:q} --output {output.png:q} > {log:q} 2>&1"


rule paper:
    """The paper's experiments and figures (a named target)."""
    input:
        paper_outputs,
    localrule: True
