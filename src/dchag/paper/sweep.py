"""The paper's experiments as sweep points, from config ``paper``.

A sweep is a list of grids; a grid maps point keys to a value or a list of values, and every
combination of the lists is one point (their cartesian product). Unset keys come from
``paper.defaults``. A point is one benchmark job: ``tp x dp`` processes (GPUs), on
``ceil(tp x dp / paper.gpus_per_node)`` nodes. Points are named by their settings, so two
figures that need the same measurement share one job.

``stands_for`` (optional, per grid) names the paper setting a scaled-down point stands for
(width / channels / tp): the figures look up the published value and the cost model's
prediction there. Without it a point stands for itself (the GPU config).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import asdict, dataclass, replace

from ..config import ConfigError
from ..vocabulary import FRONT_VARIANTS, MODEL_VARIANTS

FIGURES = ("front_share", "tokenization", "tree", "full_models", "tp_scaling")
# The front end alone (tokenizer and aggregation, no ViT; dchag.vocabulary.FRONT_VARIANTS): the
# baseline's tokenization, + its aggregation, D-CHAG's distributed tokenization, and distributed
# tokenization followed by an AllGather of all tokens (the ablation that shows why partial
# aggregation precedes the gather).
VARIANTS = MODEL_VARIANTS + FRONT_VARIANTS
KEYS = (
    "width",
    "depth",
    "heads",
    "channels",
    "image",
    "patch",
    "batch",
    "precision",
    "tp",
    "dp",
    "variant",
    "tree",
    "activation_checkpointing",
    "fused_front_end",
)
STANDS_FOR_KEYS = ("width", "channels", "tp")


@dataclass(frozen=True)
class Point:
    width: int
    depth: int
    heads: int
    channels: int
    image: tuple[int, int]
    patch: int
    batch: int
    precision: str
    tp: int
    dp: int
    variant: str
    tree: int
    activation_checkpointing: bool
    fused_front_end: bool = False
    stands_for: tuple[int, int, int] | None = None  # (width, channels, tp) at the paper's scale

    @property
    def name(self) -> str:
        v = self.variant.replace("+", "_plus_")
        return (
            f"w{self.width}-d{self.depth}-h{self.heads}-c{self.channels}-i{self.image[0]}x{self.image[1]}-p{self.patch}"
            f"-b{self.batch}-{self.precision}-tp{self.tp}-dp{self.dp}-{v}-tree{self.tree}"
            f"{'-ac' if self.activation_checkpointing else ''}{'-fused' if self.fused_front_end else ''}"
        )

    @property
    def series(self) -> str:
        """The series a figure draws this point in: its variant, fused or not."""
        return f"{self.variant}+fused" if self.fused_front_end else self.variant

    @property
    def gpus(self) -> int:
        return self.tp * self.dp

    @property
    def paper_setting(self) -> tuple[int, int, int]:
        """(width, channels, tp) this point stands for at the paper's scale."""
        return self.stands_for or (self.width, self.channels, self.tp)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["image"] = list(self.image)
        d["stands_for"] = list(self.stands_for) if self.stands_for else None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Point:
        d = dict(d)
        d["image"] = tuple(d["image"])
        d["stands_for"] = tuple(d["stands_for"]) if d.get("stands_for") else None
        return cls(**d)


