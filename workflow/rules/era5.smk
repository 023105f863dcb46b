# ERA5: (demo generation | download) -> weights -> per-year regrid -> statistics -> split stores
# + climatology. Per-year jobs are independent, so a cluster runs them in parallel.


wildcard_constraints:
    year=r"\d{4}",


if ERA5["demo"]:

    rule era5_demo_year:
        """Synthetic ERA5-layout netCDF of one year (the demo's data, labelled synthetic)."""
        output:
            ERA5["inputs"],
        log:
            f"{LOGS}/era5_demo_{{year}}.log",
        localrule: True
        conda:
            "../../envs/preprocess.yaml"
        params:
            dchag=DCHAG,
            cfg=section_config("era5"),
            outdir=output_dir,
        shell:
            "{params.dchag} demo-era5 --config {params.cfg:q} --year {wildcards.year} --outdir {params.outdir:q} "
            "> {log:q} 2>&1"

    if ERA5["constants"]:

        rule era5_demo_constants:
            """Synthetic constant fields (land-sea mask, orography) for the demo."""
            output:
                ERA5["constants"],
            log:
                f"{LOGS}/era5_demo_constants.log",
            localrule: True
            conda:
                "../../envs/preprocess.yaml"
            params:
                dchag=DCHAG,
                cfg=section_config("era5"),
                outdir=output_dir,
            shell:
                "{params.dchag} demo-era5 --config {params.cfg:q} --constants-only --outdir {params.outdir:q} "
                "> {log:q} 2>&1"


if ERA5["download"]:

    rule download_era5_year:
        """Download one year of ERA5 (WeatherBench 2's GCS store or the CDS)."""
        output:
            next(p for p in ERA5["inputs"] if "{year}" in p),
        log:
            f"{LOGS}/download_era5_{{year}}.log",
        conda:
            "../../envs/preprocess.yaml"
        resources:
            runtime=720,
        params:
            dchag=DCHAG,
            cfg=section_config("era5"),
            source=ERA5["download"],
        shell:
            "{params.dchag} download-era5 --config {params.cfg:q} --year {wildcards.year} --source {params.source:q} "
            "--output {output:q} > {log:q} 2>&1"

    rule download_era5:
        """Every year the config names, downloaded."""
        input:
            [
                p.format(year=y)
                for y in P.era5_years()
                for p in ERA5["inputs"]
                if "{year}" in p
            ],


# Inputs already on the target grid (a WeatherBench 2 store) are copied: no weights job.
if P.era5_weights:

    rule era5_weights:
        """Regridding weights from the source grid to the target grid (xESMF or dchag's ESMF rule)."""
        input:
            P.era5_inputs(P.era5_years("train")[0]),
        output:
            P.era5_weights,
        log:
            f"{LOGS}/era5_weights.log",
        conda:
            "../../envs/preprocess.yaml"
        params:
            dchag=DCHAG,
            cfg=section_config("era5"),
            year=era5_weights_year,
        shell:
            "{params.dchag} era5-weights --config {params.cfg:q} --year {params.year} --output {output:q} > {log:q} 2>&1"


rule era5_year:
    """One year of inputs regridded to the target grid and written as a float32 Zarr store."""
    input:
        unpack(era5_year_inputs),
    output:
        directory(f"{RESULTS}/era5/years/{{year}}.zarr"),
    log:
        f"{LOGS}/era5_year_{{year}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/era5_year_{{year}}.tsv"
    conda:
        "../../envs/preprocess.yaml"
    resources:
        mem_mb=4000,
        runtime=120,
    params:
        dchag=DCHAG,
        cfg=section_config("era5"),
        weights=era5_weights_option,
    shell:
        "{params.dchag} era5-year --config {params.cfg:q} --year {wildcards.year} {params.weights:q} "
        "--output {output:q} > {log:q} 2>&1"


# Statistics: one job per training year (its moments, read a chunk at a time), then a small
# combine. Splits: one job per year (the shards inside it), then a small assembly that links
# them and writes the shards across year boundaries. Climatology: one job per climatology
# year's worth of data (a block of days of every year), then the smoothing, channel by
# channel. Memory per job is a chunk, whatever the number of years (benchmarks/results/preprocess.md).
rule era5_year_stats:
    """Per-channel statistics of one training year (combined into the normalisation)."""
    input:
        P.era5_year_store("{year}"),
    output:
        P.era5_year_stats("{year}"),
    log:
        f"{LOGS}/era5_year_stats_{{year}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/era5_year_stats_{{year}}.tsv"
    conda:
        "../../envs/preprocess.yaml"
    resources:
        mem_mb=P.era5_mem_mb("era5_year_stats", 2000),
        runtime=60,
    params:
        dchag=DCHAG,
        cfg=section_config("era5"),
    shell:
        "{params.dchag} era5-year-stats --config {params.cfg:q} --output {output:q} {input:q} > {log:q} 2>&1"


