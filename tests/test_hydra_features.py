"""Hydra's own features keep their meaning under our launcher, and jobs never share state.

Runs ``train.py`` as a user would, with real torchrun ranks (1-2 ranks, 2-4 steps): ``hydra.job.env_set``,
``hydra.sweeper.max_batch_size``, job callbacks, ``hydra.job.chdir``, each job's own log; sweep jobs that name one
checkpoint dir, a resume past ``max_steps``, busy and default run dirs; launcher keys without their launcher;
``hydra/launcher=submitit_local|submitit_slurm``, whose tasks are the ranks of one job.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import config, driver
from automodel_hydra import records as run_records
from automodel_hydra.plan import JobSpec
from automodel_hydra.schema import ConfigError
from tests.helpers import ROOT, metrics

ONE = ["interactive.nproc_per_node=1"]
TINY = ["step_scheduler.max_steps=2", "step_scheduler.log_interval=1"]
CALLBACK = "tests.hydra_callbacks.RecordJobEnd"
LOG_RETURN = "hydra.experimental.callbacks.LogJobReturnCallback"
PROBE_VAR = "AUTOMODEL_TEST_PROBE"

#: Imported by every Python process the test starts (through PYTHONPATH); a torchrun rank records what it sees.
SITECUSTOMIZE = f"""\
import json, os
if os.environ.get("PROBE_DIR") and "RANK" in os.environ and "TORCHELASTIC_RUN_ID" in os.environ:
    with open("/proc/self/cmdline", "rb") as f:
        argv = f.read().decode().split("\\0")
    with open(os.path.join(os.environ["PROBE_DIR"], f"{{os.getpid()}}.json"), "w") as f:
        json.dump({{"rank": int(os.environ["RANK"]), "value": os.environ.get("{PROBE_VAR}"), "argv": argv}}, f)
