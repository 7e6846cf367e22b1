"""Following a job: one tracker run per job for its whole life (``launch/tracker_id`` -> ``WANDB_RUN_ID``,
``WANDB_RESUME=allow``, ``WANDB_RUN_GROUP`` for a sweep's members), and a curve for every recipe (a function's
``dist.log``, AutoModel's own ``training.jsonl``), with its in-job restarts and requeues marked.

W&B runs offline here (``mode="offline"``: each ``wandb.init`` leaves ``wandb/offline-run-<time>-<id>``, the id in
its name; ``wandb sync`` would merge every dir of one id into one run). The rank-side recipe records what its
``wandb.init`` got, which is what the launcher is answerable for."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import textwrap
import time
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import config, driver, report
from automodel_hydra.backends import interactive
from automodel_hydra.metrics import METRICS_FILE, StepLog, read_records
from automodel_hydra.plan import TRACKER_ID_FILE, JobSpec, tracker_env
from tests.helpers import ROOT

needs_wandb = pytest.mark.skipif(__import__("importlib").util.find_spec("wandb") is None,
                                 reason="wandb is not installed (the test extra has it)")
needs_ft = pytest.mark.skipif(interactive.find_ft_launcher() is None,
                              reason="ft_launcher not installed (pip install '.[fault-tolerance]')")

# ----------------------------------------------------------------------------------------------- the id (fast)


def _dry(job_dir: Path, num: int | None = None, env: tuple[tuple[str, str], ...] = ()) -> driver.Prepared:
    cfg = config.load_rank({"output_dir": str(job_dir), "step_scheduler": {"max_steps": 1}})
    return driver.Prepared(cfg, JobSpec(job_dir=job_dir, job_name="train", job_num=num, env=env), True)


def _exports(script: Path) -> dict[str, str]:
    return dict(line.removeprefix("export ").split("=", 1) for line in script.read_text().splitlines()
                if line.startswith("export WANDB_"))


def test_a_job_keeps_its_tracker_id_for_every_launch_of_its_dir(tmp_path: Path) -> None:
    """The id is made the first time a dir is planned (a dry run too, so that the real run's files are the dry
    run's) and kept by every later launch of that dir; another dir gets another id. ``hydra.job.env_set`` wins."""
    run, other = tmp_path / "R", tmp_path / "other"
    driver.launch([_dry(run)])
    first = (run / "launch" / TRACKER_ID_FILE).read_text().strip()
    assert _exports(run / "launch" / "torchrun.sh") == {"WANDB_RUN_ID": first, "WANDB_RESUME": "allow"}
    driver.launch([_dry(run)])
    assert (run / "launch" / TRACKER_ID_FILE).read_text().strip() == first
    assert _exports(run / "launch" / "torchrun.sh")["WANDB_RUN_ID"] == first
    driver.launch([_dry(other)])
    assert (other / "launch" / TRACKER_ID_FILE).read_text().strip() not in ("", first)
    driver.launch([_dry(other, env=(("WANDB_RUN_ID", "mine"),))])
    script = (other / "launch" / "torchrun.sh").read_text()
    assert script.index("export WANDB_RUN_ID=mine") > script.index("export WANDB_RUN_ID="), "env_set comes later"


def test_sweep_members_get_ids_of_their_own_and_the_sweep_as_their_group(tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    driver.launch([_dry(sweep / str(n), n) for n in range(3)], sweep)
    group = (sweep / "launch" / TRACKER_ID_FILE).read_text().strip()
    ids = [(sweep / str(n) / "launch" / TRACKER_ID_FILE).read_text().strip() for n in range(3)]
    assert len(set(ids)) == 3 and group not in ids
    for n in range(3):
        assert _exports(sweep / str(n) / "launch" / "torchrun.sh") == {
            "WANDB_RUN_ID": ids[n], "WANDB_RESUME": "allow", "WANDB_RUN_GROUP": group}
    driver.launch([_dry(sweep / "3", 3)], sweep)  # a later batch of the same sweep: the same group
    assert _exports(sweep / "3" / "launch" / "torchrun.sh")["WANDB_RUN_GROUP"] == group


def test_slurm_tasks_read_their_jobs_id_and_skypilot_tasks_carry_it(tmp_path: Path) -> None:
    """One array script for every task: each task reads its own job's ``launch/tracker_id`` when it starts (so a
    requeue reads it again), before ``env_set`` and ``slurm.env_vars``; a SkyPilot task (a spot recovery runs it
    again) has the values in its ``envs``, where ``env_vars`` wins without a conflict."""
    from automodel_hydra.backends import skypilot_env, slurm, slurm_plan

    job = JobSpec(job_dir=tmp_path / "S" / "0", job_name="train", job_num=0, tracker_id="abc", tracker_group="grp")
    lines = slurm_plan.tracker_lines(job)
    assert lines[1:] == ['export WANDB_RUN_ID="$(< "$AUTOMODEL_JOB_DIR/launch/tracker_id")"',
                         "export WANDB_RESUME=allow", "export WANDB_RUN_GROUP=grp"]
    cfg = config.load({"output_dir": str(job.job_dir), "slurm": {"partition": "debug", "gpus_per_node": 0,
                                                                  "env_vars": {"WANDB_RESUME": "must"}}})
    setup = slurm.Slurm().plan(cfg, job).request.setup
    assert setup.index(lines[1]) < setup.index("export WANDB_RESUME=must")
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / TRACKER_ID_FILE).write_text("abc\n")
    out = subprocess.run(["bash", "-c", f'export AUTOMODEL_JOB_DIR={tmp_path}; {lines[1]}; echo "$WANDB_RUN_ID"'],
                         capture_output=True, text=True, check=True)
    assert out.stdout == "abc\n"
    env = skypilot_env.task_env({"WANDB_RUN_GROUP": "mine"}, {}, None, (), set(), defaults=tracker_env(job))
    assert {e.name: (e.key, e.literal) for e in env} == {
        "WANDB_RUN_ID": ("automodel-hydra", "abc"), "WANDB_RESUME": ("automodel-hydra", "allow"),
        "WANDB_RUN_GROUP": ("skypilot.env_vars.WANDB_RUN_GROUP", "mine")}


def test_a_shells_own_wandb_run_id_is_not_passed_on_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("WANDB_RUN_ID", "left-over")
    driver.launch([_dry(tmp_path / "R")])
    assert _exports(tmp_path / "R" / "launch" / "torchrun.sh")["WANDB_RUN_ID"] != "left-over"
    assert "WANDB_RUN_ID=left-over of this shell is not passed on" in caplog.text
    caplog.clear()
    driver.launch([_dry(tmp_path / "R2", env=(("WANDB_RUN_ID", "left-over"),))])  # chosen: no warning
    assert "not passed on" not in caplog.text


# ----------------------------------------------------------------------------------------------- curves (fast)


def test_dist_log_writes_rank_0s_records_once_per_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = StepLog(tmp_path, rank=0)
    for step in range(4):
        first.log(step, loss=1.0 / (step + 1), acc=0.5)
    first.close()
    StepLog(tmp_path, rank=1).log(9, loss=0.0)  # another rank writes nothing
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # the restarted attempt redoes steps 2 and 3
    again = StepLog(tmp_path, rank=0)
    for step in (2, 3, 4):
        again.log(step, loss=0.1)
    again.close()
    rows = read_records(tmp_path / METRICS_FILE)
    assert [(r["step"], r.get("restart", 0)) for r in rows] == [(0, 0), (1, 0), (2, 1), (3, 1), (4, 1)]
    assert rows[0]["acc"] == 0.5 and isinstance(rows[0]["time"], float)
    assert report.attempt_steps(rows, "restart") == [2] and report.attempt_steps(rows, "requeue") == []
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT")  # the job dir launched again: a first attempt resumes at 5
    StepLog(tmp_path, rank=0).log(5, loss=0.05)
    c, _ = report.job_curve(tmp_path)
    assert (c.restarts, c.requeues, c.resumes) == ([2], [], [5])
    for bad in ({"step": -1}, {"step": 1.5}, {"step": 1, "loss": [1, 2]}, {"step": 1, "time": 3}):
        with pytest.raises((TypeError, ValueError), match=r"^dist\.log\("):
            StepLog(tmp_path, rank=0).log(**bad)


def test_an_automodel_recipes_own_records_make_its_curve(tmp_path: Path) -> None:
    """AutoModel appends to ``training.jsonl``: a job that resumed from a checkpoint logged its later steps again.
    Each step keeps its last record, the first one logged again is the resume, and the validation files (the
    default one and a named set) are the validation curves."""
    run = tmp_path / "R"
    (run / "launch").mkdir(parents=True)
    (run / "launch" / "job.yaml").write_text("recipe: TrainFinetuneRecipeForNextTokenPrediction\n"
                                             "checkpoint: {checkpoint_dir: ckpt/}\noutput_dir: " + str(run) + "\n")
    ckpt = run / "ckpt"
    ckpt.mkdir()
    steps = [0, 1, 2, 3, 2, 3, 4, 5]  # a requeue after step 3, resumed from the checkpoint of step 1
    (ckpt / "training.jsonl").write_text("".join(json.dumps(
        {"step": s, "epoch": 0, "timestamp": f"2026-12-04T10:00:0{i}.000Z", "loss": 2.0 - i / 10})
        + "\n" for i, s in enumerate(steps)))
    (ckpt / "validation.jsonl").write_text(json.dumps({"step": 3, "val_loss": 1.5}) + "\n")
    (ckpt / "validation_squad.jsonl").write_text(json.dumps({"step": 3, "val_loss": 1.7}) + "\n")
    assert report.automodel_log_dir(run) == ckpt
    c, rows = report.job_curve(run)
    assert c.steps == [0, 1, 2, 3, 4, 5] and c.losses[2] == pytest.approx(1.6)  # step 2's last record
    assert c.resumes == [2] and (c.val_steps, c.val_losses) == ([3], [1.5])
    assert c.more_val == {"squad": ([3], [1.7])} and len(rows) == 8
    assert report.last_logged(run) is not None and report.last_logged(run)["step"] == 5  # type: ignore[index]
    written = list(csv.reader(report.write_curves({"job 0": c}, tmp_path / "curves.csv").open()))
    assert written[0] == ["job", "step", "loss", "val_loss", "val_loss_squad"]
    assert written[4][1:] == ["3", str(c.losses[3]), "1.5", "1.7"]


# ----------------------------------------------------------------------------------------------- real runs (slow)

WB_RECIPE = textwrap.dedent('''
    """A user's recipe: W&B offline on rank 0, every step logged with dist.log. The first attempt of the job
    stops at step ``t.stop_at``: it raises (an in-job restart follows) or, ``t.requeue``, asks for a stop as
    Slurm's time-limit warning would (the job requeues itself); the next attempt starts again at that step."""
    import json
    import os
    import signal
    from pathlib import Path

    import wandb


    def main(cfg, dist, should_stop):
        t = cfg.wb
        out = Path(t.out)
        attempt = int(os.environ.get("SLURM_RESTART_COUNT" if t.requeue else "TORCHELASTIC_RESTART_COUNT", "0"))
        run = None
        if dist.rank == 0:
            run = wandb.init(project="automodel-hydra-test", mode="offline", dir=str(out))
            seen = {"id": run.id, "group": run.group, "attempt": attempt}
            (out / f"wandb_seen.{attempt}.{os.getpid()}.json").write_text(json.dumps(seen))
        start = t.stop_at if attempt > 0 else 0
        loss = 0.0
        for step in range(start, t.steps):
            if attempt == 0 and step == t.stop_at:
                if t.requeue:
                    os.kill(os.getpid(), signal.SIGUSR2)
                    if should_stop():
                        if run:
                            run.finish()
                        return {"stopped_early": True, "step": step}
                raise RuntimeError(f"injected failure at step {step}")
            loss = 1.0 / (step + 1)
            dist.log(step, loss=loss, val_loss=loss + 0.1 if step % 2 == 0 else None)
            if run:
                run.log({"loss": loss}, step=step)
        if run:
            run.finish()
        return {"loss": loss, "step": t.steps - 1}
''')


def _job_file(conf: Path, out: Path | str, extra: str = "", *, requeue: bool = False, stop_at: int = 3) -> None:
    conf.mkdir(parents=True, exist_ok=True)
    (conf / "wb.yaml").write_text(textwrap.dedent(f"""
        recipe: wb_user:main
        wb:
          out: {out}
          steps: 6
          stop_at: {stop_at}
          requeue: {str(requeue).lower()}
    """) + extra)


def _launch(tmp_path: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "wb_user.py").write_text(WB_RECIPE)
    env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "WANDB_SILENT": "true"}
    env.pop("WANDB_RUN_ID", None)
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(tmp_path / "conf"),
                           "--config-name", "wb", *overrides], env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def _seen(out: Path) -> list[dict[str, tp.Any]]:
    """What each attempt's ``wandb.init`` gave, in the order the attempts ran."""
    files = sorted(out.glob("wandb_seen.*.json"), key=lambda p: p.stat().st_mtime_ns)
    return [json.loads(p.read_text()) for p in files]


