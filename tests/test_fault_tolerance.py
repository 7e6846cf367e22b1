"""Fault tolerance: the ``fault_tolerance:`` section, ft_launcher in place of torchrun, heartbeats from torch's
global optimizer step hook, the hung-rank evidence, and real in-job restarts with ft_launcher (2 gloo ranks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import fault_tolerance as ftm
from automodel_hydra import heartbeat
from automodel_hydra.backends import interactive
from automodel_hydra.plan import RUN_ID_FILE, JobSpec, PreflightError
from automodel_hydra.schema import ConfigError
from tests.helpers import ROOT, compose_cfg, metrics

HAS_FT = interactive.find_ft_launcher() is not None
needs_ft = pytest.mark.skipif(not HAS_FT, reason="ft_launcher not installed (pip install '.[fault-tolerance]')")


def _load(**ft: tp.Any) -> tp.Any:
    from automodel_hydra import config

    return config.load({"output_dir": "/tmp/x", "fault_tolerance": ft})


# ------------------------------------------------------------------------------------------------ the section (fast)


def test_off_by_default_and_torchrun_unchanged(tmp_path: Path) -> None:
    from automodel_hydra import config

    cfg = config.load(compose_cfg(["interactive.nproc_per_node=2"], output_dir=tmp_path))
    assert cfg.fault_tolerance.enabled is False
    script = interactive.Interactive().plan(cfg, JobSpec(tmp_path, "train")).files["torchrun.sh"]
    assert " -m automodel_hydra.agent " in script and " torchrun --max_restarts=0 " in script
    assert "ft_launcher" not in script and "--ft-" not in script


@pytest.mark.parametrize(("ft", "message"), [
    ({"rank_heartbeat_timeout": 0}, "fault_tolerance.rank_heartbeat_timeout=0.0 is invalid: a number of seconds > 0"),
    ({"initial_rank_heartbeat_timeout": -5}, "fault_tolerance.initial_rank_heartbeat_timeout=-5.0 is invalid"),
    ({"max_restarts": -1}, "fault_tolerance.max_restarts=-1 is invalid: an integer >= 0"),
    ({"rank_termination_signal": "SIGFOO"}, "fault_tolerance.rank_termination_signal='SIGFOO' is invalid: one of "
                                            "SIGKILL"),
    ({"log_level": "LOUD"}, "fault_tolerance.log_level='LOUD' is invalid: one of DEBUG, INFO"),
    ({"workload_check_interval": 30, "rank_heartbeat_timeout": 10},
     "fault_tolerance.workload_check_interval=30.0 is invalid: less than fault_tolerance.rank_heartbeat_timeout"),
])
def test_bad_values_are_one_line_naming_the_key(ft: dict[str, tp.Any], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        _load(**ft)
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.slow
def test_unknown_key_and_restart_conflict_fail_before_start(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={tmp_path / 'R'}",
                           "fault_tolerance.heartbeat=3"], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "fault_tolerance.heartbeat" in proc.stderr
    assert not (tmp_path / "R" / "launch").exists()
    with pytest.raises(ConfigError, match="interactive.max_restarts=2 is invalid: with fault_tolerance.enabled=true"):
        from automodel_hydra import config

        config.load({"output_dir": "/tmp/x", "interactive": {"max_restarts": 2},
                     "fault_tolerance": {"enabled": True, "max_restarts": 1}})


def test_interactive_plan_runs_ft_launcher_with_nemo_run_flags(tmp_path: Path) -> None:
    from automodel_hydra import config

    cfg = config.load(compose_cfg(["interactive.nproc_per_node=2", "fault_tolerance.enabled=true",
                                   "fault_tolerance.rank_heartbeat_timeout=30", "fault_tolerance.max_restarts=2"],
                                  output_dir=tmp_path))
    backend = interactive.Interactive()
    plan = backend.plan(cfg, JobSpec(tmp_path, "train"), interactive.Devices.here("/opt/venv/nvidia_resiliency_ext"))
    exec_line = next(line for line in plan.files["torchrun.sh"].splitlines() if line.startswith("exec "))
    # ft_launcher's own entry point, run by automodel_hydra.agent (its output in launch/agent.<host>.log)
    assert exec_line.startswith(f"exec {sys.executable} -m automodel_hydra.agent {tmp_path / 'launch'} ft_launcher ")
    for flag in ("--ft-rank-heartbeat-timeout=30", "--ft-initial-rank-heartbeat-timeout=1200",
                 "--ft-workload-check-interval=5", "--ft-rank-termination-signal=SIGKILL", "--ft-log-level=INFO",
                 "--max-restarts=2", "--nproc_per_node=2", "--rdzv-backend=c10d",
                 '--rdzv-endpoint="127.0.0.1:${AUTOMODEL_RDZV_PORT:-0}"', "-m automodel_hydra.worker"):
        assert flag in exec_line
    assert "torch.distributed.run" not in exec_line and "--max_restarts" not in exec_line
    assert plan.request.launcher == "ft_launcher"


def test_no_ft_launcher_is_one_line_before_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from automodel_hydra import config

    cfg = config.load(compose_cfg(["fault_tolerance.enabled=true"], output_dir=tmp_path))
    find_spec = importlib.util.find_spec
    # this Python without nvidia-resiliency-ext (the agent runs ft_launcher's entry point in this interpreter)
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("nvidia_resiliency_ext") else find_spec(name, *a))
    with pytest.raises(PreflightError) as e:
        interactive.Interactive().preflight([cfg])
    assert str(e.value) == ftm.missing_launcher_line(f"in this Python ({sys.executable})")
    assert "pip install 'automodel-hydra[fault-tolerance]'" in str(e.value)


# ------------------------------------------------------------------------------------------------ heartbeats (fast)


def test_heartbeat_is_a_no_op_outside_ft_launcher(tmp_path: Path) -> None:
    heartbeat.beat()  # not installed (the plan did not have ft_launcher start the rank): nothing to send to
    assert not ftm.evidence_dir(tmp_path).exists()
    # a plan that says ft_launcher, without its rank monitor: one line naming the variable, not a hang later
    with pytest.raises(RuntimeError, match=r"ft_launcher started this rank .*FT_RANK_MONITOR_IPC_SOCKET is not set"):
        heartbeat.install(tmp_path, 0, environ={})


def _sleeper(stop: threading.Event) -> None:
    stop.wait(30)  # THE HANGING LINE


def test_optimizer_steps_beat_and_a_silent_rank_leaves_its_stack(tmp_path: Path) -> None:
    import torch

    monitor = heartbeat.Monitor(tmp_path, rank=1, attempt=0, client=None, timeout_s=1.0, initial_timeout_s=60.0,
                                poll_s=0.05).start()
    try:
        model = torch.nn.Linear(2, 1)
        opt = torch.optim.Adam(model.parameters())
        for _ in range(3):
            model(torch.ones(1, 2)).sum().backward()
            opt.step()
        assert (monitor.steps, monitor.step) == (3, 3)  # Adam's own count
        assert not monitor.check()  # not silent yet
        stop = threading.Event()
        t = threading.Thread(target=_sleeper, args=(stop,))
        t.start()
        deadline = time.monotonic() + 10
        while not ftm.hang_file(tmp_path, 1, 0).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        t.join()
        record = json.loads(ftm.hang_file(tmp_path, 1, 0).read_text())
        assert (record["rank"], record["step"], record["completed_steps"], record["attempt"]) == (1, 4, 3, 0)
        assert record["silent_s"] >= 0.6 and record["host"]
        stack = ftm.stack_file(tmp_path, 1, 0).read_text()
        assert stack.startswith("rank 1 on ") and "at step 4 (3 completed)" in stack
        assert "in _sleeper" in stack  # every thread's stack, the sleeping one included
        assert ftm.hangs(tmp_path)[0]["rank"] == 1
        opt.step()  # a heartbeat after all: slow, not hung
        assert json.loads(ftm.hang_file(tmp_path, 1, 0).read_text())["resumed_at"]
        assert ftm.hangs(tmp_path) == []
    finally:
        monitor.close()


def test_the_rank_not_waiting_in_a_collective_is_the_hung_one(tmp_path: Path) -> None:
    from automodel_hydra import outcome

    launch = tmp_path / "launch"
    d = ftm.evidence_dir(launch)
    d.mkdir(parents=True)
    for rank, step, waiting in ((0, 6, "all_reduce"), (1, 5, None)):
        (d / f"hang.rank{rank}.attempt0.json").write_text(json.dumps(
            {"rank": rank, "attempt": 0, "step": step, "waiting_in": waiting, "time": 100.0, "host": "h",
             "silent_s": 5.0, "timeout_s": 8.0, "timeout_key": "rank_heartbeat_timeout", "stack": f"s{rank}"}))
    reason = outcome.explain(JobSpec(tmp_path, "train"), attempt=(0, 0))
    assert reason == "rank 1 hung at step 5"
    # the last line says the timeout that fired, not how long the rank had been silent when its stack was taken
    assert ftm.final_hang(launch) == ("rank 1 hung at step 5 on host h (no heartbeat within "
                                      "fault_tolerance.rank_heartbeat_timeout=8 s; stack: s1)")
    ftm.record_attempt(launch, 1, 200.0, reason)
    assert ftm.restart_summary(launch) == "restarted 1x: rank 1 hung at step 5"
    assert ftm.final_hang(launch) is None  # the last attempt (1) did not hang


def test_an_earlier_launchs_hangs_and_restarts_are_not_this_ones(tmp_path: Path) -> None:
    """The job dir keeps the evidence of every launch; the status and the last line take the current launch's
    only, by its launch id, whatever the clocks say (the earlier launch's records carry *later* times here)."""
    d = ftm.evidence_dir(tmp_path)
    d.mkdir(parents=True)
    later = time.time() + 3600  # a node clock an hour ahead of this host's
    (tmp_path / RUN_ID_FILE).write_text("first\n")  # tmp_path is the job's launch/
    (d / "hang.rank1.attempt1.json").write_text(json.dumps(
        {"rank": 1, "attempt": 1, "step": 7, "time": later, "host": "h", "silent_s": 5.0, "stack": "s",
         "run_id": "first"}))
    ftm.record_attempt(tmp_path, 1, later, "rank 1 hung at step 7")
    assert ftm.restart_summary(tmp_path).startswith("restarted 1x")
    assert ftm.final_hang(tmp_path) is not None

    (tmp_path / RUN_ID_FILE).write_text("second\n")  # the job launched again
    assert ftm.restart_summary(tmp_path) == ""  # the first launch restarted; this one did not (yet)
    assert ftm.final_hang(tmp_path) is None
    assert ftm.hangs(tmp_path) == []


# ------------------------------------------------------------------------------------------------ real runs (slow)

USER_RECIPE = textwrap.dedent('''
    """A user's recipe: Adam on a tiny model, the project's checkpoints and metrics; a fault on rank 1 at step 5
    of the first attempt only."""
    import os
    import time
    from pathlib import Path

    import torch
    import torch.distributed as td

    from automodel_hydra.checkpoint import CheckpointManager, ModelOptimState
    from automodel_hydra.metrics import MetricsLogger


    def main(cfg, dist, should_stop):
        t = cfg.ft_test
        attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        out = Path(t.out)
        ckpt = CheckpointManager(out / "checkpoints", keep_latest_k=0)
        state = {"app": ModelOptimState(model, opt)}
        start = ckpt.load(state, "latest")
        log = MetricsLogger(out, int(t.steps), rank=dist.rank, world_size=dist.world_size, start_step=start,
                            tty=False)
        loss = 0.0
        for step in range(start + 1, int(t.steps) + 1):
            batch = torch.randn(8, 4)
            value = (model(batch) - 1.0).pow(2).mean()
            opt.zero_grad()
            value.backward()
            for p in model.parameters():
                td.all_reduce(p.grad)
            if attempt == 0 and dist.rank == 1 and step == 5:
                if t.mode == "hang":
                    time.sleep(600)  # HANG HERE: no heartbeat, no collective
                raise RuntimeError(f"injected failure at step {step}")
            opt.step()
            loss = float(value.detach())
            log.log(step, loss, 0.01, 0.0, attempt=attempt, started_at=start)
            if step % 2 == 0:
                ckpt.save(step, state)
            time.sleep(0.1)
        ckpt.close()
        log.close()
        return {"loss": loss, "step": int(t.steps)}
''')


def _ft_run(tmp_path: Path, mode: str, max_restarts: int,
            timeout_s: float = 8) -> tuple[Path, subprocess.CompletedProcess[str], float]:
    """``python train.py`` of :data:`USER_RECIPE` on 2 ranks under ft_launcher: (run dir, process, seconds)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "ft_user.py").write_text(USER_RECIPE)
    run = tmp_path / "R"
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "ft.yaml").write_text(textwrap.dedent(f"""
        recipe: ft_user:main
        interactive:
          nproc_per_node: 2
        fault_tolerance:
          enabled: true
          rank_heartbeat_timeout: {timeout_s}
          initial_rank_heartbeat_timeout: 120
          workload_check_interval: 1
          max_restarts: {max_restarts}
        ft_test:
          mode: {mode}
          steps: 8
          out: {run}
    """))
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.monotonic()
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(conf), "--config-name", "ft",
                           f"hydra.run.dir={run}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=400)
    return run, proc, time.monotonic() - started


def _status(run: Path) -> dict[str, tp.Any]:
    out = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "status", str(run), "--json"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    (row,) = json.loads(out)
    return row


@pytest.mark.slow
@needs_ft
def test_hung_rank_is_found_stack_kept_and_job_restarts_in_place(tmp_path: Path) -> None:
    run, proc, _ = _ft_run(tmp_path, "hang", max_restarts=1)
    assert proc.returncode == 0, proc.stdout[-4000:]
    launch = run / "launch"
    rows = ftm.attempts(launch)
    assert [r["attempt"] for r in rows] == [1], "exactly one in-job restart"
    # the hang first; a peer that saw rank 1's end before ft_launcher stopped it may add "; then rank 0: ..."
    assert rows[0]["reason"].startswith("rank 1 hung at step 5"), rows
    hang = json.loads(ftm.hang_file(launch, 1, 0).read_text())
    assert (hang["rank"], hang["step"], hang["waiting_in"]) == (1, 5, None)
    stack = Path(hang["stack"]).read_text()
    line = next(n for n, text in enumerate(USER_RECIPE.splitlines(), 1) if "HANG HERE" in text)
    assert f'ft_user.py", line {line} in main' in stack  # the hanging line, in the main thread's stack
    assert "rank 1 on " in stack and "at step 5" in stack
    steps = [r["step"] for r in metrics(run)]
    assert steps == list(range(1, 9)), "every step once, none twice"
    resumed = [r for r in metrics(run) if r["attempt"] == 1]
    assert resumed[0]["step"] == 5 and resumed[0]["started_at"] == 4, "resumed from the newest checkpoint (step 4)"
    assert "completed, restarted 1x: rank 1 hung at step 5" in proc.stdout.strip().splitlines()[-1]
    row = _status(run)
    assert row["state"] == "COMPLETED" and row["note"].startswith("restarted 1x: rank 1 hung at step 5"), row
    # the measurement the docs quote: from the hang to the restarted attempt, and the work lost
    hung_at = hang["time"] - hang["silent_s"]
    print(f"\nhang -> restarted attempt's rank 0 up: {rows[0]['time'] - hung_at:.1f} s; steps redone: "
          f"{hang['completed_steps'] - resumed[0]['started_at']} completed + the one in progress")


@pytest.mark.slow
@needs_ft
def test_hung_rank_without_restarts_fails_fast_naming_it(tmp_path: Path) -> None:
    run, proc, took = _ft_run(tmp_path, "hang", max_restarts=0)
    assert proc.returncode == 1
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("error: interactive job ") and " ended FAILED: hang: rank 1 hung at step 5 on host " in last
    assert f"stack: {ftm.stack_file(run / 'launch', 1, 0)}" in last
    assert took < 8 + 60 + 60, f"took {took:.0f} s (start-up on this machine included)"
    assert ftm.attempts(run / "launch") == []
    row = _status(run)
    assert row["state"] == "FAILED" and row["note"].startswith("hang: rank 1 hung at step 5")


@pytest.mark.slow
@needs_ft
def test_failed_rank_restarts_in_place_and_resumes_from_newest_checkpoint(tmp_path: Path) -> None:
    run, proc, _ = _ft_run(tmp_path, "raise", max_restarts=1)
    assert proc.returncode == 0, proc.stdout[-4000:]
    (row,) = ftm.attempts(run / "launch")
    assert row["reason"].startswith("rank 1: RuntimeError: injected failure at step 5")
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    assert [r["attempt"] for r in rows] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert rows[4]["started_at"] == 4
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-8"


def test_report_marks_restarts_on_the_loss_curve(tmp_path: Path) -> None:
    from automodel_hydra import report

    rows = [{"step": s, "loss": 2.0 - s / 10, "time": 100.0 + s} for s in range(1, 5)]
    rows += [{"step": s, "loss": 2.0 - s / 10, "time": 200.0 + s} for s in range(5, 9)]
    ftm.record_attempt(tmp_path / "launch", 1, 150.0, "rank 1 hung at step 4")
    steps = report.restart_steps(rows, tmp_path)
    assert steps == [5]
    c = report.curve(rows)
    c.restarts = steps
    png = report.plot_losses({"0: x": c}, tmp_path / "loss.png", "t")
    assert png.stat().st_size > 1000


# ------------------------------------------------------------------------------------------------ Slurm, SkyPilot plans


def test_slurm_plan_runs_one_ft_launcher_per_node(tmp_path: Path) -> None:
    from automodel_hydra import config
    from automodel_hydra.backends import slurm

    cfg = config.load(compose_cfg(["launcher=slurm", "slurm.nodes=2", "slurm.ntasks_per_node=4",
                                   "slurm.gpus_per_node=0", "fault_tolerance.enabled=true",
                                   "fault_tolerance.max_restarts=2"], tmp_path))
    script = slurm.Slurm().plan(cfg, JobSpec(tmp_path, "train")).files["sbatch.sh"]
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    assert " --ntasks=2 --ntasks-per-node=1 " in srun  # one task per node: the node's ft_launcher
    launcher = str(Path(sys.executable).parent / "ft_launcher")
    # ft_launcher's entry point, run by automodel_hydra.agent on each node (its output in launch/agent.<host>.log)
    assert f' {sys.executable} -m automodel_hydra.agent "$AUTOMODEL_JOB_DIR"/launch ft_launcher --ft-' in srun
    assert "--max-restarts=2" in srun
    for arg in ("--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d",
                '--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"', '--rdzv-id="${SLURM_JOB_ID}"',
                "-m automodel_hydra.worker"):
        assert arg in srun
    assert f"[ -x {launcher} ] ||" in script  # a node without it: one line at start
    # the batch step's check, run by bash, is the one line
    check = next(line for line in script.splitlines() if line.startswith("[ -x "))
    out = subprocess.run(["bash", "-c", check.replace(launcher, str(tmp_path / "none"))],
                         env={"PATH": os.environ["PATH"], "AUTOMODEL_JOB_DIR": str(tmp_path)},
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and out.stderr.strip().startswith("error: fault_tolerance.enabled=true needs ")
    assert len(out.stderr.strip().splitlines()) == 1
    off = config.load(compose_cfg(["launcher=slurm", "slurm.nodes=2", "slurm.gpus_per_node=0"], tmp_path))
    srun_off = next(line for line in slurm.Slurm().plan(off, JobSpec(tmp_path, "train")).files["sbatch.sh"]
                    .splitlines() if line.startswith("srun "))
    assert "ft_launcher" not in srun_off and "--ntasks-per-node=1" not in srun_off


@pytest.mark.slow
def test_skypilot_multi_node_task_runs_ft_launcher_per_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from automodel_hydra.backends import skypilot
    from tests.test_skypilot_plan import ENV, FIELD_IPS, bash, load, plan

    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    p = plan(load(["skypilot.cloud=aws", "skypilot.accelerators=H100:8", "skypilot.num_nodes=2",
                   "skypilot.use_spot=true", "skypilot.checkpoint_bucket=s3://ckpts", "fault_tolerance.enabled=true"],
                  tmp_path))
    skypilot.SkyPilot().check([p])  # SkyPilot's own schema and sky.Task
    task = p.request.task
    assert "'.[fault-tolerance]'" in task["setup"]  # ft_launcher on every node
    assert p.request.managed and task["resources"]["use_spot"]  # managed spot recovery stays on top
    (tmp_path / "bin").mkdir()
    recorder = tmp_path / "bin" / "ft_launcher"
    recorder.write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    recorder.chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp_path), "SKYPILOT_NODE_IPS": FIELD_IPS,
           "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_TASK_ID": "sky-2026-01-01-00-00-00_1"}
    run = task["run"].replace("/checkpoints/", f"{tmp_path}/checkpoints/")
    out = bash(run, env)
    assert out.returncode == 0, out.stderr
    args = out.stdout.splitlines()
    for arg in ("--nnodes=2", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.12:13742",
                "--rdzv-id=sky-2026-01-01-00-00-00_1", "--max-restarts=3", "--ft-rank-heartbeat-timeout=300"):
        assert arg in args
    recorder.unlink()
    missing = bash(run, {**env, "PATH": "/usr/bin:/bin"})
    assert missing.returncode == 1 and missing.stderr.strip().startswith(
        "error: fault_tolerance.enabled=true needs ft_launcher on this node")


@pytest.mark.slurm
@pytest.mark.slow
@needs_ft
def test_slurm_hung_rank_restarts_in_the_same_allocation(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """2 nodes x 1 task on the test cluster: one ft_launcher per node; rank 1 hangs at step 5 once."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "ft_user.py").write_text(USER_RECIPE)
    run, conf = tmp_path / "R", tmp_path / "conf"
    conf.mkdir()
    (conf / "ft.yaml").write_text(textwrap.dedent(f"""
        recipe: ft_user:main
        slurm:
          nodes: 2
          ntasks_per_node: 1
          gpus_per_node: 0
          partition: debug
          time: "00:10:00"
          wait: true
        fault_tolerance:
          enabled: true
          rank_heartbeat_timeout: 8
          initial_rank_heartbeat_timeout: 120
          workload_check_interval: 1
          max_restarts: 1
        ft_test:
          mode: hang
          steps: 8
          out: {run}
    """))
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(conf), "--config-name", "ft",
                           f"hydra.run.dir={run}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=480)
    assert proc.returncode == 0, proc.stdout[-5000:]
    job_id = json.loads((run / "launch" / "submission.json").read_text())["job_ids"][0]
    assert slurm_cluster.sacct_state(job_id, timeout=30) == "COMPLETED"
    assert slurm_cluster.job_info(job_id).get("Restarts") == "0", "restarted in the allocation, never requeued"
    rows = ftm.attempts(run / "launch")
    # rank 0, on the other node, may raise "Connection closed by peer" before its ft_launcher stops it: the reason
    # then goes on "; then rank 0: RuntimeError: ..." (the hang came first either way)
    assert [r["attempt"] for r in rows] == [1] and rows[0]["reason"].startswith("rank 1 hung at step 5"), rows
    hang = json.loads(ftm.hang_file(run / "launch", 1, 0).read_text())
    line = next(n for n, text in enumerate(USER_RECIPE.splitlines(), 1) if "HANG HERE" in text)
    assert f'ft_user.py", line {line} in main' in Path(hang["stack"]).read_text()
    assert [r["step"] for r in metrics(run)] == list(range(1, 9))
    assert _status(run)["note"].startswith("restarted 1x: rank 1 hung at step 5")
    resumed = next(r for r in metrics(run) if r["attempt"] == 1)
    print(f"\nslurm: hang -> restarted attempt's rank 0 up: {rows[0]['time'] - hang['time'] + hang['silent_s']:.1f} s; "
          f"resumed at step {resumed['step']} from checkpoint step {resumed['started_at']}")


@pytest.mark.slurm
@pytest.mark.slow
@needs_ft
def test_slurm_cancel_stops_a_job_with_a_hung_rank_for_good(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """2 nodes x 1 task under ft_launcher; rank 1 sleeps inside step 3 while rank 0 waits for it in all_reduce,
    and the heartbeat timeout is far off, so fault tolerance has not acted yet. ``automodel-hydra cancel RUN``
    (scancel) ends every process of the job within the cluster's KillWait (5 s) and some slack: ft_launcher does
    not restart the worker group on it, nothing requeues the job, and it stays CANCELLED."""
    run, conf = tmp_path / "R", tmp_path / "conf"
    conf.mkdir()
    (conf / "hang.yaml").write_text(textwrap.dedent(f"""
        recipe: tests.hang_recipe:main
        hang_dir: {run}
        slurm:
          nodes: 2
          ntasks_per_node: 1
          gpus_per_node: 0
          partition: debug
          time: "00:10:00"
          max_requeues: 3
        fault_tolerance:
          enabled: true
          rank_heartbeat_timeout: 600
          initial_rank_heartbeat_timeout: 600
          max_restarts: 3
    """))
    submit = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(conf), "--config-name",
                             "hang", f"hydra.run.dir={run}"], capture_output=True, text=True, timeout=120)
    assert submit.returncode == 0, submit.stdout[-3000:] + submit.stderr[-3000:]
    job_id = json.loads((run / "launch" / "submission.json").read_text())["job_ids"][0]
    deadline = time.monotonic() + 300
    while len(list(run.glob("hung.rank*"))) < 2:
        assert time.monotonic() < deadline, f"no hang at step 3 within 300 s: {slurm_cluster.job_info(job_id)}"
        time.sleep(1)
    time.sleep(1)  # rank 0 is in all_reduce, rank 1 in its sleep
    job_procs = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout.split()
    assert len(job_procs) >= 4, job_procs  # an ft_launcher and a rank per node, at least

    cancel = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "cancel", str(run)],
                            capture_output=True, text=True, timeout=60)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    took = slurm_cluster.wait_gone(job_id, timeout=60)
    assert took < 5 + 25, took  # KillWait=5 on the test cluster, plus the epilog and polling
    left = subprocess.run(["pgrep", "-f", str(run)], capture_output=True, text=True).stdout.split()
    assert not left, f"processes of the cancelled job left: {left}"
    assert slurm_cluster.sacct_state(job_id, timeout=30) == "CANCELLED"
    time.sleep(10)  # a requeue would bring the job back within ~7 s here
    assert job_id not in slurm_cluster.squeue_ids(), "the cancelled job came back"
    assert slurm_cluster.job_info(job_id).get("Restarts", "0") == "0"
    assert ftm.attempts(run / "launch") == []  # no in-job restart either
    assert _status(run)["state"] == "CANCELLED"
    print(f"\nslurm: cancel of a job with a hung rank -> gone after {took:.1f} s")
