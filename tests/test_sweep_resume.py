"""Resuming a sweep (``automodel-hydra resume S``, or its ``-m`` command again with ``hydra.sweep.dir=S``) and
stopping one that keeps failing (``sweep_policy.max_failures``).

The real-process tests run a 4-point sweep of ``tests/sweep_recipe.py`` (a few milliseconds a step, a checkpoint
after each) whose point 3 (job 2) fails after step 2 while its marker file exists; the test removes the marker and
resumes. The decision itself (:mod:`automodel_hydra.resume`) is pure and tested without processes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import resume, sweep_policy
from automodel_hydra.schema import ConfigError
from automodel_hydra.states import JobState
from tests.helpers import ROOT

# ----------------------------------------------------------------------------------------------- the decision


def test_completed_members_are_kept_and_every_other_end_runs_again() -> None:
    states = {0: JobState.COMPLETED, 1: JobState.FAILED, 2: JobState.CANCELLED, 4: JobState.TIMEOUT,
              5: JobState.UNKNOWN, 6: None}
    d = resume.decide(range(7), states)  # job 3 has no record: never submitted
    assert d.kept == (0,)
    assert d.again == ((1, "FAILED"), (2, "CANCELLED"), (3, "never started"), (4, "TIMEOUT"), (5, "UNKNOWN"),
                       (6, "never started"))
    assert not d.busy
    assert resume.summary(resume.decide(range(4), {0: JobState.COMPLETED, 1: JobState.COMPLETED,
                                                   2: JobState.FAILED, 3: JobState.COMPLETED})) == \
        "resume: 3 of 4 members COMPLETED and kept; running again: 1 (#2 FAILED)"


def test_a_running_or_pending_member_refuses_the_resume_naming_it() -> None:
    d = resume.decide(range(3), {0: JobState.COMPLETED, 1: JobState.RUNNING, 2: JobState.PENDING})
    assert d.busy == ((1, JobState.RUNNING), (2, JobState.PENDING))
    line = resume.busy_line("S", d)
    assert line.startswith("S is not done: #1 RUNNING, #2 PENDING; nothing was submitted") and "cancel S 1" in line


def test_a_long_summary_names_a_dozen_members_and_counts_the_rest() -> None:
    d = resume.decide(range(1000), {n: JobState.COMPLETED if n % 50 else JobState.FAILED for n in range(1000)})
    line = resume.summary(d)
    assert line.startswith("resume: 980 of 1000 members COMPLETED and kept; running again: 20 (#0 FAILED, #50 ")
    assert line.endswith(", ... (8 more))")


def _definition(points: dict[int, list[str]], **config: tp.Any) -> resume.Definition:
    return resume.Definition({n: tuple(o) for n, o in points.items()}, resume.flatten({"optim": {"lr": 0.1},
                                                                                       **config}))


def test_the_first_difference_of_a_definition_is_named() -> None:
    then = _definition({0: ["seed=1", "x=1"], 1: ["seed=2", "x=1"]})
    assert resume.difference(then, then, whole=True) is None
    assert resume.difference(_definition({0: ["seed=1", "x=1"], 1: ["seed=3", "x=1"]}), then, True) == \
        "job 1 had seed=2, this command gives it seed=3"
    assert resume.difference(_definition({0: ["seed=1", "x=1"]}), then, True) == \
        "it was swept over 2 point(s), this command over 1 (job 1: seed=2 x=1 is not in it)"
    assert resume.difference(_definition({0: ["seed=1", "x=1"]}), then, whole=False) is None  # a batch of it
    assert resume.difference(_definition({2: ["seed=3"]}), then, whole=False) is None  # a later batch
    assert resume.difference(_definition({**then.points, 2: ["seed=3"]}), then, True) == \
        "it was swept over 2 point(s), this command adds job 2 (seed=3)"
    changed = _definition({0: ["seed=1", "x=1"], 1: ["seed=2", "x=1"]}, optim={"lr": 0.3})
    assert resume.difference(changed, then, True) == "its config had optim.lr=0.1, this command gives optim.lr=0.3"
    assert resume.difference(_definition({0: ["seed=1"], 1: ["seed=2", "x=1"]}), then, True) == \
        "this command drops x=1 (job 0: seed=1)"
    assert resume.difference(_definition(dict(then.points), data={"path": "a"}), then, True) == \
        'its config had data.path=(not set), this command gives data.path="a"'


def test_the_same_overrides_in_another_order_are_the_same_sweep_unless_a_key_repeats() -> None:
    then = _definition({0: ["launcher=interactive", "seed=1", "+x.y=1"], 1: ["launcher=interactive", "seed=2",
                                                                            "+x.y=1"]})
    reordered = _definition({0: ["+x.y=1", "seed=1", "launcher=interactive"], 1: ["+x.y=1", "seed=2",
                                                                                "launcher=interactive"]})
    assert resume.difference(reordered, then, whole=True) is None
    repeated = _definition({0: ["seed=1", "seed=2"], 1: ["seed=3"]})  # the later seed wins: order is meaning
    swapped = _definition({0: ["seed=2", "seed=1"], 1: ["seed=3"]})
    assert resume.difference(swapped, repeated, whole=True) == "job 0 had seed=1 seed=2, this command gives it " \
        "seed=2 seed=1"


def test_a_recorded_definition_reads_back_equal_and_pins_its_sweep_dir(tmp_path: Path) -> None:
    now = resume.Definition({0: ("a=1",)}, resume.flatten({"a": 1, "b": {"c": [1, 2]}, "e": {}}),
                            ("train.py", "-m", "a=1", "hydra.sweep.dir=multirun/x"), "/work")
    back = resume.Definition.from_json(json.loads(json.dumps(resume.merged(None, now))))
    assert back == now and resume.difference(now, back, True) is None
    assert resume.command(back, tmp_path) == ["train.py", "-m", "a=1", f"hydra.sweep.dir={tmp_path}"]
    assert resume.command(resume.Definition({}, {}, ("train.py", "-m")), tmp_path)[-1] == f"hydra.sweep.dir={tmp_path}"
    assert resume.point(["seed=1", "dry_run=true", "++dry_run=false", "dry_runs=1"]) == ("seed=1", "dry_runs=1")
    batch2 = resume.Definition({1: ("a=2",)}, now.config, ("other",), "/elsewhere")
    assert resume.Definition.from_json(resume.merged(now.to_json(), batch2)).points == {0: ("a=1",), 1: ("a=2",)}


def test_max_failures_is_a_whole_number_of_failures_or_null() -> None:
    assert sweep_policy.check(None) is None and sweep_policy.check(2) == 2
    for bad in (0, -1, 1.5, "2", True):
        with pytest.raises(ConfigError) as e:
            sweep_policy.check(bad)
        assert str(e.value).startswith("hydra.launcher.sweep_policy.max_failures=") and "or null" in str(e.value)


def test_pending_members_are_cancelled_once_enough_have_failed() -> None:
    s = [JobState.FAILED, JobState.RUNNING, JobState.PENDING, JobState.CANCELLED, JobState.PENDING]
    assert sweep_policy.to_cancel(s, 1) == [2, 4] and sweep_policy.to_cancel(s, 2) == []
    s[3] = JobState.TIMEOUT  # a timeout is a failure, a cancel or a preemption is not
    assert sweep_policy.to_cancel(s, 2) == [2, 4]
    assert sweep_policy.to_cancel([JobState.PREEMPTED, JobState.CANCELLED, JobState.PENDING], 1) == []
    assert sweep_policy.stop_line(2, 2, [4, 5], "S") == (
        "sweep stopped after 2 members failed for good (hydra.launcher.sweep_policy.max_failures=2): 2 member(s) not "
        "started yet are cancelled (#4, #5); running ones finish; automodel-hydra resume S runs the failed and "
        "cancelled ones again")


def test_a_requeued_member_is_not_a_failure_yet_and_the_stop_line_names_it_apart(tmp_path: Path) -> None:
    """A member requeued under its failure budget is PENDING, not failed: it does not count towards max_failures;
    cancelled by a stop, it is named apart from the members that never started (it started in this launch: rank
    0's start record of the launch's id). A start record of an earlier launch of the dir is not this one's."""
    from automodel_hydra import ledger
    from automodel_hydra.plan import JobSpec, write_run_id

    assert sweep_policy.to_cancel([JobState.FAILED, JobState.PENDING, JobState.PENDING], 2) == []
    requeued, fresh, resumed = (JobSpec(job_dir=tmp_path / n, job_name="train") for n in ("1", "2", "3"))
    for job in (requeued, fresh, resumed):
        write_run_id(job, "earlier")
    ledger.record_start(resumed.launch_dir, environ={})
    for job in (requeued, fresh, resumed):
        write_run_id(job, "now")
    ledger.record_start(requeued.launch_dir, environ={})
    assert [sweep_policy.started(j.launch_dir) for j in (requeued, fresh, resumed)] == [True, False, False]
    assert sweep_policy.stop_line(1, 1, [2, 3], "S", requeued=[1]) == (
        "sweep stopped after 1 member failed for good (hydra.launcher.sweep_policy.max_failures=1): 2 member(s) not "
        "started yet are cancelled (#2, #3), and 1 requeued after a failed attempt (#1); running ones finish; "
        "automodel-hydra resume S runs the failed and cancelled ones again")
    with pytest.raises(ConfigError) as e:
        sweep_policy.check(0)
    assert "a member requeued under its failure budget counts once its last attempt fails" in str(e.value)


