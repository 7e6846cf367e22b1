"""What a job's own records say when its scheduler cannot tell: our cancel of a task Slurm keeps no record of, and
a scheduler that could not be asked (pure: a job dir on disk; the real cases are in
tests/test_slurm_cluster_faults.py and tests/test_slurm_tunnel_login.py)."""

from __future__ import annotations

import json
from pathlib import Path

from automodel_hydra import outcome, records
from automodel_hydra.plan import JobSpec, launch_dir, write_run_id
from automodel_hydra.states import JobState, StateInfo

NOT_ASKED = StateInfo(JobState.UNKNOWN, "sacct on this machine exited 1: no slurm.conf", answered=False)


def job_dir(tmp_path: Path, run_id: str = "launch-1", result: str | None = None) -> dict[str, object]:
    job = JobSpec(tmp_path / "job", "train")
    write_run_id(job, run_id)
    if result is not None:
        job.result_file.write_text(json.dumps({"step": 2, "loss": 1.0, "run_id": result}))
    return {"job_dir": str(job.job_dir), "job_ids": ["7_0"], "backend": "slurm"}


def test_a_cancel_we_sent_gives_cancelled_only_for_this_launch(tmp_path: Path) -> None:
    record = job_dir(tmp_path)
    assert outcome.state_info(record, StateInfo(JobState.UNKNOWN)).state is JobState.UNKNOWN
    records.write_cancel(launch_dir(str(record["job_dir"])), ["7_0"], JobState.PENDING, by="automodel-hydra cancel")
    info = outcome.state_info(record, StateInfo(JobState.UNKNOWN))
    assert info == StateInfo(JobState.CANCELLED, "cancelled with automodel-hydra cancel while PENDING; the scheduler "
                                                 "keeps no record of it")
    assert outcome.state_info(record, StateInfo(JobState.RUNNING)).state is JobState.RUNNING  # the scheduler's word
    write_run_id(JobSpec(Path(str(record["job_dir"])), "train"), "launch-2")  # launched again: not this launch's
    assert outcome.state_info(record, StateInfo(JobState.UNKNOWN)).state is JobState.UNKNOWN


def test_not_asked_shows_what_the_records_know_with_a_note(tmp_path: Path) -> None:
    done = outcome.state_info(job_dir(tmp_path / "a", result="launch-1"), NOT_ASKED)
    assert done.state is JobState.COMPLETED and not done.answered
    assert done.reason == ("the scheduler could not be asked (sacct on this machine exited 1: no slurm.conf); its "
                           "result of this launch is here")
    earlier = outcome.state_info(job_dir(tmp_path / "b", result="launch-0"), NOT_ASKED)  # an earlier launch's
    assert earlier.state is JobState.UNKNOWN and earlier.reason.endswith("no result of this launch here")
    record = job_dir(tmp_path / "c")
    records.write_cancel(launch_dir(str(record["job_dir"])), ["7_0"], JobState.PENDING, by="automodel-hydra cancel")
    cancelled = outcome.state_info(record, NOT_ASKED)
    assert cancelled.state is JobState.CANCELLED and cancelled.reason.startswith("the scheduler could not be asked")


def test_a_cancel_is_one_record_that_each_writer_adds_to_for_this_launch_only(tmp_path: Path) -> None:
    """A local job's stop writes how its processes ended, ``automodel-hydra cancel`` then who sent it: one record,
    ``launch/cancel.json``, keeps both; a later launch of the dir is not covered by it."""
    job = JobSpec(tmp_path / "R", "train")
    write_run_id(job, "launch-1")
    assert records.read_cancel(job.launch_dir) is None
    records.write_cancel(job.launch_dir)  # the stop starts: the ranks read it to end cleanly
    assert records.read_cancel(job.launch_dir) == records.Cancel()
    records.write_cancel(job.launch_dir, how="ended within the 30 s grace time")
    records.write_cancel(job.launch_dir, ["4242"], JobState.RUNNING, by="automodel-hydra cancel")
    assert records.read_cancel(job.launch_dir) == records.Cancel("automodel-hydra cancel", ("4242",), "RUNNING",
                                                                 "ended within the 30 s grace time")
    assert sorted(p.name for p in job.launch_dir.iterdir()) == ["cancel.json", "run_id"]
    write_run_id(job, "launch-2")
    assert records.read_cancel(job.launch_dir) is None


