"""Every run's final word tells the truth, for real: ``python train.py`` as a user runs it, with real torchrun and
ft_launcher processes (2 gloo ranks on CPU), real pipes and signals, and the shared Slurm test cluster.

A rank that returns early under ft_launcher is no COMPLETED job on any launcher or in any command; each attempt
keeps its own nsys reports; Hydra's runtime values reach a function recipe resolved, and an error a restart repeats
is not restarted; a closed pipe costs no result; variables left in the submitting shell decide nothing; a sweep
dir too long is one line; the terminal shows a few lines per restart and one traceback per failure; small truths.
The recipe is tests/fault_recipe.py; ``nsys`` is the STAND-IN of tests/standins/."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import fault_tolerance as ftm
from automodel_hydra.backends import interactive
from tests.helpers import ROOT, broken_model_dir

needs_ft = pytest.mark.skipif(interactive.find_ft_launcher() is None,
                              reason="ft_launcher not installed (pip install '.[fault-tolerance]')")
STANDINS = ROOT / "tests" / "standins"
#: What a notebook, an earlier torchrun or an ft_launcher job leaves in a shell.
LEFTOVERS = {"TORCHELASTIC_RUN_ID": "notebook", "TORCHELASTIC_RESTART_COUNT": "7", "RANK": "5", "LOCAL_RANK": "3",
             "WORLD_SIZE": "8", "SKYPILOT_NODE_RANK": "2", "SKYPILOT_NUM_NODES": "4",
             "FT_RANK_MONITOR_IPC_SOCKET": "/tmp/no-such-rank-monitor.sock"}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SUBMITIT_", "HYDRA_FULL_ERROR"))}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return {**env, **extra}


def _config(tmp_path: Path, fault: dict[str, tp.Any], *, launcher: str = "interactive", ft: dict[str, tp.Any] | None,
            extra: str = "") -> Path:
    conf = tmp_path / "conf"
    conf.mkdir(exist_ok=True)
    if launcher == "interactive":
        where = "interactive:\n  nproc_per_node: '2'\n  kill_wait_s: 60\n"
    else:
        where = textwrap.dedent("""\
            slurm:
              nodes: 1
              ntasks_per_node: 2
              gpus_per_node: 0
              partition: debug
              time: "00:10:00"
              wait: true
            """)
    fault = {"mode": "none", "rank": 1, "step": 3, "steps": 6, "attempts": "first", **fault}
    text = "recipe: tests.fault_recipe:main\n" + where
    if ft is not None:
        ft = {"enabled": True, "rank_heartbeat_timeout": 30, "initial_rank_heartbeat_timeout": 120,
              "workload_check_interval": 1, "max_restarts": 1, **ft}
        text += "fault_tolerance:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in ft.items())
    text += "fault:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in fault.items()) + extra
    (conf / "job.yaml").write_text(text)
    return conf


def _train(conf: Path, run: Path, *args: str, env: dict[str, str] | None = None,
           timeout: float = 480) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(conf), "--config-name", "job",
                           f"hydra.run.dir={run}", *args], env=env or _env(), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "automodel_hydra.cli", *args], capture_output=True, text=True,
                          timeout=120, env=_env())


def _status(run: Path) -> dict[str, tp.Any]:
    (row,) = json.loads(_cli("status", str(run), "--json").stdout)
    return tp.cast(dict[str, tp.Any], row)


def _report_completed(run: Path, out: Path) -> list[str]:
    _cli("report", str(run), "--out", str(out))
    with (out / "final_metrics.csv").open() as f:
        return [row["completed"] for row in csv.DictReader(f)]


def _rank_ends(run: Path) -> list[dict[str, tp.Any]]:
    """The ranks' end records (automodel_hydra.outcome), read as files."""
    return [json.loads(p.read_text()) for p in sorted((run / "launch" / "ranks").glob("rank*.json"))]


def _noise(text: str) -> list[str]:
    """Lines that are not the job's: ft_launcher's and its rank monitors' chatter, torchrun's agent, pynvml."""
    marks = ("[ft_launcher", "RankMonServer", "pynvml", "elastic_operator", "torch/distributed/elastic", "NVML",
             "Error executing job")
    return [line for line in text.splitlines() if any(m in line for m in marks)]


# ----------------------------------------------------------------------------------------------- a rank returns early


