"""The house's shape: no import circle between the package's files, and the rank side loads no launcher.

The import graph is read from the source (``ast``), not from an interpreter, so a circle that only a function-level
import closes is caught too: every ``import`` / ``from ... import`` anywhere in a module counts, function bodies
included, except those under ``if TYPE_CHECKING:`` (they never run; mypy reads type-only circles fine).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
import typing as tp
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("automodel_hydra", "hydra_plugins/automodel_hydra_launcher")
#: The launcher backends' modules: the ranks must load none of them (the section schemas, ``*_config``, are pure).
BACKEND_MODULES = ("automodel_hydra.backends.interactive", "automodel_hydra.backends.slurm",
                   "automodel_hydra.backends.slurm_script", "automodel_hydra.backends.slurm_states",
                   "automodel_hydra.backends.skypilot", "automodel_hydra.backends.skypilot_env",
                   "automodel_hydra.backends.skypilot_sdk")
#: Third-party packages only a launcher or the CLI needs.
LAUNCHER_PACKAGES = ("sky", "submitit", "matplotlib")


def _modules() -> dict[str, Path]:
    mods = {}
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            rel = f.relative_to(ROOT).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            mods[".".join(parts)] = f
    return mods


def _type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING") or (
        isinstance(t, ast.Name) and t.id == "TYPE_CHECKING")


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports (function-level imports included, TYPE_CHECKING ones not)."""
    mods = _modules()
    edges: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        tree = ast.parse(path.read_text())
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking(node)
                for n in ast.walk(node)}
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                names = [base, *(f"{base}.{a.name}" for a in node.names)]  # `from pkg import module`
            else:
                continue
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    edges[mod].add(name)
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_between_the_package_files() -> None:
    edges = import_graph()
    assert "automodel_hydra.config" in edges and "automodel_hydra.backends.slurm" in edges  # the graph was read
    assert cycles(edges) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_config_imports_schemas_never_backends() -> None:
    edges = import_graph()
    for mod in ("automodel_hydra.config", "automodel_hydra.worker", "automodel_hydra.bootstrap",
                *(m for m in edges if m.endswith("_config") and ".backends." in m)):
        assert not edges[mod] & set(BACKEND_MODULES), mod


_PROBE = """
import json, sys
from pathlib import Path


def probe(cfg, dist, should_stop):
    Path(cfg.probe.out).write_text(json.dumps(sorted(sys.modules)))
    return {"loss": 0.0}
"""


def _loaded(modules: list[str]) -> list[str]:
    return [m for m in modules if m in BACKEND_MODULES or m.split(".")[0] in LAUNCHER_PACKAGES]


