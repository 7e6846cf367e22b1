"""``_fast._compose``: every job config equals Hydra's own ``load_sweep_config`` for the same overrides,
``hydra.*`` nodes included, while Hydra composes only once per distinct set of config-group choices."""

from __future__ import annotations

import typing as tp

import pytest
from hydra import initialize_config_dir
from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import setup_globals
from hydra.types import RunMode
from omegaconf import DictConfig, ListConfig, OmegaConf

from hydra_plugins.automodel_hydra_launcher._fast._compose import SweepComposer
from tests.helpers import CONF

# the sweep's own command line: sweeps (expanded by the sweeper, skipped by the master compose) and hydra settings
MASTER = ["seed=range(0,3)", "launcher=slurm,interactive", "profile=none,nsys",
          "hydra.job.config.override_dirname.exclude_keys=[seed]", "hydra.job.config.override_dirname.kv_sep=:",
          "hydra.sweep.dir=multirun/${now:%Y-%m-%d}/${now:%H-%M-%S-%f}"]

JOBS = {
    "value": ["seed=0"],
    "group+value": ["seed=1", "launcher=slurm", "slurm.nodes=2"],
    "other-group": ["seed=2", "launcher=interactive", "interactive.nproc_per_node=2"],
    "two-groups": ["launcher=slurm", "profile=nsys", "profile.nsys.start_step=3", "optim.lr=1e-4"],
    "add-del-forceadd": ["+extra.tag=a", "~dry_run", r"++slurm.env_vars.HF_TOKEN=$\{HF_TOKEN\}", "launcher=slurm"],
    "interpolations": ["launcher=slurm", "slurm.job_name=run_${seed}", "optim.weight_decay=${optim.lr}", "seed=9"],
    "same-key-twice": ["launcher=slurm", "slurm.nodes=4", "slurm.nodes=3"],
    "quoted-list-null": ["launcher=slurm", "slurm.job_name='a b,c'", "+extra.list=[1,2,3]", "checkpoint.dir=null"],
    "delete-value-matches": ["~dry_run=false", "seed=4"],
    "group-deleted": ["~profile", "seed=5"],
    "sweep-file-group": ["sweep=lr_seed", "seed=6"],
    "dict-then-key": ["launcher=slurm", "slurm={nodes: 2}", "slurm.nodes=5"],  # order matters: Hydra's compose
    "key-then-dict": ["launcher=slurm", "slurm.nodes=5", "slurm={nodes: 2}"],
    "group-key-dict": ["profile.nsys.start_step=3", "profile={nsys: {start_step: 2}}"],  # a dict on a group's key
    "hydra-override": ["hydra.job.name=other", "seed=7"],
    "no-overrides": [],
}

BAD = {
    "wrong-type": ["seed=abc"],
    "unknown-key": ["nosuch=1"],
    "add-existing": ["+seed=5"],
    "delete-mismatch": ["~dry_run=true"],
    "unknown-group-option": ["launcher=nosuch"],
    "delete-missing": ["~extra.none"],
}


class Sweep(tp.NamedTuple):
    loader: ConfigLoader
    master: DictConfig
    composer: SweepComposer


@pytest.fixture(autouse=True)
def _restore_hydra_singletons() -> None:
    """Replaces the suite's per-test reset of Hydra's global state: here one state lasts the whole module, as it
    lasts one real sweep (a reset re-runs the plugin modules, so the cached bases would hold other class objects
    than a later compose); :func:`sweep` restores it at the end."""


@pytest.fixture(scope="module")
def sweep() -> tp.Iterator[Sweep]:
    """The master config of ``python train.py -m MASTER`` (Hydra's multirun compose) and one composer for it,
    shared by the cases so that later ones reuse its bases."""
    state = Singleton.get_state()
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        setup_globals()
        loader = GlobalHydra.instance().config_loader()
        master = loader.load_configuration("llm_finetune", MASTER, run_mode=RunMode.MULTIRUN)
        HydraConfig.instance().set_config(master)
        _ = master.hydra.sweep.dir  # resolved by the sweeper before any job is composed: ${now:} is cached
        yield Sweep(loader, master, SweepComposer(loader, master))
    Singleton.set_state(state)


