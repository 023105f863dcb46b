"""Setting the pipeline up on a cluster: the shipped Snakemake profiles."""

from __future__ import annotations


def cmd_install_profile(args) -> None:
    from ..profiles import install

    print(install(args.name, args.dest, args.force))


def register(add) -> None:
    sp = add(
        "install-profile",
        cmd_install_profile,
        "copy a shipped Snakemake profile where `snakemake --profile NAME` finds it",
    )
    sp.add_argument("name", choices=["slurm"])
    sp.add_argument("--dest", help="profiles folder (default: $XDG_CONFIG_HOME/snakemake, i.e. ~/.config/snakemake)")
    sp.add_argument("--force", action="store_true", help="replace an installed profile of that name")
