# Hyperspectral: (demo scene) -> classification patches and masked-autoencoder tiles,
# each one Zarr store with train/val/test groups.


if HSI and HSI["demo"]:

    rule hsi_demo:
        """A synthetic hyperspectral scene and images (the demo's data, labelled synthetic)."""
        output:
            image=HSI["classification"]["image"],
            labels=HSI["classification"]["labels"],
            envi=directory(HSI_DEMO_ENVI),
        log:
            f"{LOGS}/hsi_demo.log",
        localrule: True
        conda:
            "../../envs/preprocess.yaml"
        params:
            dchag=DCHAG,
            outdir=output_dir,
        shell:
            "{params.dchag} demo-hsi --outdir {params.outdir:q} > {log:q} 2>&1"


if "classification" in HSI:

    rule hsi_classification:
        """A labelled scene preprocessed into classification patches (bands, normalisation, splits)."""
        input:
            hsi_classification_inputs(),
        output:
            directory(f"{RESULTS}/hsi/classification.zarr"),
        log:
            f"{LOGS}/hsi_classification.log",
        conda:
            "../../envs/preprocess.yaml"
        params:
            dchag=DCHAG,
            cfg=section_config("hsi"),
        shell:
            "{params.dchag} preprocess-hsi --config {params.cfg:q} --task classification --output {output:q} "
            "> {log:q} 2>&1"


if "mae" in HSI:

    rule hsi_mae:
        """Hyperspectral images preprocessed into MAE tiles (bands, normalisation, splits)."""
        input:
            hsi_mae_inputs(),
        output:
            directory(f"{RESULTS}/hsi/mae.zarr"),
        log:
            f"{LOGS}/hsi_mae.log",
        conda:
            "../../envs/preprocess.yaml"
        params:
            dchag=DCHAG,
            cfg=section_config("hsi"),
        shell:
            "{params.dchag} preprocess-hsi --config {params.cfg:q} --task mae --output {output:q} > {log:q} 2>&1"