rule era5_stats:
    """Normalisation statistics (mean, std per channel) combined from the training years."""
    input:
        era5_stats_partials,
    output:
        f"{RESULTS}/era5/normalization.json",
    log:
        f"{LOGS}/era5_stats.log",
    localrule: True
    conda:
        "../../envs/preprocess.yaml"
    params:
        dchag=DCHAG,
        cfg=section_config("era5"),
    shell:
        "{params.dchag} era5-stats --config {params.cfg:q} --output {output:q} {input:q} > {log:q} 2>&1"


rule era5_split_part:
    """One year of a split, normalised with the training statistics."""
    input:
        years=era5_split_years,
        stats=rules.era5_stats.output,
    output:
        temp(directory(P.era5_split_part("{split}", "{year}"))),
    log:
        f"{LOGS}/era5_split_part_{{split}}_{{year}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/era5_split_part_{{split}}_{{year}}.tsv"
    wildcard_constraints:
        split=one_of(ERA5_SPLITS),
    conda:
        "../../envs/preprocess.yaml"
    resources:
        mem_mb=P.era5_mem_mb("era5_split_part", 2000),
        runtime=120,
    params:
        dchag=DCHAG,
        cfg=section_config("era5"),
    shell:
        "{params.dchag} era5-split-part --config {params.cfg:q} --split {wildcards.split} --year {wildcards.year} "
        "--stats {input.stats:q} --output {output:q} {input.years:q} > {log:q} 2>&1"


rule era5_split:
    """A split (train, val or test) assembled from its normalised years."""
    input:
        years=era5_split_years,
        parts=era5_split_parts,
        stats=rules.era5_stats.output,
    output:
        directory(f"{RESULTS}/era5/{{split}}.zarr"),
    log:
        f"{LOGS}/era5_split_{{split}}.log",
    wildcard_constraints:
        split=one_of(ERA5_SPLITS),
    conda:
        "../../envs/preprocess.yaml"
    resources:
        mem_mb=2000,
        runtime=60,
    params:
        store_format=STORE_FORMAT,
        dchag=DCHAG,
        cfg=section_config("era5"),
    shell:
        "{params.dchag} era5-split --config {params.cfg:q} --split {wildcards.split} --stats {input.stats:q} "
        "--output {output:q} --parts {input.parts:q} --years {input.years:q} > {log:q} 2>&1"


rule era5_climatology_part:
    """One part of the training years' day-of-year sums (the climatology is summed by parts)."""
    input:
        era5_climatology_years,
    output:
        temp(directory(P.era5_climatology_part("{part}"))),
    log:
        f"{LOGS}/era5_climatology_part_{{part}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/era5_climatology_part_{{part}}.tsv"
    wildcard_constraints:
        part=r"\d+",
    conda:
        "../../envs/preprocess.yaml"
    resources:
        mem_mb=P.era5_mem_mb("era5_climatology_part", 2000),
        runtime=60,
    params:
        dchag=DCHAG,
        cfg=section_config("era5"),
        parts=P.era5_climatology_parts(),
    shell:
        "{params.dchag} era5-climatology-part --config {params.cfg:q} --part {wildcards.part} "
        "--parts {params.parts} --output {output:q} {input:q} > {log:q} 2>&1"


rule era5_climatology:
    """The day-of-year climatology of the training years (for ACC and the climatology forecast)."""
    input:
        [P.era5_climatology_part(k) for k in range(1, P.era5_climatology_parts() + 1)],
    output:
        directory(f"{RESULTS}/era5/climatology.zarr"),
    log:
        f"{LOGS}/era5_climatology.log",
    benchmark:
        f"{RESULTS}/benchmarks/era5_climatology.tsv"
    conda:
        "../../envs/preprocess.yaml"
    resources:
        mem_mb=P.era5_mem_mb("era5_climatology", 4000),
        runtime=60,
    params:
        store_format=STORE_FORMAT,
        dchag=DCHAG,
        cfg=section_config("era5"),
    shell:
        "{params.dchag} era5-climatology --config {params.cfg:q} --output {output:q} {input:q} > {log:q} 2>&1"