"""


def train(*args: str, cwd: Path | None = None, env: tp.Mapping[str, str] | None = None,
          timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python train.py ARGS`` in ``cwd``, stdout and stderr merged; never raises on a non-zero exit."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_", "HYDRA_FULL_ERROR"))}
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env={**base, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"train.py exited {proc.returncode}:\n{proc.stdout[-4000:]}"
    return proc


def errors(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("error:")]


def records(path: Path) -> list[dict[str, tp.Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def result(job_dir: Path) -> dict[str, tp.Any]:
    return tp.cast(dict[str, tp.Any], json.loads((job_dir / "result.json").read_text()))


# ----------------------------------------------------------------------------------------------- 1. no shared state


def _prepared(job_dir: Path, num: int | None, ckpt: str | None, workdir: Path | None = None) -> driver.Prepared:
    cfg = config.load_rank({"output_dir": str(job_dir), "checkpoint": {"dir": ckpt}})
    return driver.Prepared(cfg, JobSpec(job_dir=job_dir, job_name="train", job_num=num, workdir=workdir), False)


def test_sweep_jobs_that_name_one_absolute_checkpoint_dir_are_refused(tmp_path: Path) -> None:
    sweep, shared = tmp_path / "S", tmp_path / "shared"
    jobs = [_prepared(sweep / str(n), n, str(shared)) for n in (0, 1)]
    with pytest.raises(ConfigError) as e:
        driver.refuse_shared_paths(jobs, sweep)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"checkpoint.dir='{shared}'") and "job 0 and job 1" in line
    # one job dir for two jobs (a hydra.sweep.subdir without the job's number): results, metrics, logs shared
    same = [_prepared(sweep / "x", n, None) for n in (0, 1)]
    with pytest.raises(ConfigError, match=r"^output_dir=.*hydra.sweep.subdir must name the job"):
        driver.refuse_shared_paths(same, sweep)


def test_checkpoint_dirs_of_their_own_pass_and_a_relative_one_is_under_each_job_dir(tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    distinct = [_prepared(sweep / str(n), n, str(tmp_path / f"ckpt{n}")) for n in (0, 1)]
    chdir = [_prepared(sweep / str(n), n, "ckpt", workdir=sweep / str(n)) for n in (0, 1)]  # hydra.job.chdir=true
    here = [_prepared(sweep / str(n), n, "ckpt") for n in (0, 1)]  # relative, no chdir: still each job's own
    single = [_prepared(tmp_path / "R", None, str(tmp_path / "shared"))]
    for jobs in (distinct, chdir, here, single):
        driver.refuse_shared_paths(jobs, sweep if jobs is not single else None)
    assert [driver.checkpoint_path(p) for p in here] == [sweep / "0" / "ckpt", sweep / "1" / "ckpt"]
    assert [p.cfg.checkpoint_dir for p in here] == [str(sweep / "0" / "ckpt"), str(sweep / "1" / "ckpt")]


def test_a_later_batch_of_the_same_sweep_may_not_write_an_earlier_jobs_checkpoint_dir(tmp_path: Path) -> None:
    """A sweeper that launches in batches (``hydra.sweeper.max_batch_size=1``): job 1 comes alone, after job 0."""
    sweep, shared = tmp_path / "S", tmp_path / "shared"
    (sweep / "launch").mkdir(parents=True)
    earlier = {"job_dir": str(sweep / "0"), "job_num": 0,
               "paths": {"output_dir": str(sweep / "0"), "checkpoint.dir": str(shared)}}
    (sweep / "launch" / "manifest.json").write_text(json.dumps({"jobs": [earlier]}))
    with pytest.raises(ConfigError, match="earlier launch of this sweep"):
        driver.refuse_shared_paths([_prepared(sweep / "1", 1, str(shared))], sweep)
    driver.refuse_shared_paths([_prepared(sweep / "0", 0, str(shared))], sweep)  # job 0 rerun: its own dir


@pytest.mark.slow
def test_second_sweep_point_does_not_resume_from_the_firsts_checkpoint(tmp_path: Path) -> None:
    """``-m seed=1,2 checkpoint.dir=ckpt`` (relative), one job after the other: job 1 trains its own steps 1..2
    in its own dir; the same sweep with one absolute dir is refused in one line, before anything is written."""
    sweep, shared = tmp_path / "S", tmp_path / "shared"
    ok(train("-m", "seed=1,2", "checkpoint.dir=ckpt", *ONE, "interactive.max_parallel=1", *TINY,
             f"hydra.sweep.dir={sweep}", cwd=tmp_path))
    for n in (0, 1):
        assert [r["step"] for r in metrics(sweep / str(n))] == [1, 2], f"job {n} resumed from another's checkpoint"
        assert (sweep / str(n) / "ckpt" / "step-2" / ".complete").exists()
        assert result(sweep / str(n))["loss"] is not None
    assert not (tmp_path / "ckpt").exists()
    manifest = run_records.manifest_jobs(sweep)  # (stored relative to the sweep dir: read as paths here)
    assert [j["checkpoint_dir"] for j in manifest] == [str(sweep / "0" / "ckpt"), str(sweep / "1" / "ckpt")]
    refused = train("-m", "seed=1,2", f"checkpoint.dir={shared}", *ONE, *TINY, f"hydra.sweep.dir={tmp_path / 'T'}",
                    cwd=tmp_path)
    assert refused.returncode == 2 and errors(refused) == [
        f"error: checkpoint.dir='{shared}' is invalid: sweep job 0 and job 1 would all write there (each would "
        "read, resume from or overwrite the others' files); give each job its own: a relative checkpoint.dir is "
        "each job's own, under its job dir"]
    assert not shared.exists() and not (tmp_path / "T" / "0" / "launch").exists()


@pytest.mark.slow
def test_resuming_past_max_steps_fails_in_one_line_and_keeps_the_result(tmp_path: Path) -> None:
    run = tmp_path / "R"
    ok(train(*ONE, "step_scheduler.max_steps=4", "step_scheduler.log_interval=1", f"hydra.run.dir={run}",
             cwd=tmp_path))
    kept = {name: (run / name).read_bytes() for name in ("result.json", "metrics.jsonl")}
    assert json.loads(kept["result.json"])["loss"] is not None
    proc = train(*ONE, "step_scheduler.max_steps=2", f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:]
    (line,) = errors(proc)
    assert "step_scheduler.max_steps=2" in line and "step 4" in line and str(run / "checkpoints" / "step-4") in line
    assert "Traceback" not in proc.stdout
    assert {name: (run / name).read_bytes() for name in kept} == kept


@pytest.mark.slow
def test_two_commands_started_together_get_their_own_default_run_dirs(tmp_path: Path) -> None:
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(lambda _: train(*ONE, "dry_run=true", cwd=tmp_path), range(2)))
    for proc in procs:
        ok(proc)
    dirs = [p.parent.parent for p in (tmp_path / "outputs").glob("*/*/launch/torchrun.sh")]
    assert len(set(dirs)) == 2, dirs


@pytest.mark.slow
def test_a_dir_holding_a_pending_slurm_job_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    """The job's record says Slurm job 4242; the scheduler (a stand-in squeue; sacct without accounting) says it
    is still PENDING: a second command in that dir must stop before rewriting anything."""
    run, bin_dir = tmp_path / "R", tmp_path / "bin"
    (run / "launch").mkdir(parents=True)
    bin_dir.mkdir()
    record = {"backend": "slurm", "ref": {"job_id": "4242", "submitted_at": 0}, "job_ids": ["4242"],
              "job_dir": str(run), "job_num": None, "overrides": []}
    (run / "launch" / "submission.json").write_text(json.dumps(record))
    (run / "launch" / "sbatch.sh").write_text("# the pending job's script\n")
    (bin_dir / "sacct").write_text("#!/bin/sh\necho 'sacct: error: Slurm accounting storage is disabled' >&2\nexit 1\n")
    (bin_dir / "squeue").write_text('#!/bin/sh\ncase "$*" in *--jobs=4242*) echo "4242|PENDING|Priority";; esac\n')
    for tool in ("sacct", "squeue"):
        (bin_dir / tool).chmod(0o755)
    before = {p: p.read_bytes() for p in (run / "launch").iterdir()}
    proc = train("launcher=slurm", "slurm.partition=debug", "dry_run=true", f"hydra.run.dir={run}", cwd=tmp_path,
                 env={"PATH": f"{bin_dir}:{os.environ['PATH']}"})
    assert proc.returncode == 2, proc.stdout[-3000:]
    (line,) = errors(proc)
    assert "4242" in line and "PENDING" in line and str(run) in line
    assert {p: p.read_bytes() for p in (run / "launch").iterdir()} == before


def test_a_relaunched_sweep_asks_the_scheduler_once_for_all_its_dirs(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A sweep relaunched over dirs that hold earlier Slurm jobs: one squeue (and one sacct) call for all of them,
    not one per job, and the pending one is named."""
    from automodel_hydra import records as run_records
    from automodel_hydra.plan import JobSpec, PreflightError

    bin_dir, calls = tmp_path / "bin", tmp_path / "calls"
    bin_dir.mkdir()
    jobs = []
    for n in range(3):
        run = tmp_path / str(n)
        (run / "launch").mkdir(parents=True)
        record = {"backend": "slurm", "ref": {"job_id": f"424{n}", "submitted_at": 0}, "job_ids": [f"424{n}"],
                  "job_dir": str(run), "job_num": n, "overrides": []}
        (run / "launch" / "submission.json").write_text(json.dumps(record))
        jobs.append(JobSpec(job_dir=run, job_name="train", overrides=(), job_num=n))
    (bin_dir / "sacct").write_text(f"#!/bin/sh\necho sacct >> {calls}\nexit 1\n")
    (bin_dir / "squeue").write_text(f'#!/bin/sh\necho squeue >> {calls}\necho "4242|PENDING|Priority"\n')
    for tool in ("sacct", "squeue"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    with pytest.raises(PreflightError, match="holds slurm job 4242, still PENDING"):
        run_records.refuse_if_busy(jobs)
    assert sorted(calls.read_text().split()) == ["sacct", "squeue"]


@pytest.mark.slow
def test_a_sweep_that_sbatch_refuses_ends_in_one_line_as_a_single_run_does(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Invalid account "
                                    "or account/partition combination specified' >&2\nexit 1\n")
    (bin_dir / "sbatch").chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}"}
    single = train("launcher=slurm", "slurm.partition=debug", f"hydra.run.dir={tmp_path / 'R'}", cwd=tmp_path, env=env)
    sweep = train("-m", "seed=1,2", "launcher=slurm", "slurm.partition=debug", f"hydra.sweep.dir={tmp_path / 'S'}",
                  cwd=tmp_path, env=env)
    for proc in (single, sweep):
        assert proc.returncode == 1 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
        (line,) = errors(proc)
        assert "Invalid account" in line