@pytest.mark.slow
@needs_ft
def test_a_rank_that_returns_early_under_ft_launcher_is_no_completed_job(tmp_path: Path) -> None:
    """Rank 1's data ends after step 3 in every attempt; rank 0 is in step 4's all-reduce and sees "Connection
    closed by peer". The job is FAILED in the command, in status and in report, and the line names rank 1 and how
    it ended first: a user_error (the recipe's doing), which rank 0's in-job decision does not restart although
    fault_tolerance.max_restarts=1 and its own error is a comm error (failure_budget.comm=3)."""
    run = tmp_path / "R"
    proc = _train(_config(tmp_path, {"mode": "return", "attempts": "every"}, ft={"max_restarts": 1}), run)
    last = proc.stdout.strip().splitlines()[-1]
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert last.startswith("error: interactive job ") and " ended FAILED: user_error: rank 1 returned at step 3 " \
        "while the others trained; then rank 0: " in last, last
    assert "ft_launcher exited with " in last and "(its log: " in last  # the agent's own word, and where its log is
    assert "not retried: a restart repeats it (user_error; failure_budget.user_error=0)" in proc.stdout
    row = _status(run)
    assert row["state"] == "FAILED"
    assert row["note"].startswith("user_error: rank 1 returned at step 3 while the others trained")
    assert [a["class"] for a in row["attempts"]] == ["user_error"] and row["excluded"] == [], row
    assert _report_completed(run, tmp_path / "rep") == ["False"]
    assert [(r["attempt"], r["rank"], r["how"]) for r in _rank_ends(run)] == [(0, 0, "raised"), (0, 1, "returned")]


