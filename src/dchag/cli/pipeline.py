"""Setting the pipeline up: checking a config before a run, the shipped Snakemake profiles."""

from __future__ import annotations

from .common import config, config_arg, config_source


def cmd_install_profile(args) -> None:
    from ..profiles import install

    print(install(args.name, args.dest, args.force))


def cmd_check_config(args) -> None:
    """The config merged and validated as the Snakefile does, and the plan built from it: a
    mistake is one line naming the file and line (YAML), or the key and value."""
    from ..plan import Plan

    plan = Plan(config(args))
    runs = ", ".join(f"{run} ({spec['task']})" for run, spec in plan.train_runs.items()) or "none"
    print(f"{config_source(args)}: valid; results in {plan.results}/; runs: {runs}")


def register(add) -> None:
    sp = add(
        "check-config",
        cmd_check_config,
        "check config files as the pipeline reads them (Snakemake's own message names no line)",
    )
    config_arg(sp)
    sp = add(
        "install-profile",
        cmd_install_profile,
        "copy a shipped Snakemake profile where `snakemake --profile NAME` finds it",
    )
    sp.add_argument("name", choices=["slurm"])
    sp.add_argument("--dest", help="profiles folder (default: $XDG_CONFIG_HOME/snakemake, i.e. ~/.config/snakemake)")
    sp.add_argument("--force", action="store_true", help="replace an installed profile of that name")
