"""Code snapshots (automodel_hydra/snapshot.py): what is copied, what is left out, what the record says, and the
lines of the Slurm script that make the ranks import the copy. Real git, real files; no cluster."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from automodel_hydra import call, snapshot
from automodel_hydra.backends import slurm
from automodel_hydra.plan import JobSpec
from automodel_hydra.snapshot import SnapshotError


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repo with a package, an ignored data file and one commit."""
    root = tmp_path / "repo"
    (root / "my_pkg").mkdir(parents=True)
    (root / "my_pkg" / "__init__.py").write_text("")
    (root / "my_pkg" / "train.py").write_text("VERSION = 1\n")
    (root / "gone.py").write_text("x = 1\n")
    (root / ".gitignore").write_text("*.bin\n")
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "commit", "-q", "-m", "first")
    (root / "data.bin").write_bytes(b"\0" * 100)
    return root


def test_git_snapshot_is_the_work_tree_with_its_changes_and_new_files(repo: Path, tmp_path: Path) -> None:
    (repo / "my_pkg" / "train.py").write_text("VERSION = 2  # not committed\n")
    (repo / "my_pkg" / "new.py").write_text("NEW = True\n")  # untracked, not ignored
    (repo / "gone.py").unlink()  # tracked, deleted in the work tree
    run = repo / "outputs" / "2026-01-01" / "00-00-00"  # a Hydra run dir inside the repo, not ignored
    (run / ".hydra").mkdir(parents=True)
    (run / ".hydra" / "config.yaml").write_text("a: 1\n")
    (run / "model.pt").write_bytes(b"weights")
    source = snapshot.find("auto", repo / "my_pkg", repo, 10)
    assert source is not None and source.kind == "git" and source.root == repo.resolve()
    assert sorted(source.files) == [".gitignore", "my_pkg/__init__.py", "my_pkg/new.py", "my_pkg/train.py"]
    assert source.commit == git(repo, "rev-parse", "HEAD") and source.dirty is True
    code = tmp_path / "run" / "launch" / "code"
    snapshot.write(source, code)
    assert (code / "src" / "my_pkg" / "train.py").read_text() == "VERSION = 2  # not committed\n"
    assert (code / "src" / "my_pkg" / "new.py").exists()
    assert not (code / "src" / "data.bin").exists() and not (code / "src" / "gone.py").exists()
    assert not (code / "src" / "outputs").exists()
    record = source.record(code)
    assert record["commit"] == source.commit and record["dirty"] is True and record["snapshot"] == "git"
    # the copy stays what it was when the source changes later
    (repo / "my_pkg" / "train.py").write_text("VERSION = 3\n")
    assert (code / "src" / "my_pkg" / "train.py").read_text().startswith("VERSION = 2")


def test_clean_tree_is_recorded_clean_and_a_second_snapshot_replaces_the_first(repo: Path, tmp_path: Path) -> None:
    source = snapshot.find("git", repo, repo, 10)
    assert source is not None and source.dirty is False
    code = tmp_path / "out" / "code"
    code.parent.mkdir()
    snapshot.write(source, code)
    (code / "src" / "stale.py").write_text("")
    snapshot.write(source, code)
    assert not (code / "src" / "stale.py").exists()
    assert [p.name for p in code.parent.iterdir()] == ["code"]  # no temporary dir left beside it


def test_a_dir_outside_git_is_copied_without_hidden_files_caches_and_run_dirs(tmp_path: Path) -> None:
    work = tmp_path / "work"
    (work / "pkg" / "__pycache__").mkdir(parents=True)
    (work / "pkg" / "mod.py").write_text("A = 1\n")
    (work / "pkg" / "__pycache__" / "mod.cpython-311.pyc").write_bytes(b"")
    (work / ".env").write_text("SECRET=1\n")
    (work / ".venv" / "lib").mkdir(parents=True)
    (work / "multirun" / "S" / "launch").mkdir(parents=True)
    (work / "multirun" / "S" / "launch" / "manifest.json").write_text("{}")
    source = snapshot.find("auto", work, work, 10)
    assert source is not None and source.kind == "copy" and source.commit is None and source.dirty is None
    assert list(source.files) == ["pkg/mod.py"]
    with pytest.raises(SnapshotError, match=r"slurm.snapshot='git' is invalid: a git work tree: .* use copy"):
        snapshot.find("git", work, work, 10)
    assert snapshot.find("none", work, work, 10) is None


