"""Snakemake profiles shipped with dchag, and their installation.

`snakemake --profile NAME` looks a bare NAME up in ./NAME, $XDG_CONFIG_HOME/snakemake/NAME
(default ~/.config/snakemake/NAME) and /etc/xdg/snakemake/NAME — not in the workflow's
profiles/ folder (that is --workflow-profile). `dchag install-profile slurm` puts the shipped
profile in the user's folder; profiles/slurm in the repository is the same files.
"""

from __future__ import annotations

import os
import shutil
from importlib import resources
from pathlib import Path

from ..config import ConfigError


def user_profiles() -> Path:
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "snakemake"


def install(name: str, dest: str | None = None, force: bool = False) -> Path:
    source = resources.files("dchag") / "profiles" / name
    if not source.is_dir():
        raise ConfigError(f"no shipped profile named {name!r}")
    target = Path(dest) / name if dest else user_profiles() / name
    if target.exists() and not force:
        raise ConfigError(f"{target} exists; edit it, or pass --force to replace it with the shipped profile")
    tmp = target.with_name(f".{name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    with resources.as_file(source) as src:
        shutil.copytree(src, tmp)
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target / "profile.yaml"
