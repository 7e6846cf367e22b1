"""The house's shape: no import circle between the package's files, the rank side loads no launcher, no early
torchrun agent (a local run's head is the torchrun its script names), one command-line parser and one table of
sections, one home per fact, docs/architecture.md naming every module, and no module over 600 lines but a listed few.

The import graph is read from the source (``ast``), not from an interpreter, so a circle that only a function-level
import closes is caught too: every ``import`` / ``from ... import`` anywhere in a module counts, function bodies
included, except those under ``if TYPE_CHECKING:`` (they never run; mypy reads type-only circles fine).
"""

from __future__ import annotations

import ast
import json
import os
import re
import shlex
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


@pytest.mark.slow
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
    from automodel_hydra import config, sections
    from automodel_hydra.schema import ConfigError

    assert {(s, a) for s, a, _, _ in config.ALIASES} >= {("skypilot", "gpus_per_node")}
    values = {"ckpt_every_steps": 7, "restore_from": str(tmp_path), "gpus_per_node": 3}
    for section, alias, target_section, target in config.ALIASES:
        for recipe in ({}, {"recipe": "m:f"}) if section in sections.LAUNCH_KEYS else ({},):
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


# ----------------------------------------------------------------------------------------------- one Slurm transport

#: The Slurm backend's operations, each one body for this machine's cluster and a login node's (slurm.tunnel).
SLURM_OPERATIONS = ("submit", "states", "cancel", "wait", "read_log", "fetch_results")
#: What tells where a cluster is; an operation's body never branches on it (it asks the job's transport).
_WHERE = {"remote", "endpoint", "tunnel", "ssh", "local_paths", "RemoteRef"}


def test_each_slurm_operation_has_one_body_and_only_the_transport_starts_commands() -> None:
    """``backends/slurm.py`` runs sbatch, sacct/squeue, scancel, the log reads and the copy-back through the job's
    transport (``slurm_transport``: this machine; ``slurm_tunnel``: SSH): no operation tests whether the job went
    through the tunnel, and no other Slurm module starts a process."""
    path = ROOT / "automodel_hydra" / "backends" / "slurm.py"
    tree = ast.parse(path.read_text())
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Slurm"]
    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert set(SLURM_OPERATIONS) <= set(methods)
    for name in SLURM_OPERATIONS:
        for node in ast.walk(methods[name]):
            if isinstance(node, (ast.If, ast.IfExp, ast.While)):
                words = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
                words |= {n.attr for n in ast.walk(node.test) if isinstance(n, ast.Attribute)}
                assert not words & _WHERE, f"Slurm.{name} branches on where the cluster is: {ast.unparse(node.test)}"
    starts = set()
    for mod, file in _modules().items():
        if mod.startswith("automodel_hydra.backends.slurm"):
            nodes = list(ast.walk(ast.parse(file.read_text())))
            names = {a.name for n in nodes if isinstance(n, ast.Import) for a in n.names}
            names |= {n.module for n in nodes if isinstance(n, ast.ImportFrom)}
            if names & {"subprocess", "asyncio"}:
                starts.add(mod)
    assert starts == {"automodel_hydra.backends.slurm_transport", "automodel_hydra.backends.slurm_tunnel"}


# ----------------------------------------------------------------------------------------------- the early agent


def _sources() -> dict[str, str]:
    return {mod: path.read_text() for mod, path in _modules().items()}


def test_no_early_agent() -> None:
    """torchrun's agent is never started before the plan: no module for it, and nothing in the package, the
    repository's ``train.py`` or the benchmark (whose B is bash running the planned script) that starts, hands
    over, discards or imitates one."""
    assert not [m for m in _modules() if m.endswith(".prestart")]
    others = {name: (ROOT / name).read_text() for name in ("train.py", "benchmarks/run.py")}
    for name, text in {**_sources(), **others}.items():
        assert "prestart" not in text and "planned_exec" not in text, name


RUN = ["step_scheduler.max_steps=6", "step_scheduler.log_interval=1", "checkpoint.enabled=false",
       "interactive.nproc_per_node=2", "model.hidden_size=32", "model.num_heads=2"]