def test_a_snapshot_over_the_limit_is_one_line_naming_the_field(tmp_path: Path) -> None:
    work = tmp_path / "big"
    work.mkdir()
    (work / "data.csv").write_bytes(b"x" * (3 * 2**20))
    with pytest.raises(SnapshotError) as err:
        snapshot.find("copy", work, work, 2)
    text = str(err.value)
    assert "\n" not in text and "slurm.snapshot_max_mb=2" in text and str(work) in text


def test_this_project_goes_beside_a_root_that_does_not_hold_it(repo: Path, tmp_path: Path) -> None:
    project = Path(slurm.__file__).resolve().parents[2]
    source = snapshot.find("git", repo, project, 10)
    assert source is not None and not source.project_inside
    code = tmp_path / "code"
    assert source.pythonpath(code) == [str(code / "src"), str(code / "lib")]
    snapshot.write(source, code)
    assert (code / "lib" / "automodel_hydra" / "worker.py").read_bytes() == \
        (project / "automodel_hydra" / "worker.py").read_bytes()
    assert not list((code / "lib").rglob("__pycache__"))


def test_slurm_script_imports_the_snapshot_of_the_sweep(repo: Path, tmp_path: Path, monkeypatch) -> None:
    """A sweep's jobs share one snapshot (the sweep dir's): one array, every script pointing at that copy."""
    from tests.test_slurm_plan import load

    monkeypatch.chdir(repo / "my_pkg")
    sweep = tmp_path / "S"
    cfgs = [load([f"seed={i}"], sweep / str(i)) for i in range(3)]
    backend = slurm.Slurm()
    facts = slurm.Facts(snapshots=snapshot.find_each(cfgs))
    code = sweep / "launch" / "code"
    plans = [backend.plan(cfg, JobSpec(sweep / str(i), "train", job_num=i, code_dir=code), facts)
             for i, cfg in enumerate(cfgs)]
    (batch,) = backend.batches(plans, sweep, facts)
    array = batch.files[sweep / "launch" / "sbatch.sh"]
    for text in [array, plans[0].files["sbatch.sh"]]:
        assert f"export PYTHONPATH={code}/src/my_pkg:{code}/lib${{PYTHONPATH:+:$PYTHONPATH}}" in text
        assert "export PYTHONSAFEPATH=1" in text and f"AUTOMODEL_CODE_SRC={code}/src" in text
        assert git(repo, "rev-parse", "HEAD")[:12] in text
    none = slurm.Facts(snapshots=snapshot.find_each([load(["slurm.snapshot=none"], sweep / "0")]))
    plain = backend.plan(load(["slurm.snapshot=none"], sweep / "0"), JobSpec(sweep / "0", "train", code_dir=code),
                         none)
    assert "PYTHONSAFEPATH" not in plain.files["sbatch.sh"] and str(code) not in plain.files["sbatch.sh"]


@pytest.mark.parametrize("bad", ["always", ""])
def test_bad_snapshot_mode_is_refused_naming_the_field(bad: str, tmp_path: Path) -> None:
    from automodel_hydra.schema import ConfigError
    from tests.test_slurm_plan import load

    with pytest.raises(ConfigError, match=r"slurm.snapshot=.* one of auto, git, copy, none"):
        load([f"slurm.snapshot={bad!r}" if bad else "slurm.snapshot=''"], tmp_path)


