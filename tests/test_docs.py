"""The docs hold together: every relative link in the README and docs/ reaches a file (and a heading, for a
``#anchor``), and the README's two commands are the ones CI runs."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.M | re.S)
_CODE = re.compile(r"`[^`\n]*`")


def links(page: Path) -> list[str]:
    """The targets of the page's Markdown links, outside code (fenced blocks and inline code)."""
    text = _CODE.sub("", _FENCE.sub("", page.read_text()))
    return [t for t in _LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation but ``-`` and ``_`` dropped, spaces as
    ``-``; a repeated heading gets ``-1``, ``-2``, ..."""
    seen: dict[str, int] = {}
    out = set()
    for line in _FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6} (.*)", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_its_heading(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.name}")
    assert not broken, broken


def test_the_link_check_sees_links_and_anchors() -> None:  # the check itself can fail
    readme = ROOT / "README.md"
    assert "docs/launchers.md" in links(readme)
    assert "shell-references" in anchors(ROOT / "docs" / "launchers.md")
    assert "automodels-template" in anchors(ROOT / "docs" / "slurm.md")


def test_the_readme_commands_are_the_ones_ci_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "```bash\nscripts/setup && .venv/bin/python train.py\n```" in readme
    assert "```bash\n.venv/bin/python -m pytest\n```" in readme
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert ".venv/bin/python -m pytest" in ci and "EXTRAS=$EXTRAS scripts/setup 2>&1 | tee .ci-setup.log" in ci