@pytest.mark.slow
def test_a_local_runs_head_is_the_torchrun_bash_started_from_its_script_and_it_outlives_a_kill_9(
        tmp_path: Path) -> None:
    """``launch/torchrun.sh`` is the exact command that runs: the job's head process (``launch/pid``) is the
    torchrun its ``exec`` line names, word for word, started by bash in a session of its own below the launching
    command. A ``kill -9`` of that command leaves the run going, as every local run: it completes on its own."""
    from tests.helpers import wait_for

    run = tmp_path / "run"
    log = open(tmp_path / "out.txt", "wb")  # noqa: SIM115  (the ranks keep writing here after the driver is gone)
    driver = subprocess.Popen([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run}", *RUN], cwd=tmp_path,
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        def head() -> int | None:
            try:
                pid = int((run / "launch" / "pid").read_text())
                return pid if Path(f"/proc/{pid}/cmdline").read_bytes() else None
            except (OSError, ValueError):
                return None

        pid = wait_for(head, 120, "the job's head process", proc=driver,
                       output=lambda: (tmp_path / "out.txt").read_text(errors="replace"))
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")[:-1]
        (line,) = [ln for ln in (run / "launch" / "torchrun.sh").read_text().splitlines() if ln.startswith("exec ")]
        planned = [w.replace("${AUTOMODEL_RDZV_PORT:-0}", "0") for w in shlex.split(line)[1:]]  # the OS picks it
        assert argv == planned  # the script's exec, as bash expanded it: the same program, flags and job file
        # torchrun's own entry point, run by automodel_hydra.agent (its chatter in launch/agent.<host>.log)
        assert planned[:5] == [sys.executable, "-m", "automodel_hydra.agent", str(run / "launch"), "torchrun"]
        stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[1]) == driver.pid and os.getsid(pid) == pid  # below the driver, a session of its own
        driver.kill()  # kill -9 of the launching command
        driver.wait()
        wait_for(lambda: (run / "result.json").is_file(), 240, "the run's result after its driver was killed",
                 output=lambda: (tmp_path / "out.txt").read_text(errors="replace"))
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 60, "torchrun's exit")
        assert json.loads((run / "result.json").read_text())["step"] == 6
    finally:
        if driver.poll() is None:
            driver.kill()
        log.close()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


# ----------------------------------------------------------------------------------------------- one home per fact


def _tables(tree: ast.AST) -> tp.Iterator[tuple[ast.AST, list[str]]]:
    """Every tuple, list, set and dict literal in ``tree`` made of string constants alone (a dict: its keys), with
    them: a table of names (a command line being built, with other values in it, is none)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)):
            elts = node.keys if isinstance(node, ast.Dict) else node.elts
            if elts and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in elts):
                yield node, [tp.cast(ast.Constant, e).value for e in elts]


def test_hydras_flags_have_one_table_and_one_parser() -> None:
    """Hydra's command-line flags are named in one table (``argv.HYDRA_FLAGS``) and read by one parser
    (``argv.parse``): no other literal in the package lists two of them (the driver, the early agent and argv
    each had their own, and disagreed on ``-c``), and what the parser reads is what Hydra's argparse reads."""
    from automodel_hydra import argv

    names = {n for flag in argv.HYDRA_FLAGS for n in flag.names}
    trees = {mod: ast.parse(path.read_text()) for mod, path in _modules().items()}
    (table,) = [n for n in trees["automodel_hydra.argv"].body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "HYDRA_FLAGS" for t in n.targets)]
    inside = {id(n) for n in ast.walk(table)}
    for mod, tree in trees.items():
        for node, consts in _tables(tree):
            if len(set(consts) & names) >= 2 and not (mod == "automodel_hydra.argv" and id(node) in inside):
                raise AssertionError(f"{mod}:{node.lineno} lists Hydra's flags {sorted(set(consts) & names)}")
    # -c is --cfg (it takes a value), -sc takes none, -i an optional one of its choices: as Hydra's argparse
    assert argv.hydra_flags_first(["a=1", "-c", "job", "b=2"]) == ["-c", "job", "a=1", "b=2"]
    assert argv.hydra_flags_first(["a=1", "-sc", "install=bash"]) == ["-sc", "a=1", "install=bash"]
    assert argv.hydra_flags_first(["a=1", "-i", "b=2"]) == ["a=1", "b=2", "-i"]  # before b=2, argparse takes b=2
    assert argv.hydra_flags_first(["-i", "config", "a=1"]) == ["-i", "config", "a=1"]
    line = argv.parse(["-cd", "D", "--config-name=F", "-c", "job", "x=1", "--a.b=c"])
    assert (line.value("--config-dir"), line.value("--config-name"), line.value("--cfg")) == ("D", "F", "job")
    assert line.overrides == ["x=1"] and line.words == ["x=1", "--a.b=c"]
    assert argv.parse(["-m", "--cfg", "job"]).usage_problem() == (
        "-m and --cfg job: Hydra runs one of --run, --multirun, --cfg, --info, --shell-completion at a time: keep one")
    assert argv.parse(["--resolve", "a=1"]).usage_problem() is not None
    assert argv.parse(["--cfg", "job", "--resolve"]).usage_problem() is None