def test_a_call_job_unpickles_against_the_snapshot(tmp_path: Path) -> None:
    src = tmp_path / "code" / "src"
    (src / "app").mkdir(parents=True)
    env = {"AUTOMODEL_CODE_ROOT": "/home/u/repo", "AUTOMODEL_CODE_SRC": str(src)}
    paths = ["/home/u/repo/app", "/home/u/repo/.venv/lib/site-packages", "/usr/lib/python3.11"]
    assert call._snapshot_paths(paths, env) == [str(src / "app"), *paths[1:]]
    assert call._snapshot_paths(paths, {}) == paths
    assert os.path.isdir(src / "app")


def with_submodule(repo: Path, tmp_path: Path) -> Path:
    """``repo`` with ``third_party/mylib`` as a git submodule (a second repo holding ``mylib/__init__.py``) and an
    untracked file in the submodule; returns the submodule's dir."""
    lib = tmp_path / "mylib-origin"
    (lib / "mylib").mkdir(parents=True)
    (lib / "mylib" / "__init__.py").write_text("NAME = 'mylib'\n")
    git(lib, "init", "-q")
    git(lib, "add", ".")
    git(lib, "commit", "-q", "-m", "lib")
    git(repo, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "third_party/mylib")
    git(repo, "commit", "-q", "-m", "submodule")
    sub = repo / "third_party" / "mylib"
    (sub / "mylib" / "new.py").write_text("X = 1\n")  # untracked, not ignored: as the work tree's own new files
    return sub


def test_a_git_snapshot_holds_the_submodules_files(repo: Path, tmp_path: Path) -> None:
    sub = with_submodule(repo, tmp_path)
    source = snapshot.find("git", repo, repo, 10)
    assert source is not None
    assert {"third_party/mylib/mylib/__init__.py", "third_party/mylib/mylib/new.py"} <= set(source.files)
    assert dict(source.submodules) == {"third_party/mylib": git(sub, "rev-parse", "HEAD")}
    assert source.record(tmp_path / "code")["submodules"] == dict(source.submodules)
    snapshot.write(source, tmp_path / "code")
    assert (tmp_path / "code" / "src" / "third_party" / "mylib" / "mylib" / "__init__.py").is_file()


def test_a_module_imported_here_that_the_snapshot_lacks_is_one_line(repo: Path, monkeypatch) -> None:
    """The recipe was imported at plan time; a module it imported from the repo that git ignores would be missing
    on the ranks, which import the copy: refused before anything is submitted, naming the file and the way out."""
    import types

    (repo / "my_pkg" / "_version.bin").write_text("")  # (*.bin is ignored by the fixture's .gitignore)
    generated = types.ModuleType("my_pkg._version")
    generated.__file__ = str(repo / "my_pkg" / "_version.bin")
    monkeypatch.setitem(sys.modules, "my_pkg._version", generated)
    tracked = types.ModuleType("my_pkg.train")
    tracked.__file__ = str(repo / "my_pkg" / "train.py")
    monkeypatch.setitem(sys.modules, "my_pkg.train", tracked)
    with pytest.raises(SnapshotError) as e:
        snapshot.find("auto", repo, repo, 10)
    text = str(e.value)
    assert "\n" not in text and text.startswith("slurm.snapshot='git' is invalid")
    assert "lacks my_pkg/_version.bin (module my_pkg._version, imported here)" in text
    assert "git add it" in text and "copy" in text and "none" in text
    source = snapshot.find("copy", repo, repo, 10)  # the way out the line names: copy takes ignored files too
    assert source is not None and "my_pkg/_version.bin" in source.files


def test_the_environment_inside_a_repo_is_not_the_snapshots_code(tmp_path: Path) -> None:
    """A virtualenv inside the repo (``repo/.venv``) holds installed packages, not the repo's code: they are
    imported where they are on the ranks, so the snapshot need not hold them."""
    import types

    root = tmp_path / "r"
    root.mkdir()
    source = snapshot.Source("copy", root, root, root, files=("a.py",))
    env = types.ModuleType("torch")
    env.__file__ = os.path.join(sys.prefix, "lib", "torch", "__init__.py")
    code = types.ModuleType("b")
    code.__file__ = str(root / "b.py")
    assert snapshot.missing_modules(source, {"torch": env, "b": code, "__main__": code}) == [("b", "b.py")]
