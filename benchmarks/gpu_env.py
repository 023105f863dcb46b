"""The GPU machine's Python environment, as the GPU check (benchmarks/gpu_check.sh) meets it.

    python benchmarks/gpu_env.py check DIR [--python-version 3.12]
        the wheels in DIR complete the image for the check: one version of each, none the
        image already holds, each installable on CPython 3.12 manylinux x86_64, and every
        dependency of each (markers evaluated for that Python on Linux) and every package
        dchag needs for the check is either carried or in the image; their size with the
        working tree under the device call's 64 MiB
    python benchmarks/gpu_env.py image DEST
        an interpreter at DEST/bin/python that sees only the image's packages of this one
        (linked from its site-packages, torch among them), so a CPU rehearsal misses what the
        GPU machine misses

The image's package list is benchmarks/gpu_image_packages.txt. Imports nothing beyond the
standard library and packaging (both in the image).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tomllib
import venv
import zipfile
from importlib import metadata
from pathlib import Path

from packaging import tags
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
IMAGE = REPO / "benchmarks" / "gpu_image_packages.txt"
# What the device call carries, working tree and wheels together (the device README's limit).
CARRY_LIMIT = 64 * 2**20
# The platforms of the device README's `pip download` command (gpu_wheels.sh uses the same).
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64"]
PLATFORMS += ["manylinux1_x86_64"]
# dchag's runtime dependencies that the check does not carry: the machine's own torch, and
# snakemake (the check runs dchag's commands, not the workflow).
NOT_CARRIED = {"torch", "snakemake"}


def image_packages() -> dict[str, Version | None]:
    """Name -> version (None where KINDS.md gives none) of the image's packages."""
    out = {}
    for line in IMAGE.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            out[canonicalize_name(name)] = Version(version) if version else None
    return out


def _requires(wheel: Path) -> list[Requirement]:
    with zipfile.ZipFile(wheel) as z:
        name = next(n for n in z.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n))
        text = z.read(name).decode()
    head = text.split("\n\n", 1)[0]  # the headers; the long description follows a blank line
    return [
        Requirement(line.split(":", 1)[1].strip()) for line in head.splitlines() if line.startswith("Requires-Dist:")
    ]


def _travelling_bytes() -> int:
    """Tracked and untracked-not-ignored files: what a device call sends besides the wheels."""
    try:
        names = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            check=True,
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return 0  # not a git checkout: the wheels alone are checked against the limit
    return sum((REPO / os.fsdecode(n)).stat().st_size for n in names if n and (REPO / os.fsdecode(n)).is_file())


def check(folder: Path, python_version: str) -> list[str]:
    """Problems with the wheels in ``folder`` as the image's complement; prints what they are."""
    major, minor = (int(x) for x in python_version.split("."))
    supported = set(tags.cpython_tags((major, minor), platforms=PLATFORMS))
    supported |= set(tags.compatible_tags((major, minor), f"cp{major}{minor}", platforms=PLATFORMS))
    image = image_packages()
    problems: list[str] = []
    wheels: dict[str, tuple[Version, Path]] = {}
    for path in sorted(folder.glob("*.whl")):
        name, version, _, wheel_tags = parse_wheel_filename(path.name)
        if name in wheels:
            problems.append(f"{path.name}: a second version of {name} (pip installs one; keep {wheels[name][1].name})")
        elif name in image:
            problems.append(f"{path.name}: the image already has {name}")
        if not wheel_tags & supported:
            problems.append(f"{path.name}: not installable on CPython {python_version} manylinux x86_64")
        wheels[name] = (version, path)
    env = {
        "python_version": python_version,
        "python_full_version": f"{python_version}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": "x86_64",
        "os_name": "posix",
        "extra": "",
    }

    def need(req: Requirement, by: str) -> None:
        name = canonicalize_name(req.name)
        if req.marker is not None and not req.marker.evaluate(env):
            return
        have = wheels[name][0] if name in wheels else image.get(name) if name in image else False
        if have is False:
            problems.append(f"{by} needs {req}: neither carried nor in the image")
        elif have is not None and not req.specifier.contains(have, prereleases=True):
            where = "carried" if name in wheels else "the image's"
            problems.append(f"{by} needs {req}; {where} {name} is {have}")

    for _, path in wheels.values():
        for req in _requires(path):
            need(req, path.name)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for req in map(Requirement, project["dependencies"]):
        if canonicalize_name(req.name) not in NOT_CARRIED:
            need(req, "dchag")
    size = sum(p.stat().st_size for _, p in wheels.values())
    tree = _travelling_bytes()
    for name, (version, path) in wheels.items():
        print(f"  {name}=={version}  {path.stat().st_size / 2**20:.2f} MiB")
    print(
        f"{len(wheels)} wheels, {size / 2**20:.1f} MiB; with the working tree ({tree / 2**20:.1f} MiB) "
        f"{(size + tree) / 2**20:.1f} MiB of the device call's {CARRY_LIMIT // 2**20} MiB"
    )
    if size + tree > CARRY_LIMIT:
        problems.append(f"wheels and working tree are {(size + tree) / 2**20:.1f} MiB, over {CARRY_LIMIT // 2**20} MiB")
    return problems


def make_image(dest: Path) -> Path:
    """An interpreter whose site-packages holds only the image's packages of this one."""
    image = image_packages()
    venv.EnvBuilder(clear=True, symlinks=True, with_pip=False).create(dest)
    site = Path(
        subprocess.run(
            [str(dest / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    ours = {Path(p).resolve() for p in sys.path if p.endswith("site-packages")}
    linked = set()
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        base = Path(dist.locate_file("")).resolve()
        if name not in image or base not in ours or name in linked:
            continue
        linked.add(name)
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops):
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)
    if "torch" not in linked:
        raise SystemExit(f"{sys.executable} has no torch to lend the rehearsal's interpreter")
    # the image's torch comes with its torchrun, which dchag launch-train runs
    torchrun = dest / "bin" / "torchrun"
    torchrun.write_text(
        f"#!{dest / 'bin' / 'python'}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"
    )
    torchrun.chmod(0o755)
    print(
        f"{dest / 'bin' / 'python'}: {len(linked)} of the image's {len(image)} packages ({', '.join(sorted(linked))})"
    )
    return dest / "bin" / "python"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check", help="check a folder of wheels against the image")
    c.add_argument("folder", type=Path)
    c.add_argument("--python-version", default="3.12")
    i = sub.add_parser("image", help="an interpreter holding only the image's packages")
    i.add_argument("dest", type=Path)
    args = p.parse_args(argv)
    if args.cmd == "image":
        make_image(args.dest)
        return
    problems = check(args.folder, args.python_version)
    if problems:
        raise SystemExit(f"{args.folder}: the wheels do not complete the GPU image:\n  " + "\n  ".join(problems))


if __name__ == "__main__":
    main()
