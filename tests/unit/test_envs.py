"""The conda environments of the rules (envs/, used with --software-deployment-method
conda) agree with pyproject.toml: every runtime dependency a rule family needs is in its
environment, at a version pyproject.toml accepts."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.version import Version
from support import REPO

# conda-forge names of PyPI packages
CONDA_TO_PYPI = {
    "pytorch": "torch",
    "dask-core": "dask",
    "matplotlib-base": "matplotlib",
    "python-eccodes": "eccodes",  # ecCodes' Python interface (the PyPI wheel brings the library too)
}
# Packages that only conda-forge has (so pyproject.toml cannot name them).
CONDA_ONLY = {"esmpy", "xesmf"}  # ESMF's Python interface, and xesmf, which cannot import without it
# What a rule family does not import (its rules run `dchag` subcommands that do not need it);
# snakemake itself runs outside the rules' environments.
NOT_NEEDED = {
    "preprocess.yaml": {"snakemake", "torch", "tensorboard", "matplotlib", "safetensors"},
    "train.yaml": {"snakemake"},
}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> dict[str, Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    reqs += [
        Requirement(r) for extra in ("download", "grib", "geotiff") for r in project["optional-dependencies"][extra]
    ]
    return {_norm(r.name): r for r in reqs}


def _env(path: Path) -> dict[str, str | None]:
    out = {}
    for dep in yaml.safe_load(path.read_text())["dependencies"]:
        name, _, version = str(dep).partition("=")
        out[_norm(CONDA_TO_PYPI.get(name, name))] = version or None
    return out


def test_every_rule_env_is_checked():
    used = {
        m
        for f in (REPO / "workflow" / "rules").glob("*.smk")
        for m in re.findall(r'"\.\./\.\./envs/([^"]+)"', f.read_text())
    }
    assert used == set(NOT_NEEDED) == {p.name for p in (REPO / "envs").glob("*.yaml")}


@pytest.mark.parametrize("env", sorted(NOT_NEEDED))
def test_env_has_the_runtime_dependencies_at_versions_pyproject_accepts(env):
    reqs = _requirements()
    pins = _env(REPO / "envs" / env)
    runtime = {
        _norm(Requirement(r).name)
        for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    }
    missing = sorted(runtime - set(pins) - {_norm(n) for n in NOT_NEEDED[env]})
    assert not missing, f"envs/{env} lacks {missing}"
    for name, version in pins.items():
        if name == "python" or name in CONDA_ONLY:
            continue
        assert name in reqs, f"envs/{env}: {name} is not a dependency in pyproject.toml"
        assert version, f"envs/{env}: {name} has no pinned version"
        # a conda pin "2.3" means any 2.3.x: check its lowest release
        assert reqs[name].specifier.contains(Version(version), prereleases=True), (
            f"envs/{env}: {name}={version} is outside pyproject.toml's {reqs[name]}"
        )