@pytest.mark.slurm
@pytest.mark.slow
@needs_ft
def test_slurm_says_completed_and_every_command_of_ours_says_failed(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """The same on the test cluster (one ft_launcher on one node starting 2 ranks, no restart): the step exits 0
    and sacct says COMPLETED for a job with no result.json; the waiting command, status and report say FAILED and
    name the rank. The followed log shows no ft_launcher chatter and no pynvml warning. (failure_budget.user_error=1
    and slurm.max_requeues=0: the ranks' decision allows a restart, so they send ft_launcher no shutdown request,
    and ft_launcher ends with its max_restarts=0 spent, which is when it exits 0.)"""
    run = tmp_path / "R"
    conf = _config(tmp_path, {"mode": "return", "attempts": "every"}, launcher="slurm", ft={"max_restarts": 0},
                   extra="failure_budget:\n  user_error: 1\n")
    text = (conf / "job.yaml").read_text().replace("  wait: true\n", "  wait: true\n  max_requeues: 0\n")
    (conf / "job.yaml").write_text(text)
    proc = _train(conf, run)
    assert proc.returncode == 1, proc.stdout[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert "rank 1 returned at step 3 while the others trained" in last and "Slurm state COMPLETED" in last, last
    job_id = json.loads((run / "launch" / "submission.json").read_text())["job_ids"][0]
    assert slurm_cluster.sacct_state(job_id, timeout=30) == "COMPLETED"  # the scheduler's word, from the exit code
    row = _status(run)
    assert row["state"] == "FAILED" and row["note"].startswith("user_error: rank 1 returned at step 3"), row
    assert _report_completed(run, tmp_path / "rep") == ["False"]
    assert not _noise(proc.stdout), _noise(proc.stdout)
    assert list((run / "launch").glob("agent.*.log")), "ft_launcher's own output is kept in the job's launch dir"


# ----------------------------------------------------------------------------------------------- per attempt, noise


@pytest.mark.slow
@needs_ft
def test_a_hang_and_restart_is_a_few_lines_and_every_attempt_keeps_its_nsys_reports(tmp_path: Path) -> None:
    """profile=nsys (the STAND-IN) under ft_launcher; rank 1 hangs inside step 4 of the first attempt. Each
    attempt keeps each rank's report (the hung attempt's is the one a user wants); the terminal shows what failed,
    where, and the restart, in a few lines; the rest is in launch/agent.<host>.log."""
    run = tmp_path / "R"
    env = _env(PATH=f"{STANDINS}{os.pathsep}{os.environ['PATH']}")
    proc = _train(_config(tmp_path, {"mode": "hang"}, ft={"rank_heartbeat_timeout": 8}), run, "profile=nsys",
                  env=env)
    assert proc.returncode == 0, proc.stdout[-4000:]
    reports = sorted(p.name.split("_", 2)[-1] for p in run.glob("*.nsys-rep"))
    assert reports == ["rank0_attempt0.nsys-rep", "rank0_attempt1.nsys-rep", "rank1_attempt0.nsys-rep",
                       "rank1_attempt1.nsys-rep"], reports
    lines = proc.stdout.strip().splitlines()
    print(f"\nhang and restart: {len(lines)} lines on the terminal")
    assert not _noise(proc.stdout), _noise(proc.stdout)
    assert len(lines) <= 16, proc.stdout
    hung = next(line for line in lines if "[rank1]" in line and "no heartbeat" in line)
    assert "at step 4 (fault_tolerance.rank_heartbeat_timeout=8 s ends this rank)" in hung
    restart = next(line for line in lines if "in-job restart 1: " in line)
    assert "rank 1 hung at step 4" in restart
    assert lines[-1].endswith("job 0 completed, restarted 1x: rank 1 hung at step 4")
    agent_log = next((run / "launch").glob("agent.*.log")).read_text()
    assert "will restart worker group" in agent_log and "RankMonServer" in agent_log


@pytest.mark.slow
def test_one_exception_in_one_rank_is_its_line_and_its_traceback_once(tmp_path: Path) -> None:
    """Without fault tolerance: rank 1 raises in step 4, rank 0 then fails in its all-reduce. The terminal shows
    each rank's one line, the first failed rank's traceback once, and the last line; every traceback stays in the
    job log and torch's error files."""
    run = tmp_path / "R"
    proc = _train(_config(tmp_path, {"mode": "raise"}, ft=None), run)
    assert proc.returncode == 1, proc.stdout[-3000:]
    lines = proc.stdout.strip().splitlines()
    print(f"\none exception in one rank: {len(lines)} lines on the terminal")
    assert proc.stdout.count("Traceback (most recent call last)") == 1, proc.stdout
    assert "ValueError: bad batch at step 4" in lines[-2] and "fault_recipe.py" in proc.stdout
    assert lines[-1].startswith("error: interactive job ") and ": rank 1: ValueError: bad batch at step 4;" in lines[-1]
    assert len(lines) <= 22 and not _noise(proc.stdout), proc.stdout
    assert (run / "train.log").read_text().count("Traceback (most recent call last)") == 2  # every rank's


@pytest.mark.slow
@needs_ft
def test_an_error_under_fault_tolerance_is_a_few_lines(tmp_path: Path) -> None:
    """With the fault-tolerance extra installed, a config error is one line, and a job whose rank fails is its
    lines, one traceback and the last line: no pynvml warning, no ft_launcher chatter."""
    run = tmp_path / "R"
    bad = _train(_config(tmp_path, {}, ft={}), run, "fault_tolerance.max_restarts=-1")
    assert bad.returncode == 2 and bad.stdout.strip().splitlines() == [
        "error: fault_tolerance.max_restarts=-1 is invalid: an integer >= 0"], bad.stdout
    proc = _train(_config(tmp_path, {"mode": "raise", "attempts": "every"}, ft={"max_restarts": 0}), run)
    assert proc.returncode == 1
    print(f"\nan error under fault tolerance: {len(proc.stdout.strip().splitlines())} lines on the terminal")
    assert not _noise(proc.stdout) and proc.stdout.count("Traceback") == 1, proc.stdout


# ----------------------------------------------------------------------------------------------- values, restarts


@pytest.mark.slow
@needs_ft
def test_hydras_runtime_value_reaches_a_function_recipe_resolved_under_fault_tolerance(tmp_path: Path) -> None:
    """``seen: ${hydra:runtime.output_dir}/mine`` in the recipe's own section, read by rank 0: resolved at plan
    time, as under Hydra's own launchers (every rank used to fail with UnsupportedInterpolationType, restarted
    twice)."""
    run = tmp_path / "R"
    conf = _config(tmp_path, {"write": str(tmp_path / "seen.txt"), "steps": 2}, ft={"max_restarts": 2},
                   extra="seen: ${hydra:runtime.output_dir}/mine\n")
    proc = _train(conf, run)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (tmp_path / "seen.txt").read_text() == f"{run}/mine"
    assert ftm.attempts(run / "launch") == []


@pytest.mark.slow
@needs_ft
def test_an_error_a_restart_repeats_is_not_restarted(tmp_path: Path) -> None:
    """Rank 1 imports a module that does not exist, with fault_tolerance.max_restarts=2: one attempt, the job
    ends FAILED at once naming the error, and ft_launcher was asked not to restart."""
    run = tmp_path / "R"
    started = time.monotonic()
    proc = _train(_config(tmp_path, {"mode": "import", "attempts": "every"}, ft={"max_restarts": 2}), run)
    took = time.monotonic() - started
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "not retried: a restart repeats it (user_error; failure_budget.user_error=0)" in proc.stdout
    assert "rank 1: ModuleNotFoundError: No module named 'no_such_module_in_this_job'" in proc.stdout.splitlines()[-1]
    assert ftm.attempts(run / "launch") == []
    assert {r["attempt"] for r in _rank_ends(run)} == {0}
    assert "ShutdownWorkload" in next((run / "launch").glob("agent.*.log")).read_text()
    print(f"\nan error a restart repeats: FAILED after {took:.0f} s, one attempt")


@pytest.mark.slow
def test_an_automodel_files_hydra_values_are_resolved_in_the_ranks_spec(tmp_path: Path) -> None:
    """An AutoModel file whose own section names ``${hydra:runtime.output_dir}``: the ranks' spec holds the job's
    dir (a dry run writes the same launch files as a real one)."""
    import yaml

    source = (ROOT / "tests" / "data" / "automodel" / "llama3_2_1b_squad.yaml").read_text()
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "job.yaml").write_text(source + "\nextras:\n  out: ${hydra:runtime.output_dir}/export\n")
    run = tmp_path / "R"
    model = broken_model_dir(tmp_path)  # a local model dir the plan accepts: nothing is fetched, nothing runs
    proc = _train(conf, run, "dry_run=true", f"model.pretrained_model_name_or_path={model}")
    assert proc.returncode == 0, proc.stdout[-3000:]
    spec = yaml.safe_load((run / "launch" / "job.yaml").read_text())
    assert spec["extras"]["out"] == f"{run}/export"


# ----------------------------------------------------------------------------------------------- readers, shells, names


@pytest.mark.slow
def test_a_closed_pipe_never_costs_the_result(tmp_path: Path) -> None:
    """``python train.py step_scheduler.max_steps=30 2>&1 | head -3``: the reader is gone after three lines; the
    training, the export (transformers' "Writing model shards" progress bar), result.json and the COMPLETED state
    are all there."""
    run = tmp_path / "R"
    command = (f"{sys.executable} {ROOT / 'train.py'} hydra.run.dir={run} step_scheduler.max_steps=30 "
               "interactive.nproc_per_node=1 2>&1 | head -3")
    proc = subprocess.run(["bash", "-c", command], env=_env(), capture_output=True, text=True, timeout=600)
    assert len(proc.stdout.splitlines()) == 3
    assert json.loads((run / "result.json").read_text())["step"] == 30
    assert (run / "final_model" / "config.json").is_file()
    assert _status(run)["state"] == "COMPLETED"


@pytest.mark.slow
def test_variables_left_in_the_shell_decide_nothing_locally(tmp_path: Path) -> None:
    """torchrun's, ft_launcher's and SkyPilot's variables left in the shell that starts a local run (a notebook
    started under ft_launcher): the ranks know from the plan who started them."""
    run = tmp_path / "R"
    proc = _train(_config(tmp_path, {"steps": 2}, ft=None), run, env=_env(**LEFTOVERS))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert _status(run)["state"] == "COMPLETED"


@pytest.mark.slurm
@pytest.mark.slow
def test_variables_left_in_the_shell_decide_nothing_on_slurm(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """The same leftovers in the shell that submits a Slurm job (sbatch exports the environment to the job):
    every rank used to fail with "torchrun task without $RANK"."""
    run = tmp_path / "R"
    proc = _train(_config(tmp_path, {"steps": 2}, launcher="slurm", ft=None), run, env=_env(**LEFTOVERS))
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert json.loads((run / "result.json").read_text())["step"] == 2
    assert _status(run)["state"] == "COMPLETED"


@pytest.mark.slow
def test_a_name_too_long_for_the_filesystem_is_one_line_before_anything_is_made(tmp_path: Path) -> None:
    long = "a" * 130
    sweep = tmp_path / "S"
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", f"hydra.sweep.dir={sweep}",
                           "hydra.sweep.subdir=${hydra.job.override_dirname}", f"+x1={long}", f"+x2={long}",
                           "dry_run=true"], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [x for x in proc.stderr.strip().splitlines() if x.startswith("error:")]
    assert line.startswith("error: hydra.sweep.subdir='${hydra.job.override_dirname}' is invalid: it makes a name "
                           "of 2") and "255-byte limit" in line and "exclude_keys=[x1,x2" in line, line
    assert not [p for p in sweep.iterdir() if p.is_dir()], "no job dir was made"
    single = subprocess.run([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={tmp_path / (long * 2)}",
                             "dry_run=true"], env=_env(), capture_output=True, text=True, timeout=300)
    assert single.returncode == 2 and single.stderr.strip().startswith("error: hydra.run.dir=") \
        and "255-byte limit" in single.stderr and len(single.stderr.strip().splitlines()) == 1, single.stderr
    # the job's name: Hydra opens <run dir>/<hydra.job.name>.log before any code of ours runs (was a traceback)
    named = subprocess.run([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={tmp_path / 'R'}",
                            f"hydra.job.name={long * 2}", "dry_run=true"], env=_env(), capture_output=True, text=True,
                           timeout=300)
    assert named.returncode == 2 and named.stderr.strip().startswith(f"error: hydra.job.name='{long * 2}' is invalid")\
        and "255-byte limit" in named.stderr and len(named.stderr.strip().splitlines()) == 1, named.stderr


# ----------------------------------------------------------------------------------------------- small truths


@pytest.mark.slow
def test_profile_nsys_without_nsys_is_found_before_torchrun_starts(tmp_path: Path) -> None:
    run = tmp_path / "R"
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nsys").exists())
    proc = _train(_config(tmp_path, {"steps": 2}, ft=None), run, "profile=nsys", env=_env(PATH=path))
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == ("error: profile.nsys.enabled=true (profile=nsys) but nsys (Nsight "
                                                    "Systems) is not on PATH on this machine: install Nsight Systems "
                                                    "or load its module (e.g. module load nsight-systems), or set "
                                                    "profile=none")
    assert not (run / "launch" / "torchrun.sh").exists() and not list((run / "launch").glob("agent.*.log"))


@pytest.mark.slow
def test_a_sweep_job_with_a_bad_value_prints_our_line_only(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "-m", f"hydra.sweep.dir={tmp_path / 'S'}",
                           "step_scheduler.max_steps=5,0", "dry_run=true"], env=_env(), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2
    assert "Error executing job" not in proc.stderr + proc.stdout, proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "error: step_scheduler.max_steps=0 is invalid: must be an integer >= 1"


@pytest.mark.slow
@needs_ft
def test_ctrl_c_while_a_rank_is_known_to_be_hung_does_not_wait_the_grace_time(tmp_path: Path) -> None:
    """Rank 1 hangs inside step 4; its watchdog records it after 0.6 x 90 s, 36 s before ft_launcher would act.
    Ctrl-C then ends the job at once, not after interactive.kill_wait_s=60 (nor when the rank monitor ends the
    rank): a hung rank cannot checkpoint, nor can rank 0, blocked in the all-reduce waiting for it."""
    run = tmp_path / "R"
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "--config-dir",
                             str(_config(tmp_path, {"mode": "hang"}, ft={"rank_heartbeat_timeout": 90})),
                             "--config-name", "job", f"hydra.run.dir={run}"], env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not ftm.hang_file(run / "launch", 1, 0).exists():
            assert time.monotonic() < deadline and proc.poll() is None, "no hang record within 240 s"
            time.sleep(0.5)
        time.sleep(0.5)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=120)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\nCtrl-C with a hung rank: ended {took:.1f} s after the signal")
    assert took < 20, f"took {took:.1f} s after Ctrl-C"  # (the kill itself, and this loaded 2-core machine)
    assert proc.returncode == 130, out[-3000:]
    last = out.strip().splitlines()[-1]
    assert last.startswith("stopped: interactive job ") and "killed at once, rank 1 hung at step 4" in last, last