def test_the_sections_have_one_table() -> None:
    """Which section plays which part is written once (``sections.SECTIONS``); no other module defines a list of
    sections of its own (two constants named ``LAUNCHER_SECTIONS`` had different contents)."""
    own = ("SECTIONS", "LAUNCH_KEYS", "BUNDLED_KEYS", "RECIPE_KEEPS", "NEVER_THE_RECIPES", "NOT_FOR_RANKS")
    for mod, path in _modules().items():
        if mod == "automodel_hydra.sections":
            continue
        for node in ast.parse(path.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            for t in targets:
                if isinstance(t, ast.Name) and (t.id.endswith(own) or t.id.endswith("_SECTIONS")):
                    raise AssertionError(f"{mod}:{node.lineno} defines {t.id}: import it from automodel_hydra.sections")


def _constants(value: tp.Callable[[str], bool]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and value(node.value):
                found.setdefault(mod, []).append(node.lineno)
    return found


def test_each_checkpoint_name_and_the_error_exits_have_one_home() -> None:
    """The default checkpoint dir, the step-dir name and the pointer's and index file's names are written once
    (``paths``); the ladder of how a launching command ends (stop, user error, launch error, bug) is one ``try``
    (``driver.one_line_exits``), which a single run and both sweep launches use."""
    assert set(_constants(lambda v: v == "checkpoints")) == {"automodel_hydra.paths"}
    assert set(_constants(lambda v: v.startswith("step-") or "step-(" in v)) == {"automodel_hydra.paths"}  # not prose
    assert set(_constants(lambda v: v in ("latest", ".metadata"))) == {"automodel_hydra.paths"}
    ladders = []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Try):
                caught = {ast.unparse(h.type) for h in node.handlers if h.type is not None}
                if {"USER_ERRORS", "LAUNCH_ERRORS"} <= {c.rpartition(".")[2] for c in caught}:
                    ladders.append(f"{mod}:{node.lineno}")
    assert len(ladders) == 1 and ladders[0].startswith("automodel_hydra.driver:"), ladders


#: The modules that decide what to do with a job: they ask the backend contract (``plan.Backend``), never its name.
ASKING_MODULES = ("automodel_hydra.driver", "automodel_hydra.cli", "automodel_hydra.progress",
                  "automodel_hydra.outcome")


def _backend_names() -> set[str]:
    from automodel_hydra.backends import BACKENDS

    return set(BACKENDS)


def test_the_driver_and_the_cli_ask_the_backend_never_its_name() -> None:
    """No backend name (``"interactive"``, ``"slurm"``, ``"skypilot"``) is compared with anything, tested for
    membership or used as a table's key in the driver, the CLI, the progress line or the outcome reader, and no
    launcher section (``cfg.slurm``, ``cfg.skypilot``) is read and no backend's own module imported there: what
    differs between backends is a question of ``plan.Backend`` (``ranks_import_here``, ``holds_run_lock``,
    ``poll_s``, ``time_limit_minutes``, ``env_vars``, ``pending_note``, ...), answered by each backend."""
    names, found = _backend_names(), []
    mods = _modules()
    for mod in ASKING_MODULES:
        tree = ast.parse(mods[mod].read_text())
        for node in ast.walk(tree):
            parts: list[ast.AST] = []
            if isinstance(node, ast.Compare):
                parts = [node.left, *node.comparators]
            elif isinstance(node, ast.Dict):
                parts = [k for k in node.keys if k is not None]
            elif isinstance(node, ast.Attribute) and node.attr in names:
                found.append(f"{mod}:{node.lineno}: {ast.unparse(node)}")
            for part in parts:
                consts = [c for c in ast.walk(part) if isinstance(c, ast.Constant)]
                if any(c.value in names for c in consts):
                    found.append(f"{mod}:{node.lineno}: {ast.unparse(node)[:80]}")
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("automodel_hydra.backends."):
                found.append(f"{mod}:{node.lineno}: imports {node.module}")  # a backend's own functions
    assert not found, found


def test_the_contract_answers_what_the_driver_asks(tmp_path: Path) -> None:
    """Each backend answers the driver's questions (the values the name checks they replace gave)."""
    from automodel_hydra import backends, config

    def cfg(**sections: tp.Any) -> config.TrainConfig:
        return config.load({"output_dir": str(tmp_path), **sections})

    local, slurm, sky = (backends.get(n) for n in ("interactive", "slurm", "skypilot"))
    assert (local.ranks_import_here, slurm.ranks_import_here, sky.ranks_import_here) == (True, False, False)
    assert (local.holds_run_lock, slurm.holds_run_lock, sky.holds_run_lock) == (True, False, False)
    assert local.poll_s < slurm.poll_s == sky.poll_s
    assert slurm.time_limit_minutes(cfg(slurm={"time": "01:30:00"})) == 90
    assert local.time_limit_minutes(cfg()) is None and sky.time_limit_minutes(cfg(skypilot={})) is None
    assert slurm.env_vars(cfg(slurm={"env_vars": {"WANDB_RUN_ID": "x"}})) == {"WANDB_RUN_ID": "x"}
    assert sky.env_vars(cfg(skypilot={"env_vars": {"A": "1"}})) == {"A": "1"} and local.env_vars(cfg()) == {}
    assert slurm.pending_note("PartitionTimeLimit").startswith("PartitionTimeLimit (will not start as submitted")
    assert local.pending_note("PartitionTimeLimit") == "PartitionTimeLimit"


#: The run dir's records: their file names, and the one module that reads and writes them.
RECORD_NAMES = ("submission.json", "manifest.json", "cancel.json")
RECORD_CONSTANTS = ("RECORD_FILE", "MANIFEST_FILE", "LOCK_FILE", "CANCEL_FILE", "OLD_CANCEL_MARK", "CANCELLED_MARK")


def test_the_run_dirs_records_and_the_run_lock_have_one_module() -> None:
    """``launch/submission.json``, the sweep's ``launch/manifest.json``, a user's cancel (``launch/cancel.json``, one
    record on every backend) and the run lock (``flock`` on ``launch/lock``) are named, read and written in
    ``automodel_hydra.records`` only: no other module spells their names, holds a constant for them or takes a
    ``flock``; the others call ``records``' functions."""
    found = []
    for mod, path in _modules().items():
        if mod == "automodel_hydra.records":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in RECORD_NAMES:
                found.append(f"{mod}:{node.lineno}: {node.value!r}")
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in RECORD_CONSTANTS or name == "flock":
                found.append(f"{mod}:{node.lineno}: {name}")
    assert not found, found
    records = ast.parse((ROOT / "automodel_hydra" / "records.py").read_text())
    assert {n.attr for n in ast.walk(records) if isinstance(n, ast.Attribute)} >= {"flock"}


def test_the_exit_status_of_a_users_mistake_has_one_home() -> None:
    """Status 2 (a mistake the user can fix) is ``schema.USER_ERROR_EXIT``: no ``SystemExit(2)``, ``sys.exit(2)`` or
    ``return 2`` anywhere else in the package, and the constant is defined once."""
    found, defined = [], []
    for mod, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            value = None
            if isinstance(node, ast.Return):
                value = node.value
            elif isinstance(node, ast.Call) and ast.unparse(node.func).rpartition(".")[2] in ("SystemExit", "exit"):
                value = node.args[0] if node.args else None
            if isinstance(value, ast.Constant) and type(value.value) is int and value.value == 2:
                found.append(f"{mod}:{node.lineno}: {ast.unparse(node)}")
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "USER_ERROR_EXIT"
                                                    for t in node.targets):
                defined.append(mod)
    assert not found, found
    assert defined == ["automodel_hydra.schema"]