def _offline_runs(out: Path) -> list[str]:
    """The run id of each offline run dir W&B left (``offline-run-<date>_<time>-<id>``)."""
    return sorted(p.name.rsplit("-", 1)[1] for p in (out / "wandb").glob("offline-run-*"))


def _report(run: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "report", str(run)], capture_output=True,
                          text=True, timeout=120)


@pytest.mark.slow
@needs_wandb
@needs_ft
def test_a_job_restarted_in_place_and_launched_again_is_one_wandb_run_with_one_curve(tmp_path: Path) -> None:
    """Under ft_launcher the first attempt fails at step 3 and the job restarts in place; then the same job dir
    is launched again. Every ``wandb.init`` got the job's id (``launch/tracker_id``): one W&B run; ``metrics.jsonl``
    has every step once, the restarted attempt's marked, and ``report`` draws it with the restart."""
    run = tmp_path / "R"
    _job_file(tmp_path / "conf", run, textwrap.dedent("""
        interactive:
          nproc_per_node: 1
        fault_tolerance:
          enabled: true
          rank_heartbeat_timeout: 60
          initial_rank_heartbeat_timeout: 120
          workload_check_interval: 1
          max_restarts: 1
    """))
    proc = _launch(tmp_path, f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    ident = (run / "launch" / TRACKER_ID_FILE).read_text().strip()
    seen = _seen(run)
    assert [(s["attempt"], s["id"], s["group"]) for s in seen] == [(0, ident, ""), (1, ident, "")], proc.stdout[-3000:]
    assert _offline_runs(run) == [ident, ident], "one W&B run: every offline run dir is the job's id"
    rows = read_records(run / METRICS_FILE)
    assert [(r["step"], r.get("restart", 0)) for r in rows] == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]
    made = _report(run)
    assert made.returncode == 0, made.stdout + made.stderr
    assert (run / "report" / "loss.png").stat().st_size > 10_000
    curve, _ = report.job_curve(run)
    assert curve.steps == list(range(6)) and curve.val_steps == [0, 2, 4] and curve.restarts == [3]
    again = _launch(tmp_path, f"hydra.run.dir={run}")  # a later launch of the same job dir
    assert again.returncode == 0, again.stdout[-4000:]
    assert {s["id"] for s in _seen(run)} == {ident} and len(_seen(run)) == 4
    assert _offline_runs(run) == [ident] * 4