def test_an_old_local_run_dirs_cancelled_mark_still_reads_as_its_cancel(tmp_path: Path) -> None:
    """A run dir written before the cancel was one record (a local job's ``launch/cancelled`` mark holding how it
    ended) still shows CANCELLED, with how it ended, and a rerun in the dir removes the old mark too."""
    from automodel_hydra.backends.interactive import Interactive, LocalRef, local_state

    run = tmp_path / "R"
    (run / "launch").mkdir(parents=True)
    (run / "launch" / "pid").write_text("99999999\n")  # it started, and no process holds its lock now
    (run / "launch" / "cancelled").write_text("killed after 30 s: rank 1 (pid 12)\n")
    assert local_state(run) is JobState.CANCELLED
    assert Interactive().states([LocalRef(str(run), 0.0, 30.0, False)]) == [StateInfo(JobState.CANCELLED, "")]
    assert records.read_cancel(run / "launch") == records.Cancel(how="killed after 30 s: rank 1 (pid 12)")
    # the previous version's `automodel-hydra cancel` also left cancel.json (who, ids, state), without `how`
    (run / "launch" / "cancel.json").write_text(json.dumps({"job_ids": ["12"], "was": "RUNNING", "run_id": None,
                                                            "by": "automodel-hydra cancel"}))
    assert records.read_cancel(run / "launch") == records.Cancel("automodel-hydra cancel", ("12",), "RUNNING",
                                                                 "killed after 30 s: rank 1 (pid 12)")
    records.clear_cancel(run / "launch")
    assert local_state(run) is JobState.FAILED
    assert sorted(p.name for p in (run / "launch").iterdir()) == ["pid"]


def test_a_records_paths_on_this_machine_move_with_its_dir_and_a_login_nodes_stay(tmp_path: Path) -> None:
    """Paths inside the dir that holds a record are stored relative to it and read under the dir as named now; a
    path outside it and a ``slurm.tunnel`` job's paths on its login node stay as recorded, and so does a log that
    is a command (SkyPilot's ``sky jobs logs 7``)."""
    sweep = tmp_path / "S"
    record = {"job_dir": str(sweep / "0"), "log_path": str(sweep / "slurm" / "7_0_0_log.out"),
              "files": [str(sweep / "0" / "launch" / "sbatch.sh")], "checkpoint_dir": "/data/ckpt",
              "ref": {"job_id": "7_0", "remote": {"job_dir": str(sweep / "0"), "log": f"{sweep}/slurm/x.out",
                                                  "local_log": str(sweep / "slurm" / "7_0_0_log.out")}}}
    saved = records.stored(record, sweep)
    assert saved["job_dir"] == "0" and saved["files"] == ["0/launch/sbatch.sh"]
    assert saved["checkpoint_dir"] == "/data/ckpt" and saved["ref"]["remote"]["job_dir"] == str(sweep / "0")
    moved = tmp_path / "elsewhere" / "S2"
    read = records.placed(saved, moved)
    assert read["job_dir"] == str(moved / "0") and read["log_path"] == str(moved / "slurm" / "7_0_0_log.out")
    assert read["ref"]["remote"]["local_log"] == str(moved / "slurm" / "7_0_0_log.out")
    assert read["ref"]["remote"] == {**record["ref"]["remote"], "local_log": read["ref"]["remote"]["local_log"]}
    assert read["checkpoint_dir"] == "/data/ckpt" and "relative" not in read
    sky = records.stored({"job_dir": str(sweep), "log_path": "sky jobs logs 7"}, sweep)
    assert records.placed(sky, moved) == {"job_dir": str(moved), "log_path": "sky jobs logs 7"}
    # written by the previous version (absolute paths): its recorded root is mapped onto the dir named
    assert records.placed(record, moved, old_root=str(sweep))["files"] == [str(moved / "0" / "launch" / "sbatch.sh")]
