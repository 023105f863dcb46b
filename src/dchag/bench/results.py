"""What a benchmark records: the exact command, the machine, the interpreter and packages, and
its results written as JSON beside a Markdown report."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]  # the checkout (src/dchag/bench/...)


def command(argv: list[str] | None = None) -> str:
    """The command that ran the benchmark, as it was typed."""
    return "python " + " ".join(sys.argv if argv is None else argv)


def machine() -> str:
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return f"{platform.node()} {platform.machine()}, {os.cpu_count()} cores, {mem:.0f} GiB"


def meta(argv: list[str] | None = None, **extra) -> dict:
    return {"command": command(argv), "machine": machine(), "python": platform.python_version(), **extra}


def write(out: Path, doc: dict, report: str | None = None) -> None:
    """``out``.json (``doc``) and, given, ``out``.md (``report``)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(doc, indent=1))
    if report is not None:
        out.with_suffix(".md").write_text(report)


def environment() -> dict:
    """The interpreter and packages this process runs with, and dchag's requirements they miss."""
    import tomllib
    from importlib import metadata

    import torch
    from packaging.requirements import Requirement

    from ..provenance import package_versions

    env = {"python": platform.python_version(), "executable": sys.executable, "packages": package_versions()}
    if torch.cuda.is_available():
        env["cuda"] = torch.version.cuda
        env["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        env["gpus"] = torch.cuda.device_count()
    env["unmet"] = []
    for line in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]:
        req = Requirement(line)
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            version = None
        env["packages"].setdefault(req.name, version)
        if req.name != "snakemake" and (version is None or not req.specifier.contains(version, prereleases=True)):
            env["unmet"].append(f"{req} ({version or 'absent'})")
    return env