@pytest.mark.slow
@needs_wandb
def test_sweep_members_are_distinct_wandb_runs_of_one_group_and_each_has_a_curve(tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    _job_file(tmp_path / "conf", "OUT", "interactive:\n  nproc_per_node: 1\n", stop_at=99)
    outs = [tmp_path / "out0", tmp_path / "out1"]
    for out in outs:
        out.mkdir()
    proc = _launch(tmp_path, "-m", f"wb.out={outs[0]},{outs[1]}", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    group = (sweep / "launch" / TRACKER_ID_FILE).read_text().strip()
    ids = [(sweep / str(n) / "launch" / TRACKER_ID_FILE).read_text().strip() for n in (0, 1)]
    assert ids[0] != ids[1]
    for n, out in enumerate(outs):
        assert [(s["id"], s["group"]) for s in _seen(out)] == [(ids[n], group)]
        assert _offline_runs(out) == [ids[n]]
    (sweep / "0" / METRICS_FILE).unlink()  # a member that logged nothing yet: the other still has its curve
    report = _report(sweep)
    assert report.returncode == 0, report.stdout + report.stderr
    assert (sweep / "report" / "loss.png").stat().st_size > 10_000
    assert proc.stdout.strip().splitlines()[-1] == f"sweep {sweep}: 2 COMPLETED; automodel-hydra report {sweep}"


@pytest.mark.slurm
@needs_wandb
def test_a_requeued_slurm_job_is_one_wandb_run_with_the_requeue_marked(slurm_cluster: tp.Any,
                                                                       tmp_path: Path) -> None:
    """The first attempt asks for a stop at step 3 as Slurm's time-limit warning does (SIGUSR2): the worker
    requeues the job (``slurm.max_requeues``), and the requeued attempt reads the same ``launch/tracker_id``."""
    run = tmp_path / "R"
    _job_file(tmp_path / "conf", run, textwrap.dedent("""
        slurm:
          nodes: 1
          ntasks_per_node: 1
          gpus_per_node: 0
          partition: debug
          time: "00:10:00"
          max_requeues: 1
          wait: true
    """), requeue=True)
    started = time.monotonic()
    proc = _launch(tmp_path, f"hydra.run.dir={run}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    ident = (run / "launch" / TRACKER_ID_FILE).read_text().strip()
    assert [(s["attempt"], s["id"]) for s in _seen(run)] == [(0, ident), (1, ident)]
    assert _offline_runs(run) == [ident, ident]
    rows = read_records(run / METRICS_FILE)
    assert [(r["step"], r.get("requeue", 0)) for r in rows] == [(0, 0), (1, 0), (2, 0), (3, 1), (4, 1), (5, 1)]
    assert report.job_curve(run)[0].requeues == [3]
    made = _report(run)
    assert made.returncode == 0 and (run / "report" / "loss.png").is_file(), made.stderr
    print(f"\nrequeued job: {time.monotonic() - started:.0f} s start to end")
