"""Every piece of YAML the README and docs/ show (a ```yaml block, or a `key: value` code span
in the text and tables) is YAML a user can paste: it parses, as a mapping (a path holding
`{year}` must be quoted, or YAML reads a flow mapping). The README stays a front door (at
most 150 lines, its Python example runs as written); the manual builds with
`mkdocs build --strict`, its configuration reference lists every key of the schema and its
CLI reference every subcommand and option of the parsers."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from support import REPO

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SPAN = re.compile(r"`([a-z_][a-z_0-9.]*: [^`\n]+)`")  # `key: value` (a one-line YAML mapping)
BLOCK = re.compile(r"```ya?ml\n(.*?)```", re.S)


def snippets() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        text = path.read_text()
        for m in BLOCK.finditer(text):
            found.append((f"{path.name}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)))
        for m in SPAN.finditer(text):
            found.append((f"{path.name}:{text[: m.start()].count(chr(10)) + 1}", m.group(1)))
    return found


SNIPPETS = snippets()


def test_the_docs_show_yaml():
    assert len(SNIPPETS) >= 10, SNIPPETS  # the spans of the input and product tables at least


@pytest.mark.parametrize("where, text", SNIPPETS, ids=[w for w, _ in SNIPPETS])
def test_each_yaml_snippet_parses_as_pasted(where, text):
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError as err:
        pytest.fail(f"{where}: {text!r} is not YAML: {err}")
    assert isinstance(value, dict), f"{where}: {text!r} is {type(value).__name__}, not a mapping"


# -- the README, the site and its generated references ----------------------------------------
def test_the_readme_is_a_front_door():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the manual is docs/"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_readmes_python_example_runs_as_written(tmp_path, monkeypatch):
    """The README's example, on a model folder as `dchag export` writes it and the scene it
    names, at the paths it names: it classifies every pixel as `dchag predict --image` does,
    into memory."""
    import scipy.io
    from support.hsi import hsi_model

    from dchag.hsi import demo
    from dchag.model import folder

    (example,) = _python_blocks((REPO / "README.md").read_text())
    assert len(example.splitlines()) <= 10, example
    cube, labels, _, _ = demo.scene(20, 20, seed=3)
    scene = tmp_path / "resources/demo/hsi/synthetic_scene.mat"
    scene.parent.mkdir(parents=True)
    scipy.io.savemat(scene, {"synthetic_scene": cube})
    scipy.io.savemat(tmp_path / "gt.mat", {"gt": labels})
    section = {"image": str(scene), "labels": str(tmp_path / "gt.mat"), "patch": 3}
    model, _ = hsi_model(
        tmp_path / "work",
        "classification",
        section,
        {"patch_size": 1, "embed_dim": 16, "depth": 1, "num_heads": 2, "aggregation": "linear", "groups": 2},
    )
    folder.save(model, tmp_path / "results/demo/train/classification-dchag/model")
    monkeypatch.chdir(tmp_path)
    names: dict = {}
    exec(compile(example, "README.md", "exec"), names)
    labels_out = names["classes"]["label"].values
    assert labels_out.shape == cube.shape[:2] and labels_out.min() >= 1, labels_out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gt.mat", "resources", "results", "work"]  # nothing left


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The manual as `mkdocs build --strict` builds it (a warning, a broken link or anchor, a
    page missing from the nav fails it)."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _schema_keys(node, found: set[str]) -> set[str]:
    """Every property name anywhere in the schema."""
    if isinstance(node, dict):
        for name, child in node.get("properties", {}).items():
            found.add(name)
            _schema_keys(child, found)
        for key, child in node.items():
            if key != "properties":
                _schema_keys(child, found)
    elif isinstance(node, list):
        for child in node:
            _schema_keys(child, found)
    return found


def test_the_config_reference_lists_every_schema_key(site):
    from dchag.config import schema

    page = (site / "reference" / "config" / "index.html").read_text()
    listed = {html.unescape(k) for k in re.findall(r"<td><code>([^<]+)</code></td>", page)}
    last = {k.rsplit(".", 1)[-1] for k in listed}
    missing = sorted(_schema_keys(schema(), set()) - last)
    assert not missing, f"config reference lacks {missing}"
    for key in ("name", "hsi.classification.patch", "train.runs.<name>.init_from", "era5.regrid.inputs_on_grid"):
        assert key in listed, key
    blank = [
        html.unescape(k)
        for k in re.findall(
            r"<td><code>([^<]+)</code></td>(?:\s*<td>[^<]*(?:<code>[^<]*</code>)?[^<]*</td>){2}\s*<td></td>", page
        )
    ]
    assert not blank, f"keys without a description in the schema: {blank}"
    row = page[page.index("<code>era5.time_step_hours</code>") :].split("</tr>", 1)[0]
    assert "<code>6</code>" in row and "multiple of this" in row, row


def test_the_cli_reference_lists_every_subcommand_and_option(site):
    from dchag.cli import build_parser

    page = html.unescape((site / "reference" / "cli" / "index.html").read_text())
    for name, parser in build_parser()._subparsers._group_actions[0].choices.items():
        assert f"dchag {name}" in page, name
        for action in parser._actions:
            for option in action.option_strings:
                assert option in page, f"dchag {name} {option}"


def test_every_page_is_in_the_site(site):
    pages = sorted(p.stem for p in (REPO / "docs").glob("*.md"))
    built = sorted("index" if p.parent == site else p.parent.name for p in site.glob("**/index.html"))
    assert set(pages) <= set(built), sorted(set(pages) - set(built))
