"""The README stays a front door: short, its test command the one .ci/run runs, its links landing on GitHub too.

The docs site itself is checked by ``mkdocs build --strict`` in .ci/run's docs phase; these checks cover
what MkDocs does not see, the two files outside ``docs/``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_COMMAND = "python -m pytest -q -ra"
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: lower case, punctuation gone, each space a hyphen."""
    headings = re.findall(r"^#+ (.+)$", _FENCE.sub("", markdown), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", heading).strip().lower().replace(" ", "-") for heading in headings}


def test_the_readme_is_short_and_names_the_test_command_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "README.md is the front door: move the reference into docs/"
    assert TEST_COMMAND in readme
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert f'"${{PYTHON}}" {TEST_COMMAND.removeprefix("python ")}' in ci_run, ".ci/run must run the README's test command"


@pytest.mark.parametrize("name", ["README.md", "SECURITY.md"])
def test_relative_links_reach_a_file_and_heading(name: str) -> None:
    text = (ROOT / name).read_text()
    broken = []
    for target in _LINK.findall(_FENCE.sub("", text)):
        if re.match(r"[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = ROOT / path if path else ROOT / name
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text()):
            broken.append(target)
    assert not broken, f"{name} links to what does not exist: {broken}"