def test_tests_poll_and_pick_ports_in_one_place() -> None:
    """``free_port`` and ``wait_for`` are defined once, in tests/helpers.py."""
    defined: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name.lstrip("_") in ("free_port", "wait_for"):
                defined.setdefault(node.name.lstrip("_"), []).append(str(path.relative_to(ROOT)))
    assert defined == {"free_port": ["tests/helpers.py"], "wait_for": ["tests/helpers.py"]}


# ----------------------------------------------------------------------------------------------- the map and sizes


def test_architecture_md_names_every_module_with_its_idea() -> None:
    """docs/architecture.md's table of modules has one line per module of the package and of its Hydra plugin:
    a module added without its line fails here, and so does a line naming a module that does not exist."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| `([\w/]+\.py)` \| (.+) \|$", text, re.M)
    named = [path for path, _ in rows]
    files = sorted(str(p.relative_to(ROOT)) for p in _modules().values())
    assert len(named) == len(set(named)), "a module named twice"
    assert sorted(named) == files, {"without a line": sorted(set(files) - set(named)),
                                    "no such module": sorted(set(named) - set(files))}
    assert all(idea.strip() for _, idea in rows)


#: Modules over :data:`MAX_LINES` lines, each with why it is allowed for now. Tighten as the refactors land: a
#: module that gets under the limit must leave this list (the test says so), and a new one never joins it.
BIG_MODULES = {
    # prepare/launch and how a launching command ends; the stop summary and the rank path are still here
    "automodel_hydra/driver.py": "prepare/launch plus the stop summary, the recipe checks and the rank path",
    # one idea (a rank's place and rendezvous), much of it the table of launchers' variables and their checks
    "automodel_hydra/bootstrap.py": "the one torch.distributed bootstrap",
    # the local backend: torchrun scripts, the packing scheduler, local states/cancel
    "automodel_hydra/backends/interactive.py": "the interactive backend and its scheduler",
    # one idea (a Slurm job's batch script, planned purely from its config), split into named parts
    "automodel_hydra/backends/slurm_plan.py": "planning a Slurm job's batch script",
}
MAX_LINES = 600


def test_no_module_is_over_600_lines_unless_it_is_listed() -> None:
    sizes = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in _modules().values()}
    over = {path for path, n in sizes.items() if n > MAX_LINES}
    assert over <= set(BIG_MODULES), {p: sizes[p] for p in over - set(BIG_MODULES)}
    assert not set(BIG_MODULES) - over, f"under {MAX_LINES} lines now, so off the list: {set(BIG_MODULES) - over}"


# ----------------------------------------------------------------------------------------------- what a user sees


def test_help_lists_every_section_a_user_can_set_from_the_schema() -> None:
    """``python train.py --help`` shows :func:`automodel_hydra.train.help_keys` (its template names it), which
    reads the schema: every field of ``TrainConfig`` a user sets is there, ``recipe``, ``fault_tolerance``,
    ``slurm.snapshot`` and ``slurm.tunnel`` included (a hand-written list had left them out)."""
    import dataclasses

    from automodel_hydra import config, sections, train
    from automodel_hydra.backends.slurm_config import TunnelConfig

    assert "${automodel_help_keys:}" in (ROOT / "conf" / "hydra" / "help" / "automodel.yaml").read_text()
    listed = train.settable_sections()
    for f in dataclasses.fields(config.TrainConfig):
        if f.name not in sections.NOT_SET_BY_USERS:
            assert f.name in listed[""] or any(s == f.name or s.startswith(f.name + ".") for s in listed), f.name
    assert "recipe" in listed[""] and "fault_tolerance" in listed and "snapshot" in listed["slurm"]
    assert {f.name for f in dataclasses.fields(TunnelConfig)} <= set(listed["slurm.tunnel"])
    text = train.help_keys()
    for name, keys in listed.items():
        assert all(k in text for k in keys) and (not name or f"  {name} " in text)


# ----------------------------------------------------------------------------------------------- AutoModel's room

#: The kinds' own modules: the interface and the bundled and function kinds, the names of kinds, the resolver and
#: runner of recipes, and AutoModel's package. Only these may tell one kind from another.
KIND_MODULES = ("automodel_hydra.recipe_kind", "automodel_hydra.recipe_names", "automodel_hydra.recipes",
                "automodel_hydra.automodel")
KIND_NAMES = ("bundled", "automodel", "callable")


def _kinds_own(mod: str) -> bool:
    return any(mod == k or mod.startswith(k + ".") for k in KIND_MODULES)


def test_no_module_outside_the_kinds_tests_which_kind_a_job_runs() -> None:
    """The config pipeline, the driver, the backends and the ranks ask the job's recipe kind
    (``cfg.kind``: :class:`automodel_hydra.recipe_kind.RecipeKind`) what they need, never which kind it is: no
    ``cfg.bundled`` / ``cfg.automodel`` flag, no comparison with a kind's name, no ``kind_of`` outside the kinds'
    own modules (eight modules tested them in 32 places, all three backends included)."""
    found = []
    for mod, path in _modules().items():
        if _kinds_own(mod):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            flag = isinstance(node, ast.Attribute) and node.attr in ("bundled", "automodel", "kind_of")
            named = isinstance(node, ast.Compare) and any(
                isinstance(c, ast.Constant) and c.value in KIND_NAMES for c in [node.left, *node.comparators])
            if flag or named:
                found.append(f"{mod}:{node.lineno} {ast.unparse(node)}")
            elif isinstance(node, ast.ImportFrom) and any(a.name == "kind_of" for a in node.names):
                found.append(f"{mod}:{node.lineno} imports kind_of")
    assert found == []


def test_automodel_lives_in_its_own_package_reached_through_the_kind_interface() -> None:
    """AutoModel's support is the ``automodel_hydra/automodel/`` package (its kind, files, resume keys, recipe runner
    and ``nemo_run:`` section); outside it only the kinds' interface (``recipe_kind``) imports it, and the config
    pipeline its ``nemo_run:`` translation (a launcher section of any file, read whatever the recipe)."""
    mods = _modules()
    room = {m for m in mods if m == "automodel_hydra.automodel" or m.startswith("automodel_hydra.automodel.")}
    assert {f"automodel_hydra.automodel.{m}" for m in ("kind", "files", "resume", "recipe", "nemo_run")} <= room
    before = {"automodel_hydra.automodel_files", "automodel_hydra.automodel_resume",
              "automodel_hydra.recipes.automodel", "automodel_hydra.nemo_run_section"}
    assert not before & set(mods), "an AutoModel module outside its package"
    allowed = {"automodel_hydra.recipe_kind": room, "automodel_hydra.config": {"automodel_hydra.automodel.nemo_run"}}
    for mod, targets in import_graph().items():
        if mod in room:
            continue
        inside = targets & room
        assert inside <= allowed.get(mod, set()), f"{mod} imports {sorted(inside)}: ask the recipe kind"


def test_every_kind_answers_the_interface() -> None:
    """Each kind is one object behind the typed protocol (mypy checks the signatures), and a ``recipe:`` value
    finds its kind without running anything: none is the bundled recipe, a bare class name AutoModel's, a
    function of the user's the function kind, the bundled recipe named explicitly travels as a file's sections."""
    from automodel_hydra import recipe_kind
    from automodel_hydra.automodel.kind import AUTOMODEL

    members = [n for n in vars(recipe_kind.RecipeKind) if not n.startswith("_")]
    members += list(recipe_kind.RecipeKind.__annotations__)
    for kind in (recipe_kind.BUNDLED, AUTOMODEL, recipe_kind.FUNCTION, recipe_kind.NAMED_BUNDLED):
        assert all(hasattr(kind, m) for m in members), type(kind).__name__
    assert recipe_kind.for_recipe(None) is recipe_kind.BUNDLED
    assert recipe_kind.for_recipe("TrainFinetuneRecipeForNextTokenPrediction") is AUTOMODEL
    assert recipe_kind.for_recipe({"_target_": "nemo_automodel.recipes.llm.train_ft.X"}) is AUTOMODEL
    assert recipe_kind.for_recipe("tests.fault_recipe:main") is recipe_kind.FUNCTION
    assert recipe_kind.for_recipe("automodel_hydra.recipes.llm_finetune.train") is recipe_kind.NAMED_BUNDLED
