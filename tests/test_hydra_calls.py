"""A Hydra task function that is not ours (any Hydra app) under ``hydra/launcher=automodel``: each job runs as one
process on the backend ``hydra.launcher.backend`` names (a *call job*, automodel_hydra/call.py), never in the
launching process; SkyPilot refuses it with the reason.

Hydra's own launcher suites (``LauncherTestSuite``, ``IntegrationTestSuite``) run against two real backend paths:
the interactive backend (a local process per job), and the Slurm backend's local twin: the same planner, renderer
and submit, with the stand-ins of tests/standins/slurm on PATH (``sbatch`` runs the rendered script with bash as a
one-task batch step, ``srun`` runs its one task, ``sacct`` answers from their job table). The same suites against
the project's real Slurm test cluster are marked ``slurm``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite
from omegaconf import DictConfig, open_dict

from automodel_hydra import config
from automodel_hydra.backends.interactive import Interactive
from automodel_hydra.backends.skypilot import SkyPilot
from automodel_hydra.backends.slurm import CALL_DEFAULTS, Slurm
from automodel_hydra.plan import JobSpec
from automodel_hydra.schema import ConfigError
from hydra_plugins.automodel_hydra_launcher._core import call_options
from tests.helpers import CONF, ROOT

STANDINS = ROOT / "tests" / "standins" / "slurm"
TWIN = ["hydra.launcher.backend=slurm"]


@pytest.fixture
def slurm_twin(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The Slurm stand-ins first on PATH (before a real Slurm client), with their own job table; no SLURM_CONF."""
    table = tmp_path_factory.mktemp("slurm-standin")
    monkeypatch.setenv("PATH", f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_SLURM_DIR", str(table))
    monkeypatch.delenv("SLURM_CONF", raising=False)
    return table


def _call_job(job_dir: Path) -> JobSpec:
    return JobSpec(job_dir=job_dir, job_name="app", job_num=0, call=b"pickled call")


def _cfg(section: str, **options: tp.Any) -> config.TrainConfig:
    return config.load({section: options, "checkpoint": {"enabled": False}, "output_dir": "/o"})


def _launcher_config(*overrides: str) -> DictConfig:
    """The composed Hydra config of a run under our launcher (its ``hydra.launcher`` node)."""
    with initialize_config_dir(config_dir=str(CONF), version_base=None):
        cfg = compose("llm_finetune", overrides=["hydra/launcher=automodel", *overrides], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.job.name = "app"
    return cfg


# ----------------------------------------------------------------------------------------------- planning (fast)


def test_slurm_plans_a_call_as_one_task_of_the_call_runner_without_the_rank_machinery(tmp_path: Path) -> None:
    plan = Slurm().plan(_cfg("slurm", **{**CALL_DEFAULTS, "job_name": "app", "partition": "debug"}),
                        _call_job(tmp_path / "0"))
    script = plan.files["sbatch.sh"]
    srun = script.splitlines()[-1]
    assert srun.startswith("srun ") and "--ntasks=1" in srun
    assert srun.endswith('-m automodel_hydra.call "$AUTOMODEL_JOB_DIR"/launch/call.pkl')
    assert "#SBATCH --ntasks-per-node=1" in script and "#SBATCH --partition=debug" in script
    # no rendezvous, no worker, and no USR2 warning (its default action would kill a function that has no handler)
    for absent in ("MASTER_ADDR", "automodel_hydra.worker", "--signal", "gpus-per-node", "OMP_NUM_THREADS"):
        assert absent not in script, absent


def test_interactive_plans_a_call_as_one_process_not_torchrun(tmp_path: Path) -> None:
    job = _call_job(tmp_path / "0")
    plan = Interactive().plan(_cfg("interactive"), job)
    (name, script), = plan.files.items()
    assert name == "call.sh"
    assert script.splitlines()[-1].endswith(f"-m automodel_hydra.call {job.call_file}")
    assert "torch.distributed.run" not in script and plan.request.nproc == 1
    assert job.result_file == job.launch_dir / "call_result.pkl"  # what "completed" means for a call job


def test_skypilot_refuses_a_call_job_naming_the_reason(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"hydra\.launcher\.backend='skypilot' .*cloud node, not in the sweep dir"):
        SkyPilot().plan(_cfg("skypilot"), _call_job(tmp_path / "0"))


@pytest.mark.parametrize(("overrides", "message"), [
    (["hydra.launcher.backend=skypilot"], r"hydra\.launcher\.backend='skypilot' .*cloud node"),
    (["hydra.launcher.backend=slurmm"], r"hydra\.launcher\.backend='slurmm' is invalid: one of interactive, slurm"),
    (["hydra.launcher.backend=slurm", "hydra.launcher.slurm.nodes=2"],
     r"hydra\.launcher\.slurm\.nodes=2 is invalid: 1: .* one process per job; .*submitit_slurm"),
    (["hydra.launcher.interactive.nproc_per_node=4"], r"hydra\.launcher\.interactive\.nproc_per_node='4' is invalid"),
    (["hydra.launcher.slurm.partition=debug"],
     r"hydra\.launcher\.slurm=.* options of the slurm backend, and hydra\.launcher\.backend=interactive"),
])
def test_bad_call_options_are_one_line_naming_the_key(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        call_options(_launcher_config(*overrides))


def test_call_options_default_to_interactive_and_a_slurm_job_named_after_the_hydra_job() -> None:
    assert call_options(_launcher_config())[0] == "interactive"
    backend, section = call_options(_launcher_config("hydra.launcher.backend=slurm", "hydra.launcher.slurm.time=5"))
    assert backend == "slurm" and section["job_name"] == "app" and section["time"] == "5"
    assert section["gpus_per_node"] == 0 and section["ntasks_per_node"] == 1


# ----------------------------------------------------------------------------------------------- real runs (slow)

APP = """\
import os, sys
from pathlib import Path
import hydra
SUBMITTER = os.getpid()

@hydra.main(version_base=None, config_path=None)
def my_task(cfg):
    row = {"x": cfg.x, "pid": os.getpid(), "submitter": SUBMITTER, "job": os.environ.get("SLURM_JOB_ID"),
           "procid": os.environ.get("SLURM_PROCID"), "env": os.environ.get("FROM_ENV_SET"), "cwd": os.getcwd()}
    Path(os.environ["ROWS"], f"{cfg.x}.json").write_text(__import__("json").dumps(row))
    if cfg.x == 3:
        raise KeyError("boom in the task")
    return cfg.x * 10

if __name__ == "__main__":
    my_task()
"""


def _run_app(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[int, dict[str, tp.Any]]]:
    app, rows = tmp_path / "my_app.py", tmp_path / "rows"
    app.write_text(APP)
    rows.mkdir(exist_ok=True)
    env = {**os.environ, "ROWS": str(rows), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(app), "-m", "hydra/launcher=automodel", *args], cwd=tmp_path,
                          capture_output=True, text=True, env=env, timeout=120)
    return proc, {int(p.stem): json.loads(p.read_text()) for p in rows.glob("*.json")}


@pytest.mark.slow  # runs an app and its jobs as real processes
@pytest.mark.parametrize("backend", ["interactive", "slurm"])
def test_a_foreign_task_function_runs_on_the_chosen_backend_never_in_the_launching_process(
        backend: str, tmp_path: Path, slurm_twin: Path) -> None:
    """Under a launcher named Slurm, another task function must not run on the submitting machine's process; it
    runs as one process per job, Hydra's env_set and chdir applied there, and its values come back."""
    sweep = tmp_path / "S"
    proc, rows = _run_app(tmp_path, f"hydra.launcher.backend={backend}", "+x=1,2", f"hydra.sweep.dir={sweep}",
                          "+hydra.job.env_set.FROM_ENV_SET=yes", "hydra.job.chdir=true")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(rows) == [1, 2]
    for x, row in rows.items():
        assert row["pid"] != row["submitter"], "the task function ran in the launching process"
        assert row["env"] == "yes" and row["cwd"] == str(sweep / str(x - 1))
        assert (sweep / str(x - 1) / ".hydra" / "overrides.yaml").exists()
        assert (sweep / str(x - 1) / "my_app.log").exists()
    if backend == "slurm":  # one task of a Slurm batch script: srun's variables, a job of the array each
        assert [rows[x]["procid"] for x in (1, 2)] == ["0", "0"] and rows[1]["job"] != rows[2]["job"]
        assert (sweep / "launch" / "sbatch.sh").read_text().count("--ntasks=1") == 1
    manifest = json.loads((sweep / "launch" / "manifest.json").read_text())
    assert [r["backend"] for r in manifest["jobs"]] == [backend, backend]


@pytest.mark.slow
def test_a_foreign_task_functions_exception_comes_back_as_its_own(tmp_path: Path, slurm_twin: Path) -> None:
    proc, rows = _run_app(tmp_path, *TWIN, "+x=2,3", f"hydra.sweep.dir={tmp_path / 'S'}")
    assert proc.returncode == 1 and sorted(rows) == [2, 3]
    assert "KeyError: 'boom in the task'" in proc.stderr
    assert (tmp_path / "S" / "1" / "launch" / "call_error.pkl").exists()
    assert not (tmp_path / "S" / "1" / "launch" / "call_result.pkl").exists()


@pytest.mark.slow
def test_callbacks_of_a_foreign_task_function_see_its_real_outcome_in_the_job(tmp_path: Path,
                                                                              slurm_twin: Path) -> None:
    """As under Hydra's basic launcher: on_job_end runs where run_job runs, with the job's return value."""
    record = tmp_path / "ends.jsonl"
    proc, _ = _run_app(tmp_path, *TWIN, "+x=1,2", f"hydra.sweep.dir={tmp_path / 'S'}",
                       "+hydra.callbacks.rec._target_=tests.hydra_callbacks.RecordJobEnd",
                       f"+hydra.callbacks.rec.path={record}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    ends = sorted((json.loads(line) for line in record.read_text().splitlines()), key=lambda r: r["num"])
    assert [(e["num"], e["status"], e["value"]) for e in ends] == [(0, "COMPLETED", 10), (1, "COMPLETED", 20)]


# ----------------------------------------------------------------------------------------------- Hydra's suites


@pytest.mark.slow  # every job is a real process
@pytest.mark.usefixtures("slurm_twin")
@pytest.mark.parametrize(("launcher_name", "overrides"), [("automodel", TWIN)], ids=["slurm-twin"])
class TestHydraLauncherSuite(LauncherTestSuite):
    pass


@pytest.mark.slow
@pytest.mark.usefixtures("slurm_twin")
@pytest.mark.parametrize(("task_launcher_cfg", "extra_flags"), [({}, ["-m", "hydra/launcher=automodel", *TWIN])],
                         ids=["slurm-twin"])
class TestHydraIntegrationSuite(IntegrationTestSuite):
    pass


#: The real cluster (tests/slurm_cluster.py): the test partition, a short limit, CPU only.
CLUSTER = ["hydra.launcher.backend=slurm", "hydra.launcher.slurm.partition=debug", "hydra.launcher.slurm.time=5"]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.parametrize(("launcher_name", "overrides"), [("automodel", CLUSTER)], ids=["slurm-cluster"])
class TestHydraLauncherSuiteOnTheCluster(LauncherTestSuite):
    pass


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.usefixtures("slurm_cluster")
@pytest.mark.parametrize(("task_launcher_cfg", "extra_flags"), [({}, ["-m", "hydra/launcher=automodel", *CLUSTER])],
                         ids=["slurm-cluster"])
class TestHydraIntegrationSuiteOnTheCluster(IntegrationTestSuite):
    pass


@pytest.mark.slow  # runs train.py
def test_launcher_options_for_foreign_functions_are_refused_for_ours(tmp_path: Path) -> None:
    """train.py's jobs route by launcher=... and their own sections; hydra.launcher.backend would be ignored."""
    from tests.helpers import train_py

    proc = train_py("-m", "hydra.launcher.backend=slurm", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'S'}",
                    check=False, timeout=120)
    assert proc.returncode == 2
    assert "error: hydra.launcher.backend is set: " in proc.stdout and "launcher=slurm" in proc.stdout
    assert not (tmp_path / "S" / "launch").exists()
