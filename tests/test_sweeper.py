"""``hydra/sweeper=automodel_basic``: the same jobs, in the same batches, as Hydra's basic sweeper; no second compose
of every job when our launcher runs them (which composes and validates every job before submitting any)."""

from __future__ import annotations

import typing as tp
from pathlib import Path

import pytest
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, RunMode
from omegaconf import OmegaConf

from hydra_plugins.automodel_hydra_launcher.launcher import AutomodelLauncher
from hydra_plugins.automodel_hydra_launcher.sweeper import AutomodelSweeper
from tests.helpers import CONF, compose_cfg

Batch = list[list[str]]


def _returned(status: JobStatus, value: tp.Any) -> JobReturn:
    """A JobReturn as a launcher fills it in, through Hydra's public setters."""
    ret = JobReturn()
    ret.status = status
    ret.return_value = value
    return ret


class Recorder:
    """Stands in for the launcher: records each batch and its first job number, returns a completed job each."""

    def __init__(self) -> None:
        self.batches: list[tuple[Batch, int]] = []

    def launch(self, job_overrides: tp.Sequence[tp.Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        self.batches.append(([list(o) for o in job_overrides], initial_job_idx))
        return [_returned(JobStatus.COMPLETED, None) for _ in job_overrides]


class RecordingAutomodelLauncher(AutomodelLauncher, Recorder):
    """Our launcher (so the sweeper trusts it to validate), recording instead of planning."""

    def __init__(self) -> None:
        AutomodelLauncher.__init__(self)
        Recorder.__init__(self)

    def launch(self, job_overrides: tp.Sequence[tp.Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        return Recorder.launch(self, job_overrides, initial_job_idx)


class RecordingForeignLauncher(Launcher, Recorder):
    """Any other launcher (not ours): the sweeper must still validate every job first."""

    def __init__(self) -> None:
        Recorder.__init__(self)

    def setup(self, **_: tp.Any) -> None:
        pass

    def launch(self, job_overrides: tp.Sequence[tp.Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
        return Recorder.launch(self, job_overrides, initial_job_idx)


def sweep(overrides: list[str], tmp_path: Path, launchers: dict[str, Recorder],
          validated: list[Batch] | None = None) -> dict[str, list[tuple[Batch, int]]]:
    """Run one sweep as ``python train.py -m OVERRIDES`` does (Hydra's multirun: compose in MULTIRUN mode,
    instantiate the sweeper, sweep the task overrides) under each sweeper named in ``launchers`` (``basic``:
    Hydra's, as Hydra instantiates it; ``automodel_basic``: ours, from the same ``hydra.sweeper`` settings), each
    with its recording launcher. Returns each sweeper's recorded batches."""
    out = {}
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        loader = GlobalHydra.instance().config_loader()
        # Hydra's own sweeper as the reference (the project's config selects ours)
        cfg = loader.load_configuration("llm_finetune", [*overrides, f"hydra.sweep.dir={tmp_path}",
                                                         "hydra/sweeper=basic"], run_mode=RunMode.MULTIRUN)
        context = HydraContext(config_loader=loader, callbacks=tp.cast(tp.Any, None))
        task = tp.cast(list[str], OmegaConf.to_container(cfg.hydra.overrides.task, resolve=False))
        for name, launcher in launchers.items():
            sweeper: Sweeper
            if name == "basic":
                sweeper = Plugins.instance().instantiate_sweeper(hydra_context=context, task_function=lambda _: None,
                                                                 config=cfg)
                assert type(sweeper).__name__ == "BasicSweeper"
            else:
                sweeper = AutomodelSweeper(max_batch_size=cfg.hydra.sweeper.max_batch_size,
                                           params=cfg.hydra.sweeper.params)
                sweeper.setup(hydra_context=context, task_function=lambda _: None, config=cfg)
            sweeper.launcher = tp.cast(Launcher, launcher)
            # Hydra's validation compose, recorded instead (slow, and not what is compared)
            saved = Sweeper.validate_batch_is_legal
            Sweeper.validate_batch_is_legal = (  # type: ignore[method-assign]
                lambda self, batch: validated.append([list(j) for j in batch]) if validated is not None else None)
            try:
                sweeper.sweep(arguments=task)
            finally:
                Sweeper.validate_batch_is_legal = saved  # type: ignore[method-assign]
            out[name] = launcher.batches
    assert (tmp_path / "multirun.yaml").exists()
    return out


def ours(overrides: list[str], tmp_path: Path, launcher: Recorder | None = None,
         validated: list[Batch] | None = None) -> list[tuple[Batch, int]]:
    return sweep(overrides, tmp_path, {"automodel_basic": launcher or Recorder()}, validated)["automodel_basic"]


MIX = [
    "seed=range(0,3)",                        # range
    "optim.lr=1e-4,3e-4",                     # list
    "launcher=slurm",                         # a config group choice
    "profile=glob(n*)",                       # glob over a config group: none, nsys
    "optim.weight_decay=choice(0.0,0.1)",     # choice
    "+extra.tag=a,b",                         # add a new key, swept
    "~dry_run",                               # delete
    "++slurm.env_vars.HF_TOKEN=${HF_TOKEN}",  # force add, an interpolation kept as text
    "step_scheduler.max_steps=7",             # a plain value in every job
]


@pytest.mark.parametrize("overrides", [
    MIX,
    ["sweep=lr_seed"],                            # hydra.sweeper.params from a sweep file: 3 x 2 jobs
    ["sweep=lr_seed", "seed=5,6,7", "optim.lr=1e-3"],  # the command line replaces a key of the params
    ["seed=1,2,3,4,5", "hydra.sweeper.max_batch_size=2"],  # batches of 2, job numbers running on
    ["dry_run=true"],                              # one job
], ids=["mix", "params", "params-narrowed", "batches", "single"])
def test_same_jobs_and_batches_as_hydras_basic_sweeper(overrides: list[str], tmp_path: Path) -> None:
    got = sweep(overrides, tmp_path, {"basic": Recorder(), "automodel_basic": Recorder()})
    assert got["automodel_basic"] == got["basic"]
    assert sum(len(b) for b, _ in got["basic"]) > 0


def test_the_mix_expands_as_documented(tmp_path: Path) -> None:
    ((jobs, first),) = ours(MIX, tmp_path)
    assert first == 0 and len(jobs) == 3 * 2 * 2 * 2 * 2
    assert jobs[0] == ["seed=0", "optim.lr=0.0001", "launcher=slurm", "profile=none", "optim.weight_decay=0.0",
                       "+extra.tag=a", "~dry_run=null",
                       r"++slurm.env_vars.HF_TOKEN=$\{HF_TOKEN\}", "step_scheduler.max_steps=7"]
    assert jobs[-1][:6] == ["seed=2", "optim.lr=0.0003", "launcher=slurm", "profile=nsys", "optim.weight_decay=0.1",
                            "+extra.tag=b"]


def test_batches_number_jobs_on(tmp_path: Path) -> None:
    batches = ours(["seed=1,2,3,4,5", "hydra.sweeper.max_batch_size=2"], tmp_path)
    assert [(len(b), first) for b, first in batches] == [(2, 0), (2, 2), (1, 4)]


def test_our_launcher_skips_the_validation_compose_any_other_keeps_it(tmp_path: Path) -> None:
    validated: list[Batch] = []
    ours(["seed=1,2,3"], tmp_path / "ours", RecordingAutomodelLauncher(), validated)
    assert validated == []
    other = RecordingForeignLauncher()
    ours(["seed=1,2,3"], tmp_path / "other", other, validated)
    assert validated == [[["seed=1"], ["seed=2"], ["seed=3"]]] == [b for b, _ in other.batches]


def test_a_failed_job_raises_after_its_batch(tmp_path: Path) -> None:
    class Failing(Recorder):
        def launch(self, job_overrides: tp.Sequence[tp.Sequence[str]], initial_job_idx: int) -> list[JobReturn]:
            super().launch(job_overrides, initial_job_idx)
            return [_returned(JobStatus.FAILED, ValueError("slurm.nodes=0: must be >= 1"))]

    launcher = Failing()
    with pytest.raises(ValueError, match="slurm.nodes=0"):
        ours(["seed=1,2", "hydra.sweeper.max_batch_size=1"], tmp_path, launcher)
    assert len(launcher.batches) == 1, "the second batch is not launched"


def test_interval_sweeps_are_refused_as_basic_sweeper_refuses_them(tmp_path: Path) -> None:
    with pytest.raises(HydraException, match=r"does not support sweep type : INTERVAL_SWEEP"):
        ours(["optim.lr=interval(0.1,0.2)"], tmp_path)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_bad_max_batch_size_is_one_clear_line(bad: object) -> None:
    with pytest.raises(ValueError, match=rf"^hydra.sweeper.max_batch_size={bad!r}: must be a positive number"):
        AutomodelSweeper(max_batch_size=bad)  # type: ignore[arg-type]


def test_hydra_sweeper_automodel_basic_selects_it_with_its_settings() -> None:
    # by name: Hydra's plugin scan re-executes plugin modules, making new class objects
    name = f"{AutomodelSweeper.__module__}.{AutomodelSweeper.__qualname__}"
    assert name in [f"{c.__module__}.{c.__qualname__}" for c in Plugins.instance().discover(Sweeper)]
    cfg = compose_cfg(["hydra/sweeper=automodel_basic", "hydra.sweeper.max_batch_size=3", "sweep=lr_seed"])
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        context = HydraContext(config_loader=GlobalHydra.instance().config_loader(),
                               callbacks=tp.cast(tp.Any, None))
        sweeper: tp.Any = Plugins.instance().instantiate_sweeper(hydra_context=context,
                                                                 task_function=lambda _: None, config=cfg)
    assert f"{type(sweeper).__module__}.{type(sweeper).__qualname__}" == name
    assert sweeper.max_batch_size == 3 and sweeper.params == {"optim.lr": "1e-3,3e-3,1e-2", "seed": "1,2"}
    assert sweeper._launcher_validates(), type(sweeper.launcher)