def test_what_the_worker_imports_loads_no_launcher(tmp_path: Path) -> None:
    """The worker's own imports and the config pipeline it reads ``launch/job.yaml`` with (fast: no torch)."""
    code = textwrap.dedent("""
        import json, sys
        from automodel_hydra import worker, config, recipes, bootstrap
        config.load_rank({"recipe": "m:f", "output_dir": "/tmp/x"})
        print(json.dumps(sorted(sys.modules)))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    modules = json.loads(out.stdout)
    assert _loaded(modules) == []
    assert "automodel_hydra.config" in modules  # the probe saw what the config pipeline loaded


@pytest.mark.slow
def test_a_rank_loads_no_launcher(tmp_path: Path) -> None:
    """A real ``python -m automodel_hydra.worker launch/job.yaml`` (one process, a recipe function that records the
    modules loaded by the time it runs): no backend module, no SkyPilot, submitit or matplotlib."""
    (tmp_path / "house_probe.py").write_text(_PROBE)
    job = tmp_path / "run" / "launch" / "job.yaml"
    job.parent.mkdir(parents=True)
    out = tmp_path / "modules.json"
    job.write_text(f"recipe: house_probe:probe\noutput_dir: {tmp_path / 'run'}\nprobe: {{out: {out}}}\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{tmp_path}:{ROOT}", "HOME": str(tmp_path)}
    subprocess.run([sys.executable, "-m", "automodel_hydra.worker", str(job)], cwd=tmp_path, env=env, check=True,
                   timeout=120)
    modules = json.loads(out.read_text())
    assert "torch" in modules and "automodel_hydra.bootstrap" in modules  # it ran as a rank (the worker is __main__)
    assert _loaded(modules) == []


def test_preflight_returns_its_facts_and_keeps_none(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What planning needs of this machine travels from ``preflight`` to ``plan``/``batches`` as a value: the
    backend object is the same after a preflight as before."""
    from automodel_hydra import config
    from automodel_hydra.backends.interactive import Devices, Interactive
    from automodel_hydra.backends.slurm import Facts, Slurm

    monkeypatch.setenv("PATH", str(tmp_path))  # no scontrol: Slurm's default MaxArraySize
    for backend, cfg, facts in [(Interactive(), config.load({"output_dir": str(tmp_path)}), Devices.here()),
                                (Slurm(), config.load({"output_dir": str(tmp_path), "slurm": {"snapshot": "none"}}),
                                 Facts(snapshots={("none", 200.0): None}))]:
        before = dict(vars(backend))
        assert backend.preflight([cfg]) == facts
        assert vars(backend) == before


def test_whether_ranks_see_this_filesystem_is_the_backends_answer(tmp_path: Path) -> None:
    from automodel_hydra import backends, config

    def cfg(**sections: tp.Any) -> config.TrainConfig:
        return config.load({"output_dir": str(tmp_path), **sections})

    assert backends.get("interactive").ranks_see_local_files(cfg())
    assert backends.get("slurm").ranks_see_local_files(cfg(slurm={}))
    assert not backends.get("slurm").ranks_see_local_files(cfg(slurm={"container_image": "nvcr.io/x"}))
    assert not backends.get("skypilot").ranks_see_local_files(cfg(skypilot={}))


def test_every_alias_is_in_the_one_table(tmp_path: Path) -> None:
    """Each of AutoModel's names moves to ours through ``config.ALIASES`` alone (the bundled recipe's config and an
    AutoModel file's launcher section alike); both names set to different values is one error naming both."""
    from automodel_hydra import config
    from automodel_hydra.schema import ConfigError

    assert {(s, a) for s, a, _, _ in config.ALIASES} >= {("skypilot", "gpus_per_node")}
    values = {"ckpt_every_steps": 7, "restore_from": str(tmp_path), "gpus_per_node": 3}
    for section, alias, target_section, target in config.ALIASES:
        for recipe in ({}, {"recipe": "m:f"}) if section in config.LAUNCH_KEYS else ({},):
            cfg = config.load({"output_dir": str(tmp_path), **recipe, section: {alias: values[alias]}})
            assert getattr(getattr(cfg, target_section), target) == values[alias]
            assert getattr(getattr(cfg, section), alias, None) is None  # normalised: one key holds the value
        other = {"ckpt_every_steps": 9, "restore_from": "/elsewhere", "gpus_per_node": 4}[alias]
        both = {section: {alias: values[alias]}}
        both.setdefault(target_section, {})[target] = other
        try:
            config.load({"output_dir": str(tmp_path), **both})
        except ConfigError as e:
            assert str(e).startswith(f"{section}.{alias}") and f"{target_section}.{target}" in str(e)
        else:
            raise AssertionError(f"{section}.{alias} and {target_section}.{target} both set were accepted")


def test_the_package_has_its_version_from_the_package_metadata() -> None:
    import importlib.metadata

    import automodel_hydra

    assert automodel_hydra.__version__ == importlib.metadata.version("automodel-hydra")


# ----------------------------------------------------------------------------------------------- error split


def _run_raising(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    """``driver.run`` of a single run whose launch raises ``error`` (the preparing is a stand-in: the error is
    what is under test)."""
    from automodel_hydra import driver
    from automodel_hydra.plan import JobSpec

    for var in ("SLURM_PROCID", "SUBMITIT_EXECUTOR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(driver, "prepare", lambda cfg, sweep: driver.Prepared(
        tp.cast(tp.Any, None), JobSpec(Path("/nonexistent/run"), "train"), dry_run=False))

    def launch(jobs: tp.Any, sweep_dir: tp.Any = None) -> tp.NoReturn:
        raise error

    monkeypatch.setattr(driver, "launch", launch)
    driver.run(tp.cast(tp.Any, None))


def test_a_user_error_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
                                  caplog: pytest.LogCaptureFixture) -> None:
    from automodel_hydra.schema import ConfigError

    with pytest.raises(SystemExit) as e:
        _run_raising(monkeypatch, ConfigError("slurm.nodes", 0, "must be an integer >= 1"))
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err == "error: slurm.nodes=0 is invalid: must be an integer >= 1\n"
    assert not [r for r in caplog.records if r.exc_info]


@pytest.mark.parametrize("error", [ValueError("invalid literal for int() with base 10: 'x'"),
                                   RuntimeError("dictionary changed size during iteration"),
                                   OSError(28, "No space left on device"), KeyError("nodes")])
def test_an_unexpected_exception_keeps_its_traceback_and_says_it_is_a_bug(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
        error: BaseException) -> None:
    with pytest.raises(SystemExit) as e:
        _run_raising(monkeypatch, error)
    assert e.value.code == 1
    (record,) = [r for r in caplog.records if r.exc_info]
    assert record.exc_info is not None and record.exc_info[1] is error  # the traceback goes to the log
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"error: {type(error).__name__}: ") and "a bug of automodel-hydra" in last