def walk(cfg: DictConfig | ListConfig, path: str = "") -> tp.Iterator[tuple[tp.Any, ...]]:
    """Every node: a container's path, kind, object type and flags (struct, readonly); a leaf's path, value type
    and whether it is an interpolation or missing. Nothing is resolved."""
    yield (path, type(cfg).__name__, OmegaConf.get_type(cfg), OmegaConf.is_struct(cfg), OmegaConf.is_readonly(cfg))
    keys: tp.Iterable[tp.Any] = cfg.keys() if isinstance(cfg, DictConfig) else range(len(cfg))
    for key in keys:
        sub = f"{path}.{key}" if isinstance(cfg, DictConfig) else f"{path}[{key}]"
        raw = OmegaConf.is_interpolation(cfg, key) or OmegaConf.is_missing(cfg, key)
        child = None if raw else cfg[key]  # no interpolation here: indexing resolves nothing
        if isinstance(child, (DictConfig, ListConfig)):
            yield from walk(child, sub)
        else:
            yield (sub, OmegaConf.get_type(cfg, key), OmegaConf.is_interpolation(cfg, key),
                   OmegaConf.is_missing(cfg, key))


def resolved(cfg: DictConfig) -> dict[str, tp.Any]:
    """Each leaf's resolved value, or the name of the error resolving it raises (``${HF_TOKEN}`` here)."""
    HydraConfig.instance().set_config(cfg)  # ${hydra:...} reads the job's own hydra node
    out: dict[str, tp.Any] = {}
    for node in walk(cfg):
        if len(node) == 5:  # a container
            continue
        path = node[0].lstrip(".")
        try:
            out[path] = OmegaConf.to_container(OmegaConf.create({"v": OmegaConf.select(cfg, path)}), resolve=True)
        except Exception as e:  # (the same failure on both sides is what is compared)
            out[path] = type(e).__name__
    return out


def assert_same(ours: DictConfig, theirs: DictConfig) -> None:
    assert OmegaConf.get_cache(ours) == OmegaConf.get_cache(theirs)  # ${now:} and other cached resolvers
    assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(theirs)
    assert list(walk(ours)) == list(walk(theirs))
    assert resolved(ours) == resolved(theirs)


@pytest.mark.parametrize("overrides", list(JOBS.values()), ids=list(JOBS))
def test_job_config_is_hydras_own(sweep: Sweep, overrides: list[str]) -> None:
    theirs = sweep.loader.load_sweep_config(sweep.master, list(overrides))
    ours = sweep.composer.compose(overrides)
    assert_same(ours, theirs)


def test_the_hydra_nodes_that_depend_on_the_job_are_the_jobs(sweep: Sweep) -> None:
    cfg = sweep.composer.compose(JOBS["group+value"])
    assert list(cfg.hydra.overrides.task) == ["seed=1", "launcher=slurm", "slurm.nodes=2"]
    assert OmegaConf.to_container(cfg.hydra.overrides.hydra, resolve=False)[:3] == MASTER[3:6]  # type: ignore[index]
    assert cfg.hydra.job.override_dirname == "launcher:slurm,slurm.nodes:2"  # seed excluded, kv_sep ':'
    assert cfg.hydra.runtime.choices.launcher == "slurm" and cfg.slurm.nodes == 2 and cfg.seed == 1


@pytest.mark.parametrize("overrides", list(BAD.values()), ids=list(BAD))
def test_a_bad_override_raises_hydras_own_error(sweep: Sweep, overrides: list[str]) -> None:
    with pytest.raises(Exception) as theirs:
        sweep.loader.load_sweep_config(sweep.master, list(overrides))
    with pytest.raises(type(theirs.value)) as ours:
        sweep.composer.compose(overrides)
    assert str(ours.value) == str(theirs.value)


def test_hydra_composes_once_per_set_of_group_choices(sweep: Sweep) -> None:
    composer = SweepComposer(sweep.loader, sweep.master)
    jobs = [[f"seed={s}", f"launcher={launcher}", f"optim.lr={lr}"]
            for launcher in ("slurm", "interactive") for s in range(10) for lr in (1e-4, 3e-4)]
    configs = [composer.compose(j) for j in jobs]
    assert (composer.composed, composer.copied, composer.fallbacks) == (2, 40, 0)
    assert [(c.seed, c.optim.lr, c.hydra.runtime.choices.launcher) for c in configs] == [
        (s, lr, launcher) for launcher in ("slurm", "interactive") for s in range(10) for lr in (1e-4, 3e-4)]
    for i in (0, 25):
        assert_same(configs[i], sweep.loader.load_sweep_config(sweep.master, jobs[i]))
    configs[0].optim.lr = 1.0  # every job has its own copy
    assert configs[1].optim.lr == 3e-4 and composer.compose(jobs[0]).optim.lr == 1e-4


def test_a_value_override_that_meets_a_base_override_is_composed_by_hydra(sweep: Sweep) -> None:
    composer = SweepComposer(sweep.loader, sweep.master)
    # a dict on a config group's key is no group choice: Hydra merges it after composing, in command-line order
    assert composer.compose(JOBS["group-key-dict"]).profile.nsys.start_step == 2
    assert composer.fallbacks == 1
