# ERA5: (demo generation | download) -> weights -> per-year regrid -> statistics -> split stores
# + climatology. Per-year jobs are independent, so a cluster runs them in parallel.


wildcard_constraints:
    year=r"\d{4}",


if ERA5 and ERA5["demo"]:

    rule era5_demo_year:
        output:
            ERA5["inputs"],
        log:
            f"{LOGS}/era5_demo_{{year}}.log",
        conda:
            "../envs/preprocess.yaml"
        params:
            dchag=DCHAG,
            cfg=config_arg("era5"),
            outdir=lambda w, output: Path(output[0]).parent,
        shell:
            "{params.dchag} demo-era5 --config {params.cfg} --year {wildcards.year} --outdir {params.outdir} > {log} 2>&1"

    if ERA5["constants"]:

        rule era5_demo_constants:
            output:
                ERA5["constants"],
            log:
                f"{LOGS}/era5_demo_constants.log",
            conda:
                "../envs/preprocess.yaml"
            params:
                dchag=DCHAG,
                cfg=config_arg("era5"),
                outdir=lambda w, output: Path(output[0]).parent,
            shell:
                "{params.dchag} demo-era5 --config {params.cfg} --constants-only --outdir {params.outdir} > {log} 2>&1"


if ERA5 and ERA5["download"]:

    rule download_era5_year:
        output:
            next(p for p in ERA5["inputs"] if "{year}" in p),
        log:
            f"{LOGS}/download_era5_{{year}}.log",
        conda:
            "../envs/preprocess.yaml"
        resources:
            runtime=720,
        params:
            dchag=DCHAG,
            cfg=config_arg("era5"),
            source=ERA5["download"],
        shell:
            "{params.dchag} download-era5 --config {params.cfg} --year {wildcards.year} --source {params.source} "
            "--output {output} > {log} 2>&1"

    rule download_era5:
        input:
            [
                p.format(year=y)
                for y in era5_years()
                for p in ERA5["inputs"]
                if "{year}" in p
            ],


rule era5_weights:
    input:
        era5_inputs(era5_years("train")[0]),
    output:
        ERA5_WEIGHTS,
    log:
        f"{LOGS}/era5_weights.log",
    conda:
        "../envs/preprocess.yaml"
    params:
        dchag=DCHAG,
        cfg=config_arg("era5"),
        year=lambda w: era5_years("train")[0],
    shell:
        "{params.dchag} era5-weights --config {params.cfg} --year {params.year} --output {output} > {log} 2>&1"


rule era5_year:
    input:
        files=lambda w: era5_inputs(w.year),
        weights=ERA5_WEIGHTS,
    output:
        directory(f"{RESULTS}/era5/years/{{year}}.zarr"),
    log:
        f"{LOGS}/era5_year_{{year}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/era5_year_{{year}}.tsv"
    conda:
        "../envs/preprocess.yaml"
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        dchag=DCHAG,
        cfg=config_arg("era5"),
    shell:
        "{params.dchag} era5-year --config {params.cfg} --year {wildcards.year} --weights {input.weights} "
        "--output {output} > {log} 2>&1"


rule era5_stats:
    input:
        [era5_year_store(y) for y in era5_years("train")],
    output:
        f"{RESULTS}/era5/normalization.json",
    log:
        f"{LOGS}/era5_stats.log",
    conda:
        "../envs/preprocess.yaml"
    params:
        dchag=DCHAG,
        cfg=config_arg("era5"),
    shell:
        "{params.dchag} era5-stats --config {params.cfg} --output {output} {input} > {log} 2>&1"


rule era5_split:
    input:
        years=lambda w: [era5_year_store(y) for y in era5_years(w.split)],
        stats=rules.era5_stats.output,
    output:
        directory(f"{RESULTS}/era5/{{split}}.zarr"),
    log:
        f"{LOGS}/era5_split_{{split}}.log",
    wildcard_constraints:
        split="train|val|test",
    conda:
        "../envs/preprocess.yaml"
    params:
        dchag=DCHAG,
        cfg=config_arg("era5"),
    shell:
        "{params.dchag} era5-split --config {params.cfg} --split {wildcards.split} --stats {input.stats} "
        "--output {output} {input.years} > {log} 2>&1"


rule era5_climatology:
    input:
        lambda w: [era5_year_store(y) for y in era5_years(ERA5["climatology_split"])],
    output:
        directory(f"{RESULTS}/era5/climatology.zarr"),
    log:
        f"{LOGS}/era5_climatology.log",
    conda:
        "../envs/preprocess.yaml"
    params:
        dchag=DCHAG,
        cfg=config_arg("era5"),
    shell:
        "{params.dchag} era5-climatology --config {params.cfg} --output {output} {input} > {log} 2>&1"
