"""The docs hold together: every relative link in the README and docs/ reaches a file (and a heading, for a
``#anchor``), and the README's two commands are the ones CI runs."""

from __future__ import annotations

import os
import re
import shlex
import typing as tp
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


# ----------------------------------------------------------------------------------------------- README commands


def readme_commands() -> list[list[str]]:
    """Every ``python train.py ...`` and ``automodel-hydra ...`` command of the README's bash blocks, as words
    (comments dropped), without the program: ``["train.py", ...]`` or ``["automodel-hydra", ...]``."""
    out = []
    for block in re.findall(r"^```bash\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S):
        for line in block.splitlines():
            words = shlex.split(line, comments=True)
            if words[:2] == ["python", "train.py"]:
                out.append(["train.py", *words[2:]])
            elif words[:1] == ["automodel-hydra"]:
                out.append(words)
    return out


#: The commands that operate past runs (their DIR/JOB are placeholders for a run of the reader's).
AFTER_LAUNCH = ("runs", "status", "logs", "cancel", "resume", "report")


def _schema_has(key: str) -> bool:
    """Whether the dotted ``key`` is a field of the schema (a mapping field takes any key below it)."""
    import dataclasses

    from automodel_hydra import config

    node: tp.Any = config.TrainConfig
    for part in key.split("."):
        if not dataclasses.is_dataclass(node):
            return True  # inside a Dict / Any field: any key
        hints = tp.get_type_hints(node)
        if part not in hints:
            return False
        node = next((a for a in (hints[part], *tp.get_args(hints[part])) if dataclasses.is_dataclass(a)),
                    hints[part])
    return True


def test_every_readme_command_names_what_exists() -> None:
    """Each README command runs as written from the repository root: a config file it names exists (AutoModel's
    CLI shapes are read by the real ``argv.from_automodel_cli``), each group choice names a file of ``conf/``, each
    key is the schema's (or, for a user's file, the file's), and no word is a flag neither Hydra nor AutoModel's
    CLI has."""
    import yaml

    from automodel_hydra import argv

    commands = readme_commands()
    assert len(commands) > 20 and any("tests/data/automodel/llama3_2_1b_squad.yaml" in c for c in commands)
    for words in commands:
        if words[0] == "automodel-hydra":
            if words[1] in AFTER_LAUNCH:
                continue
            words = ["train.py", *argv.from_automodel_cli(words[1:])]  # NoConfigFile for a file that is not there
        line = argv.parse(words[1:])
        assert line.usage_problem() is None, words
        file = argv.user_file(words[1:])
        own = yaml.safe_load(file.read_text()) if file is not None else {}
        for word in line.words:
            assert not word.startswith("-"), (words, word)  # no flag but Hydra's
            key, _, value = word.lstrip("+~").partition("=")
            if key in argv.GROUPS:
                assert (ROOT / "conf" / key / f"{value}.yaml").is_file(), (words, word)
            elif not key.startswith("hydra"):
                assert _schema_has(key) or _has(own, key), (words, key)


def _has(mapping: tp.Any, key: str) -> bool:
    for part in key.split("."):
        if not isinstance(mapping, dict) or part not in mapping:
            return False
        mapping = mapping[part]
    return True


@pytest.mark.slow  # one Hydra compose per command, in a subprocess (~2 s each)
def test_every_readme_single_run_composes_as_written(tmp_path: Path) -> None:
    """Each README command of one run (not a sweep, not ``--help``) composes its config as written: run with
    ``--cfg job`` added (print the config, start nothing) from the repository root, it exits 0."""
    import subprocess
    import sys

    ran = 0
    for words in readme_commands():
        if words[0] == "automodel-hydra" and words[1] in AFTER_LAUNCH or "-m" in words or "--help" in words:
            continue
        program = [str(ROOT / "train.py")] if words[0] == "train.py" else ["-m", "automodel_hydra.cli"]
        done = subprocess.run([sys.executable, *program, *words[1:], "--cfg", "job"], cwd=ROOT, text=True,
                              capture_output=True, timeout=300, env={**os.environ, "HF_TOKEN": "unused"})
        assert done.returncode == 0, (words, done.stdout[-2000:], done.stderr[-2000:])
        ran += 1
    assert ran >= 12
