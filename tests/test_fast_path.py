"""The sweep fast path (``hydra_plugins/automodel_hydra_launcher/_fast``) against Hydra's own path, over a corpus of
sweeps: the launcher runs each sweep twice into the same dir, once with every job through its exact path (Hydra's
``load_sweep_config`` and ``run_job``) and once as it runs by default, and everything must be the same: each job's
config as ``prepare`` sees it (unresolved and resolved, with its ``hydra`` node), the validated config and job spec
``prepare`` returns (or its error), each JobReturn, and every file written (``.hydra/``, ``launch/``, the job logs),
byte for byte. A log line's time stamp is the one thing left out."""

from __future__ import annotations

import re
import shutil
import typing as tp
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra._internal.callbacks import Callbacks
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobReturn
from hydra.types import HydraContext, RunMode
from omegaconf import DictConfig, OmegaConf

from automodel_hydra import driver
from hydra_plugins.automodel_hydra_launcher._fast import _jobs
from hydra_plugins.automodel_hydra_launcher.launcher import AutomodelLauncher
from tests.helpers import CONF, ROOT

AUTOMODEL_DIR = ROOT / "tests" / "data" / "automodel"
LONG = "x" * 70 + " " + "y" * 30  # past YAML's 80-column line width: where emitters may wrap

#: name -> (config dir, config name, the sweep's command line, whether every job takes the fast path)
CORPUS: dict[str, tuple[Path, str, list[str], bool]] = {
    "numbers": (CONF, "llm_finetune", ["seed=0,1,2", "optim.lr=1e-4,3e-4", "step_scheduler.max_steps=7"], True),
    "strings": (CONF, "llm_finetune", ["launcher=slurm", "slurm.job_name=a,'b c','on',yes,'1e3',null_name",
                                       f"+extra.long='{LONG}'", "+extra.colon='a: b'"], True),
    "groups": (CONF, "llm_finetune", ["launcher=slurm,interactive", "profile=none,nsys", "seed=1,2"], True),
    "interpolations": (CONF, "llm_finetune", ["seed=3,4", "launcher=slurm", "slurm.job_name=run_${seed}",
                                              "optim.weight_decay=${optim.lr}"], True),
    "add-delete-force": (CONF, "llm_finetune", ["seed=0,1", "launcher=slurm", "+slurm.env_vars.FOO=a,b",
                                                "++slurm.env_vars.BAR=x", "~slurm.env_vars.BAR",
                                                "+extra.list=[1,2,3]", "checkpoint.dir=null"], True),
    "sweep-file": (CONF, "llm_finetune", ["sweep=lr_seed"], True),
    "sweep-file-narrowed": (CONF, "llm_finetune", ["sweep=lr_seed", "seed=5,6", "optim.lr=1e-3"], True),
    "hydra-settings": (CONF, "llm_finetune", ["seed=0,1", "optim.lr=1e-4,2e-4",
                                              "hydra.job.config.override_dirname.exclude_keys=[seed]",
                                              "hydra.job.config.override_dirname.kv_sep=:",
                                              "hydra.sweep.subdir=${hydra.job.num}_${hydra.job.override_dirname}",
                                              "hydra.job.chdir=true", "++hydra.job.env_set.PROBE=j${hydra:job.num}"],
                       True),
    "hydra-refers-to-job": (CONF, "llm_finetune", ["seed=3,4", "hydra.sweep.subdir=s${seed}"], False),
    "user-command": (CONF, "llm_finetune", ["seed=range(0,3)", "launcher=slurm", "slurm.partition=debug",
                                            "slurm.gpus_per_node=0"], True),
    "long-values": (CONF, "llm_finetune", ["launcher=slurm", f"+extra.note='{LONG}','- {LONG}','{LONG} b'",
                                           f"slurm.job_name='{'w ' * 45}'", "seed=1,2"], True),
    "bad-value": (CONF, "llm_finetune", ["launcher=slurm", "slurm.nodes=1,0"], True),
    "automodel-file": (AUTOMODEL_DIR, "llama3_2_1b_squad",
                       ["hydra/launcher=automodel", "hydra/sweeper=automodel_basic",
                        "++step_scheduler.max_steps=3,4", "++optimizer.lr=1e-5,2e-5", "++slurm.job_name=sq"], True),
}

#: Corpus sweeps that take over a second here: in the slow tier (``pytest tests/test_fast_path.py`` runs them all).
#: Measured on the project's 2-core machine at load ~2: groups 3.6 s, interpolations 2.2, sweep-file 2.0, strings
#: 2.0, numbers 1.7, add-delete-force 1.7; the five left in the fast tier 1.0-1.4 s (docs/testing.md).
SLOW = {"user-command", "long-values", "groups", "interpolations", "sweep-file", "strings", "numbers",
        "add-delete-force"}

