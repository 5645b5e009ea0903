"""The README stays a front door: short, naming the test command .ci/run runs, links that land.

The docs site itself is checked by ``mkdocs build --strict`` in .ci/run's docs phase; these checks
cover what MkDocs does not see: README.md and SECURITY.md, outside ``docs/``, read on GitHub.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_COMMAND = "python -m pytest -q -ra -n 2 --dist loadfile"
_LINK = re.compile(r"\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of ``markdown``: lower case, no punctuation."""
    headings = re.findall(r"^#+ (.+)$", _FENCE.sub("", markdown), re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", text).strip().lower().replace(" ", "-") for text in headings}


def test_the_readme_is_short_and_names_the_test_command_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200, "README.md is a front door: the reference goes in docs/"
    assert TEST_COMMAND in readme
    ci_run = (ROOT / ".ci" / "run").read_text()
    runs = f'"${{PYTHON}}" {TEST_COMMAND.removeprefix("python ")}'
    assert runs in ci_run, ".ci/run must run the README's test command"


def _lands(target: str, page: Path) -> bool:
    path, _, anchor = target.partition("#")
    file = ROOT / path if path else page
    if not file.exists():
        return False
    return not anchor or file.suffix != ".md" or anchor in github_anchors(file.read_text())


@pytest.mark.parametrize("name", ["README.md", "SECURITY.md"])
def test_relative_links_reach_a_file_and_heading(name: str) -> None:
    links = _LINK.findall(_FENCE.sub("", (ROOT / name).read_text()))
    relative = [link for link in links if not re.match(r"[a-z]+:", link)]
    broken = [link for link in relative if not _lands(link, ROOT / name)]
    assert not broken, f"{name} links to what does not exist: {broken}"