# ----------------------------------------------------------------------------------------------- 2. Hydra's features


@pytest.fixture(scope="module")
def features(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tp.Any]:
    """One real sweep that uses Hydra's features together: 3 points launched in batches of 2
    (``hydra.sweeper.max_batch_size``), ``hydra.job.chdir=true`` with a relative ``checkpoint.dir``, a per-job
    ``hydra.job.env_set`` value, and two job callbacks; 2 ranks per job."""
    base = tmp_path_factory.mktemp("features")
    sweep, probe, site = base / "S", base / "probe", base / "site"
    probe.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), "PROBE_DIR": str(probe)}
    proc = ok(train("-m", "seed=1,2,3", "hydra.sweeper.max_batch_size=2", "hydra.job.chdir=true", "checkpoint.dir=ckpt",
                    f"++hydra.job.env_set.{PROBE_VAR}=job${{hydra:job.num}}", "interactive.nproc_per_node=2", *TINY,
                    f"+hydra.callbacks.record._target_={CALLBACK}", f"+hydra.callbacks.record.path={base / 'ends'}",
                    f"+hydra.callbacks.log_return._target_={LOG_RETURN}", f"hydra.sweep.dir={sweep}",
                    cwd=base, env=env))
    seen = [json.loads(p.read_text()) for p in probe.glob("*.json")]
    return {"base": base, "sweep": sweep, "proc": proc, "seen": seen, "ends": records(base / "ends")}