_STAMP = re.compile(rb"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}\]", re.M)


class Record(tp.NamedTuple):
    """What one sweep did: per job what ``prepare`` saw and returned, the JobReturns (or the launch's error), the
    files."""

    prepared: list[tuple[tp.Any, ...]]
    returns: list[tuple[tp.Any, ...]] | str
    files: dict[str, bytes]


def _first_difference(a: bytes, b: bytes) -> tuple[bytes, bytes]:
    """The first line where ``a`` and ``b`` differ, as each has it (for the failure message)."""
    for x, y in zip([*a.splitlines(), b""], [*b.splitlines(), b""]):
        if x != y:
            return x, y
    return b"", b""


def _resolved(cfg: DictConfig) -> tp.Any:
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except Exception as e:  # (the same failure on both paths is what is compared)
        return type(e).__name__


def _outcome(value: tp.Any) -> tp.Any:
    return (type(value).__name__, str(value)) if isinstance(value, BaseException) else value


def run_sweep(config_dir: Path, config_name: str, args: list[str], sweep_dir: Path) -> Record:
    """``train.py -m ARGS`` through our launcher in this process (``dry_run=true``: planned and written, nothing
    started), with the jobs Hydra's basic sweeper makes of the command line."""
    prepared: list[tuple[tp.Any, ...]] = []

    def prepare(cfg: DictConfig, sweep: bool = True, load: tp.Any = None) -> driver.Prepared:
        hydra = OmegaConf.to_container(HydraConfig.get(), resolve=False)
        seen = (OmegaConf.to_container(cfg, resolve=False), _resolved(cfg), hydra)
        try:
            result = driver.prepare(cfg, sweep, load)
        except Exception as e:
            prepared.append((*seen, _outcome(e)))
            raise
        prepared.append((*seen, result.cfg, result.job, result.dry_run))
        return result

    def task(cfg: DictConfig) -> None:  # never called: the launcher plans through prepare
        raise AssertionError("the task function ran in the launching process")

    setattr(task, driver.PREPARE_ATTR, prepare)
    dry = "++dry_run=true" if config_dir != CONF else "dry_run=true"
    with initialize_config_dir(config_dir=str(config_dir), version_base=None, job_name="train"):
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration(config_name, [*args, dry, f"hydra.sweep.dir={sweep_dir}"],
                                           run_mode=RunMode.MULTIRUN)
        HydraConfig.instance().set_config(master)
        params = [f"{k}={v}" for k, v in (master.hydra.sweeper.params or {}).items()]
        task_overrides = tp.cast(list[str], OmegaConf.to_container(master.hydra.overrides.task, resolve=False))
        parsed = OverridesParser.create(config_loader=loader).parse_overrides(params + task_overrides)
        (jobs,) = BasicSweeper.split_arguments(parsed, None)
        launcher = AutomodelLauncher()
        launcher.setup(hydra_context=HydraContext(config_loader=loader, callbacks=Callbacks(master)),
                       task_function=task, config=master)
        returns: list[tuple[tp.Any, ...]] | str
        try:
            rets: tp.Sequence[JobReturn] = launcher.launch(jobs, initial_job_idx=0)
            returns = [(r.status, _outcome(r._return_value), r.overrides, r.working_dir, r.task_name) for r in rets]
        except SystemExit as e:  # a bad value: one line, nothing submitted
            returns = f"exit {e.code}"
    files = {str(p.relative_to(sweep_dir)): _STAMP.sub(b"[T]", p.read_bytes())
             for p in sorted(sweep_dir.rglob("*")) if p.is_file()}
    return Record(prepared, returns, files)


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in CORPUS])
def test_the_fast_path_does_what_hydras_own_path_does(name: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    config_dir, config_name, args, all_fast = CORPUS[name]
    sweep_dir = tmp_path / "sweep"
    monkeypatch.chdir(tmp_path)
    run = _jobs.FastJobs.run
    with monkeypatch.context() as m:
        m.setattr(_jobs.FastJobs, "run", lambda self, idx, overrides: None)  # every job: the exact path
        exact = run_sweep(config_dir, config_name, args, sweep_dir)
    ids = {p: p.read_bytes() for p in sweep_dir.rglob("launch/tracker_id")}  # each job's, kept by a relaunch
    shutil.rmtree(sweep_dir)
    for path, text in ids.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text)
    taken: list[bool] = []

    def counted(self: _jobs.FastJobs, idx: int, overrides: tp.Sequence[str]) -> JobReturn | None:
        ret = run(self, idx, overrides)
        taken.append(ret is not None)
        return ret

    monkeypatch.setattr(_jobs.FastJobs, "run", counted)
    fast = run_sweep(config_dir, config_name, args, sweep_dir)

    assert len(exact.prepared) >= 2 and taken, "the corpus sweep has jobs"
    assert all(taken) if all_fast else not any(taken), taken  # which path the jobs took
    assert fast.prepared == exact.prepared
    assert fast.returns == exact.returns
    assert fast.files.keys() == exact.files.keys()
    for path, text in exact.files.items():
        assert fast.files[path] == text, (path, _first_difference(fast.files[path], text))
    if name == "bad-value":
        assert exact.returns == "exit 2" and not any(p.endswith("sbatch.sh") for p in exact.files)
    else:
        assert any(p.endswith(".hydra/config.yaml") for p in exact.files)