def _check(point: Point, where: str) -> None:
    if point.variant not in VARIANTS:
        raise ConfigError(f"config key '{where}.variant': {point.variant!r}, expected one of {', '.join(VARIANTS)}")
    if point.width % point.heads:
        raise ConfigError(f"config key '{where}': width {point.width} is not divisible by heads {point.heads}")
    if point.heads % point.tp:
        raise ConfigError(f"config key '{where}': heads {point.heads} do not split over tp {point.tp}")
    if any(s % point.patch for s in point.image):
        raise ConfigError(f"config key '{where}': image {list(point.image)} is not divisible by patch {point.patch}")
    if point.variant.startswith("dist-") or point.variant.startswith("dchag"):
        if point.channels < point.tp:
            raise ConfigError(
                f"config key '{where}': {point.channels} channels cannot give each of tp {point.tp} ranks one"
            )
    if point.variant == "dist-tokenize+gather-all" and point.channels % point.tp:
        raise ConfigError(
            f"config key '{where}': the all-token gather needs channels ({point.channels}) divisible by tp ({point.tp})"
        )
    if point.tree and (not point.variant.startswith("dchag") or (point.channels // point.tp) % point.tree):
        raise ConfigError(
            f"config key '{where}.tree': {point.tree} needs a D-CHAG variant whose channels per rank "
            f"({point.channels // point.tp}) divide into {point.tree} sub-groups"
        )
    if point.fused_front_end and point.variant in FRONT_VARIANTS:
        raise ConfigError(
            f"config key '{where}.fused_front_end': the front-end variant {point.variant} measures the channel "
            f"tokens; the fused front end is a whole model's (variant one of {', '.join(MODEL_VARIANTS)})"
        )
    if point.fused_front_end and point.variant == "baseline" and point.tp > 1:
        raise ConfigError(
            f"config key '{where}.fused_front_end': the baseline under tp {point.tp} splits its aggregation's "
            f"heads over the ranks and forms the tokens either way; fuse it at tp 1 or a D-CHAG variant"
        )
    if point.dp > 1 and point.variant in FRONT_VARIANTS:
        raise ConfigError(
            f"config key '{where}.dp': the front-end variants ({point.variant}) run on one TP group (dp 1)"
        )


def expand(grid: dict, defaults: dict, where: str) -> list[Point]:
    """Every point of one grid (lists expand as a cartesian product)."""
    grid = dict(grid)
    stands = grid.pop("stands_for", None)
    unknown = set(grid) - set(KEYS)
    if unknown:
        raise ConfigError(f"config key '{where}': unknown point keys {sorted(unknown)} (expected {', '.join(KEYS)})")
    values = {}
    for key in KEYS:
        v = grid.get(key, defaults.get(key))
        if v is None:
            raise ConfigError(f"config key '{where}.{key}': not set here or in paper.defaults")
        # an image is a pair; a list of pairs sweeps it
        if key == "image":
            values[key] = [tuple(i) for i in v] if v and isinstance(v[0], list) else [tuple(v)]
        else:
            values[key] = v if isinstance(v, list) else [v]
    points = []
    for combo in itertools.product(*(values[k] for k in KEYS)):
        p = Point(**dict(zip(KEYS, combo)))
        if stands:
            missing = set(STANDS_FOR_KEYS) - set(stands)
            if missing:
                raise ConfigError(
                    f"config key '{where}.stands_for': needs {', '.join(STANDS_FOR_KEYS)} (missing {sorted(missing)})"
                )
            # a swept key in stands_for is a list matched position by position with the grid's list
            setting = []
            for k in STANDS_FOR_KEYS:
                s = stands[k]
                if isinstance(s, list):
                    if not isinstance(grid.get(k), list) or len(grid[k]) != len(s):
                        raise ConfigError(
                            f"config key '{where}.stands_for.{k}': a list must pair with the grid's list of "
                            f"the same length"
                        )
                    s = s[grid[k].index(getattr(p, k))]
                setting.append(int(s))
            p = replace(p, stands_for=tuple(setting))
        _check(p, where)
        points.append(p)
    return points


def sweeps(paper: dict) -> dict[str, list[Point]]:
    """figure -> its points, in config order (duplicates removed)."""
    out = {}
    for figure in FIGURES:
        pts: list[Point] = []
        for i, grid in enumerate(paper["sweeps"].get(figure, [])):
            for p in expand(grid, paper["defaults"], f"paper.sweeps.{figure}[{i}]"):
                if p not in pts:
                    pts.append(p)
        out[figure] = pts
    return out


def all_points(paper: dict) -> dict[str, Point]:
    """name -> point over every sweep (a point two figures need is one job)."""
    points: dict[str, Point] = {}
    for pts in sweeps(paper).values():
        for p in pts:
            old = points.setdefault(p.name, p)
            if old != p:  # same settings, different stands_for
                raise ConfigError(
                    f"paper sweeps: point {p.name} stands for two paper settings ({old.stands_for} and "
                    f"{p.stands_for}); give it one"
                )
    return points


@dataclass(frozen=True)
class Resources:
    gpus: int
    nodes: int
    per_node: int


def resources(point: Point, gpus_per_node: int) -> Resources:
    """GPUs = tp x dp, on as few nodes as hold them (a TP group never spans nodes unless
    tp > gpus_per_node)."""
    nodes = math.ceil(point.gpus / gpus_per_node)
    if point.gpus % nodes:
        raise ConfigError(
            f"paper point {point.name}: {point.gpus} GPUs do not spread evenly over {nodes} nodes of "
            f"{gpus_per_node} (paper.gpus_per_node)"
        )
    return Resources(point.gpus, nodes, point.gpus // nodes)


def point_config(name: str, paper: dict, point: Point) -> dict:
    """A config holding only ``point`` (and the measurement settings): what one point's job
    reads, so its job reruns when this point or how it is measured changes, not another's."""
    grid = {k: (list(v) if isinstance(v, tuple) else v) for k, v in point.to_dict().items() if k != "stands_for"}
    if point.stands_for:
        grid["stands_for"] = dict(zip(STANDS_FOR_KEYS, point.stands_for))
    keep = ("gpus_per_node", "steps", "warmup", "threads_per_rank")
    figure = next(f for f, pts in sweeps(paper).items() if point in pts)
    return {"name": name, "paper": {**{k: paper[k] for k in keep}, "sweeps": {figure: [grid]}}}


def paper_section(config: dict, source: str) -> dict:
    """The validated config's paper section (defaults filled)."""
    from ..config import settings

    paper = settings(config).paper
    if paper is None:
        raise ConfigError(f"{source}: has no 'paper' section (the paper's sweeps; see config/paper.yaml)")
    return paper


def launch_point(config: dict, name: str, output: str, threads_per_rank: int | None, source: str) -> None:
    """Measure sweep point ``name`` of the config under torchrun (tp x dp processes on this
    node): ``dchag.paper.bench`` on every rank, the result JSON at ``output``."""
    import json

    from ..train.launch import launch

    paper = paper_section(config, source)
    points = all_points(paper)
    if name not in points:
        raise ConfigError(
            f"{source}: no paper sweep point named {name!r} "
            f"(the config's points: {', '.join(sorted(points)) or 'none'})"
        )
    point = points[name]
    bench_args = [
        "--point",
        json.dumps(point.to_dict()),
        "--steps",
        str(paper["steps"]),
        "--warmup",
        str(paper["warmup"]),
        "--output",
        output,
    ]
    launch(
        resources(point, paper["gpus_per_node"]).per_node,
        0,
        bench_args,
        threads_per_rank or paper["threads_per_rank"],
        module=("dchag.paper.bench",),
        preload=("dchag.paper.bench",),
    )