@pytest.mark.slow
def test_env_set_reaches_every_rank_of_every_sweep_job(features: dict[str, tp.Any]) -> None:
    sweep = features["sweep"]
    by_job: dict[int, dict[int, str]] = {}
    for rank in features["seen"]:
        job = next(n for n in range(3) if f"{sweep / str(n)}/launch/job.yaml" in rank["argv"])
        by_job.setdefault(job, {})[rank["rank"]] = rank["value"]
    assert by_job == {n: {0: f"job{n}", 1: f"job{n}"} for n in range(3)}


@pytest.mark.slow
def test_env_set_is_exported_by_every_planned_slurm_script(tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    ok(train("-m", "seed=1,2", "launcher=slurm", "slurm.partition=debug", "dry_run=true",
             f"++hydra.job.env_set.{PROBE_VAR}=job${{hydra:job.num}}", f"hydra.sweep.dir={sweep}", cwd=tmp_path))
    line = f"export {PROBE_VAR}=job"
    for n in (0, 1):
        assert f"{line}{n}\n" in (sweep / str(n) / "launch" / "sbatch.sh").read_text()
    arrays = {}  # job dir -> the value the array script that runs it exports
    for script in (sweep / "launch").glob("sbatch*.sh"):
        text = script.read_text()
        value = next(x.split("=", 1)[1] for x in text.splitlines() if x.startswith(line))
        arrays.update({d: value for d in (str(sweep / str(n)) for n in (0, 1))  # `  DIR` or `  [TASK]=DIR`
                       if re.search(rf"^  (\[\d+\]=)?{re.escape(d)}$", text, re.MULTILINE)})
    assert arrays == {str(sweep / str(n)): f"job{n}" for n in (0, 1)}


@pytest.mark.slow
def test_batched_sweeper_leaves_one_manifest_and_status_sees_every_job(features: dict[str, tp.Any]) -> None:
    sweep = features["sweep"]
    jobs = json.loads((sweep / "launch" / "manifest.json").read_text())["jobs"]
    assert sorted(j["job_num"] for j in jobs) == [0, 1, 2]
    out = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "status", str(sweep), "--json"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert {row["job"]: row["state"] for row in json.loads(out)} == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED"}


@pytest.mark.slow
def test_job_callbacks_see_each_jobs_final_loss_in_its_own_context(features: dict[str, tp.Any]) -> None:
    sweep = features["sweep"]
    ends = sorted(features["ends"], key=lambda r: r["num"])
    assert [r["num"] for r in ends] == [0, 1, 2]
    for row in ends:
        job = sweep / str(row["num"])
        assert row["status"] == "COMPLETED" and row["value"] == result(job)["loss"]
        assert row["output_dir"] == str(job) and row["cwd"] == str(job)  # as run_job has them (chdir=true)
        assert f"Succeeded with return value: {row['value']}" in (job / "train.log").read_text()


@pytest.mark.slow
def test_chdir_gives_each_sweep_job_its_own_dir_as_working_dir(features: dict[str, tp.Any]) -> None:
    sweep = features["sweep"]
    for n in range(3):
        assert (sweep / str(n) / "ckpt" / "step-2" / ".complete").exists()
    assert not (features["base"] / "ckpt").exists()


@pytest.mark.slow
def test_each_sweep_jobs_log_starts_with_its_own_launch_line(features: dict[str, tp.Any]) -> None:
    sweep = features["sweep"]
    for n in range(3):
        lines = (sweep / str(n) / "train.log").read_text().splitlines()
        assert f"#{n} : seed={n + 1}" in lines[0], lines[:3]
        assert not [line for line in lines if " : seed=" in line and f"#{n} :" not in line]


@pytest.mark.slow
def test_job_callbacks_see_a_jobs_failure(tmp_path: Path) -> None:
    """The job passes every check before it starts and fails in its rank (its data file is not JSON lines)."""
    ends, data = tmp_path / "ends", tmp_path / "data.jsonl"
    data.write_text("not json\n")
    proc = train("-m", "data.source=jsonl", f"data.path={data}", *ONE, *TINY,
                 f"+hydra.callbacks.record._target_={CALLBACK}", f"+hydra.callbacks.record.path={ends}",
                 f"+hydra.callbacks.log_return._target_={LOG_RETURN}", f"hydra.sweep.dir={tmp_path / 'S'}",
                 cwd=tmp_path)
    assert proc.returncode != 0
    (row,) = records(ends)
    assert row["failed"] and "JobFailedError" in row["error"] and "FAILED" in row["error"]
    assert "JobFailedError" in (tmp_path / "S" / "0" / "train.log").read_text()  # LogJobReturnCallback's error


# ----------------------------------------------------------------------------------------------- 3. launcher keys


def test_a_launcher_key_without_its_launcher_is_named_with_the_fix() -> None:
    message = driver.unselected_section_message(["seed=1", "++slurm.nodes=4"])
    assert message is not None and message.startswith("++slurm.nodes=4: slurm.nodes") and "launcher=slurm" in message
    assert "launcher=skypilot" in tp.cast(str, driver.unselected_section_message(["skypilot.num_nodes=2"]))
    assert driver.unselected_section_message(["slurm=null", "launcher=slurm", "seed=1"]) is None


@pytest.mark.slow
@pytest.mark.parametrize("args, key, fix", [
    (["slurm.nodes=4"], "slurm.nodes", "launcher=slurm"),
    (["skypilot.num_nodes=2"], "skypilot.num_nodes", "launcher=skypilot"),
    (["launcher=slurm", "skypilot.cloud=aws"], "skypilot.cloud", "launcher=skypilot"),
    (["-m", "seed=1,2", "slurm.nodes=1,2"], "slurm.nodes", "launcher=slurm"),
])
def test_train_py_names_the_key_and_the_launcher_it_needs(tmp_path: Path, args: list[str], key: str,
                                                          fix: str) -> None:
    proc = train(*args, "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 2 and "AssertionError" not in proc.stdout and "Traceback" not in proc.stdout
    assert proc.stdout.strip().count("\n") == 0, proc.stdout  # one line
    assert key in proc.stdout and fix in proc.stdout


# ----------------------------------------------------------------------------------------------- 4. submitit's tasks


def test_a_task_of_another_launchers_job_is_recognised() -> None:
    assert driver.launched_rank({"SUBMITIT_EXECUTOR": "slurm", "SLURM_PROCID": "0"}) == "submitit (slurm)"
    assert driver.launched_rank({"SUBMITIT_EXECUTOR": "local", "SUBMITIT_LOCAL_GLOBALID": "1"}) == "submitit (local)"
    assert driver.launched_rank({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4"}) == "srun"
    # a batch script, a 1-task step, or plain Python: plan a job as anywhere
    assert driver.launched_rank({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}) is None
    assert driver.launched_rank({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}) is None
    assert driver.launched_rank({}) is None


@pytest.mark.slow
def test_submitit_local_tasks_are_the_ranks_of_one_job(tmp_path: Path) -> None:
    """``hydra/launcher=submitit_local`` with 2 tasks: one job of world size 2, not a torchrun per task."""
    sweep, ends = tmp_path / "S", tmp_path / "ends"
    ok(train("-m", "hydra/launcher=submitit_local", "hydra.launcher.tasks_per_node=2", "seed=1", *TINY,
             "checkpoint.enabled=false", f"+hydra.callbacks.record._target_={CALLBACK}",
             f"+hydra.callbacks.record.path={ends}", f"hydra.sweep.dir={sweep}", cwd=tmp_path))
    job = sweep / "0"
    rows = metrics(job)
    assert [r["step"] for r in rows] == [1, 2] and {r["world_size"] for r in rows} == {2}
    assert not (job / "launch" / "torchrun.sh").exists(), "a task planned a new job"
    assert [r["value"] for r in records(ends)] == [result(job)["loss"]] * 2  # each task's JobReturn


@pytest.mark.slow
def test_srun_tasks_must_share_a_run_dir(tmp_path: Path) -> None:
    proc = train(*ONE, cwd=tmp_path, env={"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_TASKS": "2",
                                          "SLURM_JOB_ID": "7", "SLURM_LOCALID": "0"})
    assert proc.returncode == 2, proc.stdout[-3000:]
    (line,) = errors(proc)
    assert "hydra.run.dir" in line and "srun" in line


@pytest.mark.slurm
@pytest.mark.slow
def test_submitit_slurm_tasks_on_two_nodes_are_the_ranks_of_one_job(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    ok(train("-m", "hydra/launcher=submitit_slurm", "hydra.launcher.nodes=2", "hydra.launcher.tasks_per_node=1",
             "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=10", "hydra.launcher.signal_delay_s=30",
             "seed=1,2", *TINY, "checkpoint.enabled=false", f"hydra.sweep.dir={sweep}", cwd=tmp_path,
             env={"SLURM_CONF": os.environ["SLURM_CONF"]}))
    for n in (0, 1):
        rows = metrics(sweep / str(n))
        assert [r["step"] for r in rows] == [1, 2] and {r["world_size"] for r in rows} == {2}
        assert result(sweep / str(n))["loss"] is not None
