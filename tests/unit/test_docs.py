"""Every piece of YAML the README and docs/ show (a ```yaml block, or a `key: value` code span
in the text and tables) is YAML a user can paste: it parses, as a mapping (a path holding
`{year}` must be quoted, or YAML reads a flow mapping)."""

from __future__ import annotations

import re

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