# ----------------------------------------------------------------------------------------------- long values


#: Values that PyYAML's emitter writes differently at different columns and depths: past the 80-column width
#: (plain text wraps at spaces, quoted text too), quoted styles, block collections, empty ones.
PLACED = [
    "short", 3, 2.5e-4, None, True, "on", "1e3", "",
    "a" * 90,  # no space: one line past the width
    "word " * 30,  # plain text, wrapped at spaces
    "- starts like a list item, so it is quoted, and it is long enough to wrap " * 2,  # single-quoted, wrapped
    "a tab\there and more words to go past the width of eighty columns for sure" * 2,  # double-quoted, wrapped
    "two\nlines with a longer second line that goes past the width of eighty columns",
    ["x=1", "launcher=slurm", "slurm.partition=debug", "+extra.long='" + "w " * 50 + "'"],
    [], {}, {"a": 1, "b": ["c", "d " * 50]},
]


@pytest.mark.parametrize("value", PLACED, ids=range(len(PLACED)))
def test_a_value_is_placed_as_the_emitter_writes_it_there(value: tp.Any) -> None:
    """Each value, at three depths and after keys of three lengths, is written into the template exactly as
    emitting the whole document writes it (OmegaConf's ``to_yaml``), and without emitting the whole document."""
    from hydra_plugins.automodel_hydra_launcher._fast import _yaml

    data = {"top": 1, "hydra": {"job": {"id": "j", "override_dirname": "x", "num": 0},
                                "overrides": {"task": ["a"]}, "z": 2}, "last": "end"}
    doc = _yaml.YamlDoc(data)
    for path in (("top",), ("hydra", "job", "override_dirname"), ("hydra", "overrides", "task"),
                 ("hydra", "job", "num")):
        changed = _jobs._replaced(data, {path: value})
        assert doc.text({path: value}) == _yaml.to_yaml(changed), path
        assert doc._placed(path, value) is not None, path


def test_a_users_sweep_command_fills_the_template_for_every_job(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``slurm.partition=debug slurm.gpus_per_node=0`` on the command line makes every job's
    ``hydra.job.override_dirname`` line longer than YAML's 80 columns: each job's ``.hydra/hydra.yaml`` is still
    its template with the job's values placed, never the whole document emitted again (~25 ms a job with PyYAML's
    pure-Python emitter: what took such a sweep twice as long to reach sbatch as the benchmark's command)."""
    from hydra_plugins.automodel_hydra_launcher._fast import _yaml

    whole = []
    replace = _yaml.YamlDoc._replace

    def counted(self: tp.Any, node: tp.Any, changes: tp.Any, path: tuple[str, ...]) -> tp.Any:
        if path == ():
            whole.append(tuple(changes))
        return replace(self, node, changes, path)

    monkeypatch.setattr(_yaml.YamlDoc, "_replace", counted)
    monkeypatch.chdir(tmp_path)
    record = run_sweep(CONF, "llm_finetune", ["seed=range(0,6)", "launcher=slurm", "slurm.partition=debug",
                                              "slurm.gpus_per_node=0"], tmp_path / "sweep")
    hydra_yaml = record.files["0/.hydra/hydra.yaml"].decode()
    assert "override_dirname: dry_run=True,launcher=slurm,seed=0,slurm.gpus_per_node=0,slurm.partition=debug\n" in (
        hydra_yaml)
    assert len(record.prepared) == 6
    assert len(whole) <= 2, f"documents emitted whole: {len(whole)} (one template per document is expected)"