# ----------------------------------------------------------------------------------------------- real sweeps


def sweep_args(sweep: Path, markers: Path, *extra: str, points: str = "1,2,3,4") -> list[str]:
    return ["-m", "recipe=tests.sweep_recipe:main", f"+sweep_test.point={points}", "+sweep_test.steps=4",
            "+sweep_test.fail_after=2", f"+sweep_test.fail_dir={markers}",
            "+sweep_test.out=${hydra:runtime.output_dir}", "interactive.nproc_per_node=1", *extra,
            f"hydra.sweep.dir={sweep}"]


def run(*argv: str, cwd: Path = ROOT, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``argv`` (``train.py ...`` or ``-m automodel_hydra.cli ...``) with this Python; stdout and stderr apart."""
    return subprocess.run([sys.executable, *argv], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          check=False, env={**os.environ, "PYTHONPATH": str(ROOT)})


def stamps(sweep: Path) -> dict[str, tuple[bytes, int]]:
    """Each member's result.json: its bytes and its mtime in nanoseconds."""
    return {p.parent.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in sorted(sweep.glob("*/result.json"))}


def states(sweep: Path) -> dict[int, str]:
    proc = run("-m", "automodel_hydra.cli", "status", str(sweep), "--json", timeout=60)
    assert proc.returncode == 0, proc.stderr
    return {row["job"]: row["state"] for row in json.loads(proc.stdout)}


@pytest.fixture(scope="module")
def failed_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A local 4-point sweep whose job 2 failed after its checkpoint of step 2 (its marker still there)."""
    base = tmp_path_factory.mktemp("resume")
    sweep, markers = base / "S", base / "markers"
    markers.mkdir()
    (markers / "fail-3").touch()
    proc = run(str(ROOT / "train.py"), *sweep_args(sweep, markers))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "FAILED", 3: "COMPLETED"}
    return sweep, markers


@pytest.mark.slow
def test_resume_runs_only_the_failed_member_again_from_its_checkpoint(failed_sweep: tuple[Path, Path],
                                                                      tmp_path: Path) -> None:
    sweep, markers = failed_sweep
    (markers / "fail-3").unlink()
    before = stamps(sweep)
    assert sorted(before) == ["0", "1", "3"]
    # from another working dir: resume runs the recorded command where it was launched
    proc = run("-m", "automodel_hydra.cli", "resume", str(sweep), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "resume: 3 of 4 members COMPLETED and kept; running again: 1 (#2 FAILED)"
    after = stamps(sweep)
    assert {k: after[k] for k in before} == before, "a kept member's result.json changed"
    out = proc.stdout + proc.stderr
    assert "\t#2 : " in out and "\t#0 : " not in out and "\t#1 : " not in out and "\t#3 : " not in out, out
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED", 3: "COMPLETED"}
    result = json.loads(after["2"][0])
    assert result["started_from"] == 2 and result["step"] == 4, "job 2 resumed from its own checkpoint"
    from automodel_hydra.report import job_curve  # the report draws where job 2's second launch went on

    assert [job_curve(sweep / str(n))[0].resumes for n in range(4)] == [[], [], [3], []]
    assert f"sweep {sweep}: 4 COMPLETED" in proc.stderr.splitlines()[-1]

    # the same -m command again: nothing left to run, nothing touched
    proc = run(str(ROOT / "train.py"), *sweep_args(sweep, markers))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "resume: 4 of 4 members COMPLETED and kept; nothing to run again"
    assert stamps(sweep) == after

    # the same -m command with its overrides in another order: the same sweep
    args = sweep_args(sweep, markers)
    proc = run(str(ROOT / "train.py"), args[0], *reversed(args[1:-1]), args[-1])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "resume: 4 of 4 members COMPLETED and kept; nothing to run again"
    assert stamps(sweep) == after

    # another sweep definition into the same dir: one line, nothing set up or submitted
    manifest = (sweep / "launch" / "manifest.json").read_bytes()
    for changed, diff in ((sweep_args(sweep, markers, points="1,2,3,5"), "job 3 had +sweep_test.point=4, this "
                           "command gives it +sweep_test.point=5"),
                          (sweep_args(sweep, markers, "+sweep_test.step_s=0.02"), "this command adds "
                           "+sweep_test.step_s=0.02 (job 0: ")):
        proc = run(str(ROOT / "train.py"), *changed)
        assert proc.returncode == 2, proc.stderr[-3000:]
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and errors[0].startswith(
            f"error: {sweep} holds another sweep ({sweep / 'launch' / 'manifest.json'}): {diff}"), proc.stderr
        assert errors[0].endswith(f"; a sweep dir is resumed only with the sweep it recorded (automodel-hydra resume "
                                  f"{sweep}): choose another hydra.sweep.dir for this one"), errors
        assert "submitted" not in proc.stdout + proc.stderr
        assert stamps(sweep) == after and (sweep / "launch" / "manifest.json").read_bytes() == manifest


@pytest.mark.slow
def test_max_failures_cancels_the_members_not_started_and_resume_runs_them(tmp_path: Path) -> None:
    """``max_failures=1``, two members running side by side that both fail: the two not started yet are
    cancelled (never started), the running one finishes (FAILED); a resume runs all four."""
    from automodel_hydra.backends.interactive import cpu_cores

    if len(cpu_cores()) < 2:
        pytest.skip("needs 2 cores: two members running side by side")
    sweep, markers = tmp_path / "S", tmp_path / "markers"
    markers.mkdir()
    policy = "hydra.launcher.sweep_policy.max_failures"
    bad = run(str(ROOT / "train.py"), *sweep_args(sweep, markers, f"{policy}=0"))
    last = bad.stderr.strip().splitlines()[-1]
    assert bad.returncode == 2 and last.startswith(f"error: {policy}=0 is invalid: "), bad.stderr
    assert not sweep.exists(), "a bad value left a sweep dir behind"
    for point in (1, 2):
        (markers / f"fail-{point}").touch()
    proc = run(str(ROOT / "train.py"), *sweep_args(sweep, markers, "interactive.max_parallel=2", f"{policy}=1"))
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = (rf"^sweep stopped after [12] members? failed for good \({re.escape(policy)}=1\): 2 member\(s\) not "
            "started yet are "
            rf"cancelled \(#2, #3\); running ones finish; automodel-hydra resume {re.escape(str(sweep))} runs the "
            "failed and cancelled ones again$")
    assert re.search(line, proc.stderr, re.M), proc.stderr[-3000:]
    assert states(sweep) == {0: "FAILED", 1: "FAILED", 2: "CANCELLED", 3: "CANCELLED"}
    assert not list(sweep.glob("[23]/metrics.jsonl")), "a cancelled member started"
    for point in (1, 2):
        (markers / f"fail-{point}").unlink()
    proc = run("-m", "automodel_hydra.cli", "resume", str(sweep))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == ("resume: 0 of 4 members COMPLETED and kept; running again: 4 (#0 FAILED, "
                                           "#1 FAILED, #2 CANCELLED, #3 CANCELLED)")
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED", 3: "COMPLETED"}


def test_a_resumed_skypilot_sweep_plans_one_task_per_member_that_runs_again(tmp_path: Path) -> None:
    """SkyPilot (no cloud here: planning only): the members 2 and 5 that a resume runs again are one task each,
    in their own dirs, named after their own job numbers as in the first launch."""
    from automodel_hydra import config
    from automodel_hydra.backends import skypilot
    from automodel_hydra.plan import JobSpec
    from tests.helpers import compose_cfg

    facts = skypilot.Facts("automodel-me-12345678", frozenset())
    backend = skypilot.SkyPilot()
    plans = []
    for num in (2, 5):
        job = JobSpec(tmp_path / "S" / str(num), "train", overrides=(f"seed={num}",), job_num=num)
        cfg = config.load(compose_cfg(["launcher=skypilot", f"seed={num}"], job.job_dir))
        plans.append(backend.plan(cfg, job, facts))
    batches = backend.batches(plans, tmp_path / "S", facts)
    assert [[p.job.job_num for p in b.plans] for b in batches] == [[2], [5]]
    assert all(all(path.is_relative_to(tmp_path / "S" / str(b.plans[0].job.job_num)) for path in b.files)
               for b in batches)
    names = [b.plans[0].request.name for b in batches]
    assert len(set(names)) == 2, names


def test_a_tasks_own_sacct_row_wins_over_the_cancelled_pending_range_that_names_it() -> None:
    """What sacct prints after ``scancel --state=PENDING`` of an array whose task 1 had just started: the pending
    range keeps its first bounds (seen on the Slurm 22.05 test cluster)."""
    from automodel_hydra.backends.slurm_states import parse_sacct

    table = parse_sacct("53_0|FAILED|None\n53_1|FAILED|None\n53_[1-3%1]|CANCELLED by 0|None\n")  # its order
    assert {k: v.state for k, v in table.items()} == {"53_0": JobState.FAILED, "53_1": JobState.FAILED,
                                                       "53_2": JobState.CANCELLED, "53_3": JobState.CANCELLED}


@pytest.mark.slow
def test_resume_refuses_while_a_member_runs_naming_it(tmp_path: Path) -> None:
    """A member still RUNNING is neither kept nor run again: the resume is one line, nothing is submitted."""
    import signal

    from tests.helpers import wait_for

    sweep, markers = tmp_path / "S", tmp_path / "markers"
    markers.mkdir()
    with open(tmp_path / "driver.out", "w") as out:
        driver = subprocess.Popen([sys.executable, str(ROOT / "train.py"),
                                   *sweep_args(sweep, markers, "+sweep_test.step_s=20", points="1,2")],
                                  cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: (sweep / "launch" / "manifest.json").is_file() and states(sweep)[0] == "RUNNING", 120,
                 "job 0 to run")
        proc = run("-m", "automodel_hydra.cli", "resume", str(sweep), timeout=120)
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        last = proc.stderr.strip().splitlines()[-1]
        assert last.startswith(f"error: {sweep} is not done: #0 RUNNING") and "nothing was submitted" in last, last
        assert "submitted" not in proc.stdout
    finally:
        driver.send_signal(signal.SIGINT)
        driver.wait(timeout=90)


@pytest.mark.slow
def test_members_queued_by_a_killed_command_are_cancelled_never_started_and_resume_runs_them(tmp_path: Path
                                                                                              ) -> None:
    """``kill -9`` of the launching command while job 0 runs and jobs 1-2 wait in its queue: nothing will start
    them, so ``status`` says CANCELLED (never started), not PENDING for ever; the running member runs on (its
    own process group) and ends COMPLETED; a resume runs just the two."""
    import signal

    from tests.helpers import wait_for

    sweep, markers = tmp_path / "S", tmp_path / "markers"
    markers.mkdir()
    args = sweep_args(sweep, markers, "+sweep_test.step_s=1", "interactive.max_parallel=1", points="1,2,3")
    with open(tmp_path / "driver.out", "w") as out:
        driver = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        wait_for(lambda: (sweep / "launch" / "manifest.json").is_file() and states(sweep)[0] == "RUNNING", 120,
                 "job 0 to run")
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
    proc = run("-m", "automodel_hydra.cli", "status", str(sweep), "--json", timeout=60)
    rows = {row["job"]: row for row in json.loads(proc.stdout)}
    assert {n: rows[n]["state"] for n in (1, 2)} == {1: "CANCELLED", 2: "CANCELLED"}, rows
    assert "never started" in rows[1]["note"], rows[1]
    wait_for(lambda: states(sweep)[0] == "COMPLETED", 120, "job 0, orphaned, to end")
    proc = run("-m", "automodel_hydra.cli", "resume", str(sweep))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == ("resume: 1 of 3 members COMPLETED and kept; running again: 2 "
                                           "(#1 CANCELLED, #2 CANCELLED)")
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED"}


def test_resume_of_a_dir_that_is_no_resumable_sweep_is_one_line_saying_what_it_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from automodel_hydra import cli

    sweep = tmp_path / "S"
    (sweep / "launch").mkdir(parents=True)
    (sweep / "0" / "launch").mkdir(parents=True)
    (sweep / "launch" / "manifest.json").write_text(json.dumps({"jobs": []}))  # written before definitions were
    cases = {tmp_path / "typo": f"{tmp_path / 'typo'} does not exist: resume takes the dir of a sweep (-m)",
             tmp_path: f"{tmp_path} is not a sweep dir (no {tmp_path / 'launch' / 'manifest.json'}): resume takes",
             sweep / "0": f"{sweep / '0'} is not a sweep dir (no {sweep / '0' / 'launch' / 'manifest.json'}): it is "
                          f"a member of the sweep {sweep}: automodel-hydra resume {sweep}",
             sweep: f"{sweep} holds a sweep submitted before sweeps recorded their definition"}
    for where, start in cases.items():
        assert cli.main(["resume", str(where)]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and err[0].startswith(f"error: {start}"), err
    assert cli.main(["resume", str(sweep)]) == 2
    assert f"run its -m command again with hydra.sweep.dir={sweep} (every member runs again)" in capsys.readouterr().err


@pytest.mark.slurm
@pytest.mark.slow
def test_max_failures_with_a_detached_slurm_sweep_is_one_line_naming_what_to_set(slurm_cluster: tp.Any,
                                                                                   tmp_path: Path) -> None:
    """The policy needs the launching command to wait: ``slurm.detach=true`` with it is one line, in the words the
    user wrote (``true``, not Python's ``True``), saying which value works and why; nothing is submitted."""
    sweep, markers = tmp_path / "S", tmp_path / "markers"
    markers.mkdir()
    proc = run(str(ROOT / "train.py"), *sweep_args(sweep, markers, "launcher=slurm", "slurm.partition=debug",
                                                   "slurm.nodes=1", "slurm.ntasks_per_node=1", "slurm.detach=true",
                                                   "hydra.launcher.sweep_policy.max_failures=1"), timeout=120)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: slurm.detach=true is invalid: it must be false here, since "
        "hydra.launcher.sweep_policy.max_failures=1 is set: the command that waits for the sweep stops it")
    assert "submitted" not in proc.stdout + proc.stderr and not (sweep / "launch" / "manifest.json").exists()


def as_previous_version_wrote(root: Path, was: Path) -> None:
    """Rewrite the records under ``root`` as the previous version wrote them in ``was``: every path absolute, under
    the dir's old place (``was``), no list of relative fields."""
    from automodel_hydra import records

    def old(record: dict[str, tp.Any], holder: Path) -> dict[str, tp.Any]:
        return records.placed(record, holder)

    manifest = root / "launch" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["jobs"] = [old(r, was) for r in data["jobs"]]
    manifest.write_text(json.dumps(data))
    for path in root.glob("*/launch/submission.json"):
        path.write_text(json.dumps(old(json.loads(path.read_text()), was / path.parent.parent.name)))


@pytest.mark.slow
def test_a_moved_sweep_is_read_where_it_is_now_and_resume_keeps_every_finished_member(tmp_path: Path) -> None:
    """A finished sweep dir moved with ``mv`` (or copied elsewhere, mounted under another path): its members are
    COMPLETED, and ``resume`` keeps them all (their result.json unchanged, by bytes and mtime), writes nothing into
    them and adds no second row per job; the same for a dir the previous version wrote (absolute paths)."""
    sweep, markers = tmp_path / "S", tmp_path / "markers"
    markers.mkdir()
    proc = run(str(ROOT / "train.py"), *sweep_args(sweep, markers, points="1,2,3"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    moved = tmp_path / "elsewhere" / "S2"
    moved.parent.mkdir()
    os.rename(sweep, moved)
    before = stamps(moved)
    assert sorted(before) == ["0", "1", "2"]
    assert states(moved) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED"}
    proc = run("-m", "automodel_hydra.cli", "resume", str(moved), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "resume: 3 of 3 members COMPLETED and kept; nothing to run again"
    assert stamps(moved) == before, "a kept member's result.json changed"
    assert states(moved) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED"}, "a job shows twice"
    logs = run("-m", "automodel_hydra.cli", "logs", str(moved), "1", "--no-follow", timeout=60)
    assert logs.returncode == 0 and "no log yet" not in logs.stderr, logs.stderr

    # written by the previous version (absolute paths) in S, read in S2, then moved again: the same
    as_previous_version_wrote(moved, sweep)
    again = tmp_path / "S3"
    os.rename(moved, again)
    assert states(again) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED"}
    proc = run(str(ROOT / "train.py"), *sweep_args(again, markers, points="1,2,3"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "resume: 3 of 3 members COMPLETED and kept; nothing to run again"
    assert stamps(again) == before
    assert states(again) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED"}


@pytest.mark.slow
def test_resume_after_the_sweeps_config_file_was_edited_is_one_line_for_the_resume(tmp_path: Path) -> None:
    """``automodel-hydra resume S`` after the sweep's own config file was edited: one line that speaks of the resume
    (the file that changed, what differs, how to go on), not of the ``-m`` command's other sweep dir; nothing
    submitted."""
    conf, markers, sweep = tmp_path / "conf", tmp_path / "markers", tmp_path / "S"
    conf.mkdir()
    markers.mkdir()
    (conf / "sc.yaml").write_text(
        "recipe: tests.sweep_recipe:main\ninteractive:\n  nproc_per_node: 1\nsweep_test:\n  point: 1\n  steps: 2\n"
        f"  fail_after: 9\n  fail_dir: {markers}\n  out: ${{hydra:runtime.output_dir}}\n  scale: 1\n")
    proc = run(str(ROOT / "train.py"), "--config-dir", str(conf), "--config-name", "sc", "-m",
               "sweep_test.point=1,2", f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    before = stamps(sweep)
    time.sleep(1.1)  # (the sweep's submission is recorded to the second)
    (conf / "sc.yaml").write_text((conf / "sc.yaml").read_text().replace("scale: 1", "scale: 2"))
    proc = run("-m", "automodel_hydra.cli", "resume", str(sweep), cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: cannot resume {sweep}: {conf / 'sc.yaml'} changed since the sweep was submitted, so its recorded "
        f"command now makes another sweep than the one in {sweep / 'launch' / 'manifest.json'}: its config had "
        "sweep_test.scale=1, the recorded command now gives sweep_test.scale=2; nothing was submitted: put the "
        "config back as it was to resume this sweep, or run the changed sweep in a dir of its own (its -m command "
        "with another hydra.sweep.dir)")
    assert stamps(sweep) == before and "preparing" not in proc.stdout + proc.stderr, "a job was set up"
