"""The rules behind every run's final word, on real files and real streams (fast): a job's state is what its ranks
did (automodel_hydra.outcome), which failures a restart repeats (automodel_hydra.failures), who started a rank
(the plan, never leftover variables), per-attempt names, Hydra's runtime values resolved at plan time, paths too
long for the filesystem, and output whose reader went away (automodel_hydra.streams)."""

from __future__ import annotations

import errno
import json
import os
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import failures, outcome, paths, streams
from automodel_hydra.bootstrap import DistEnv
from automodel_hydra.plan import JobSpec, attempt_name, error_stamps, rank_error, write_run_id
from automodel_hydra.schema import ConfigError
from automodel_hydra.states import JobState, StateInfo

# ----------------------------------------------------------------------------------------------- a job's state


def _job(tmp_path: Path) -> JobSpec:
    job = JobSpec(tmp_path / "J", "train")
    write_run_id(job, "this")
    return job


def _result(job: JobSpec, run_id: str = "this") -> None:
    job.result_file.write_text(json.dumps({"loss": 1.0, "run_id": run_id}))


def _end(job: JobSpec, rank: int, how: str, step: int, *, world: int = 2, restart: int = 0, error: str | None = None,
         at: float | None = None) -> None:
    path = outcome.record_end(job.launch_dir, rank=rank, world_size=world, how=how, step=step, restart=restart,
                              error=error)
    if at is not None:  # the file server's modification time orders the events, never a clock of this host
        os.utime(path, (at, at))


def test_sacct_completed_without_a_result_is_failed_naming_the_rank_that_returned_first(tmp_path: Path) -> None:
    """ft_launcher exits 0 once its restarts are spent when one rank had returned; the scheduler then says
    COMPLETED. The ranks say otherwise, and the line says which rank ended first and how."""
    job = _job(tmp_path)
    now = time.time()
    _end(job, 1, outcome.RETURNED, 3, at=now - 5)
    _end(job, 0, outcome.RAISED, 3, error="RuntimeError: Connection closed by peer", at=now)
    verdict = outcome.derive(job, JobState.COMPLETED)
    assert verdict.state is JobState.FAILED
    assert verdict.why == ("user_error: rank 1 returned at step 3 while the others trained; then rank 0: RuntimeError: "
                           "Connection closed by peer")
    # the commands that show it: status (through backend_states), report's "completed"
    record = {"backend": "slurm", "job_dir": str(job.job_dir), "log_name": "train"}
    assert outcome.state_info(record, StateInfo(JobState.COMPLETED)) == StateInfo(JobState.FAILED, verdict.why)
    assert not outcome.completed(job)


def test_completed_needs_this_launchs_result_and_every_rank_of_the_last_attempt_returned(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _end(job, 0, outcome.RETURNED, 8)
    assert outcome.derive(job, JobState.COMPLETED).state is JobState.FAILED  # rank 1 left no record (killed?)
    _end(job, 1, outcome.RETURNED, 8)
    assert outcome.derive(job, JobState.COMPLETED).state is JobState.FAILED  # no result
    _result(job, run_id="earlier")
    assert "an earlier launch's" in str(outcome.derive(job, JobState.COMPLETED).why)
    _result(job)
    assert outcome.derive(job, JobState.COMPLETED) == outcome.Verdict(JobState.COMPLETED)
    # an agent that exited non-zero (its terminal went away) after every rank returned: the ranks' work is done
    assert outcome.derive(job, JobState.FAILED).state is JobState.COMPLETED
    # a scheduler's own final word stands, with the ranks' explanation
    assert outcome.derive(job, JobState.TIMEOUT).state is JobState.TIMEOUT
    assert outcome.derive(job, JobState.RUNNING) == outcome.Verdict(JobState.RUNNING)
    # a restarted attempt whose ranks did not all return: the earlier attempt's returns do not count
    _end(job, 0, outcome.RAISED, 9, restart=1, error="ValueError: x")
    assert outcome.derive(job, JobState.COMPLETED).state is JobState.FAILED
    assert outcome.last_attempt(job.launch_dir) == (0, 1)


def test_a_job_dir_without_rank_records_keeps_the_result_rule(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _result(job)
    assert outcome.derive(job, JobState.COMPLETED).state is JobState.COMPLETED
    assert outcome.derive(job, JobState.FAILED).state is JobState.FAILED  # nothing says every rank returned


def test_an_earlier_launchs_rank_records_are_not_this_ones(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _end(job, 1, outcome.RETURNED, 3)
    write_run_id(job, "next")
    assert outcome.ends(job.launch_dir) == [] and outcome.ranks_completed(job.launch_dir) is None


def test_the_first_failed_ranks_traceback_is_the_one_shown(tmp_path: Path) -> None:
    job = _job(tmp_path)
    before = error_stamps(job)
    for rank, (message, at) in enumerate([("RuntimeError: Connection closed by peer", 20.0),
                                          ("ValueError: bad batch", 10.0)]):
        path = job.launch_dir / f"error.rank{rank}.json"
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": (
            "Traceback (most recent call last):\n  File \"/x/torch/distributed/elastic/multiprocessing/errors/"
            "__init__.py\", line 1, in wrapper\n    return f(*args, **kwargs)\n  File \"recipe.py\", line 3, in main"
            f"\n    step()\n{message}\n")}}}))
        os.utime(path, (at, at))
    assert rank_error(job, before) == "rank 1: ValueError: bad batch"
    shown = outcome.first_traceback(job, before)
    assert shown is not None and shown.endswith("ValueError: bad batch") and "wrapper" not in shown
    assert shown.splitlines()[0] == "Traceback (most recent call last):"


def test_backend_states_feed_status_and_a_sweeps_counts_with_the_ranks_word(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """``automodel-hydra status``, ``runs`` and a sweep's progress counts all read backend_states: a job that
    sacct calls COMPLETED and that wrote no result counts as FAILED there."""
    from automodel_hydra import backends, progress
    from automodel_hydra.backends import slurm

    done, early = _job(tmp_path / "a"), _job(tmp_path / "b")
    for job in (done, early):
        _end(job, 0, outcome.RETURNED, 8, world=1)
    _result(done)
    monkeypatch.setattr(slurm.Slurm, "states", lambda self, refs: [StateInfo(JobState.COMPLETED)] * len(refs))
    records = [{"backend": "slurm", "job_dir": str(j.job_dir), "log_name": "train", "job_ids": [str(i)]}
               for i, j in enumerate((done, early))]
    states = [i.state for i in progress.backend_states(records)]
    assert states == [JobState.COMPLETED, JobState.FAILED]
    assert progress.summarize(states) == "2 jobs submitted: 2 done (1 COMPLETED, 1 FAILED)"
    assert backends.get("skypilot").ranks_write_job_dir is False  # its ranks write on their nodes


# ----------------------------------------------------------------------------------------------- failures


def test_a_restart_repeats_config_interpolation_and_import_errors_only() -> None:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    with pytest.raises(OmegaConfBaseException) as interp:
        _ = OmegaConf.create({"a": "${hydra:runtime.output_dir}"}).a
    try:
        try:
            import no_such_module_anywhere  # noqa: F401
        except ImportError as e:
            raise RuntimeError("Error instantiating 'x.Y'") from e  # as Hydra's instantiate wraps it
    except RuntimeError as e:
        wrapped: BaseException = e
    cases: list[tuple[BaseException, str]] = [
        (ConfigError("optim.lr", -1, "must be > 0"), failures.USER_ERROR),
        (interp.value, failures.USER_ERROR),
        (ModuleNotFoundError("No module named 'x'"), failures.USER_ERROR),
        (wrapped, failures.USER_ERROR),
        (RuntimeError("NCCL communicator was aborted"), failures.COMM),
        (MemoryError(), failures.OOM),
        (RuntimeError("bad batch"), failures.CRASH),
    ]
    for error, kind in cases:
        found = failures.of_exception(error)
        assert found.kind == kind, (error, found)
        assert failures.restart_repeats(found) is (kind in (failures.USER_ERROR, failures.OOM))
    assert failures.of_exception(wrapped).evidence == "ModuleNotFoundError: No module named 'no_such_module_anywhere'"


# ----------------------------------------------------------------------------------------------- who started a rank

#: What a notebook, an earlier torchrun or an allocation leaves in a shell.
LEFTOVERS = {"TORCHELASTIC_RUN_ID": "notebook", "RANK": "5", "LOCAL_RANK": "3", "WORLD_SIZE": "8",
             "SKYPILOT_NODE_RANK": "2", "SKYPILOT_NUM_NODES": "4", "FT_RANK_MONITOR_IPC_SOCKET": "/tmp/nope.sock",
             "SUBMITIT_LOCAL_GLOBALID": "1"}


def test_the_plan_not_the_environment_says_where_a_rank_is() -> None:
    slurm_task = {"SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NTASKS": "2", "SLURM_STEP_NUM_NODES": "1",
                  "SLURM_NODEID": "0", "SLURM_JOB_ID": "42", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "13784"}
    env = DistEnv.from_environ({**LEFTOVERS, **slurm_task}, started_by="srun")
    assert (env.launcher, env.rank, env.local_rank, env.world_size) == ("slurm", 1, 1, 2)
    single = DistEnv.from_environ(LEFTOVERS, started_by="single")
    assert (single.launcher, single.rank, single.world_size) == ("single", 0, 1)
    with pytest.raises(ValueError, match=r"plan has torchrun start this rank, and \$TORCHELASTIC_RUN_ID"):
        DistEnv.from_environ(slurm_task, started_by="torchrun")
    # by hand (no plan): the environment is all there is, as before
    assert DistEnv.from_environ({**LEFTOVERS, "TORCHELASTIC_RUN_ID": "x"}).launcher == "torchrun"


def test_a_slurm_submit_and_a_local_job_drop_an_agents_leftovers(monkeypatch: pytest.MonkeyPatch) -> None:
    from automodel_hydra.backends import slurm_transport
    from automodel_hydra.bootstrap import is_launcher_var

    for name, value in {**LEFTOVERS, "SLURM_JOB_ID": "7", "SLURM_CONF": "/etc/slurm.conf", "HF_HOME": "/h"}.items():
        monkeypatch.setenv(name, value)
    env = slurm_transport.submit_env()
    assert not set(LEFTOVERS) & set(env) and "SLURM_JOB_ID" not in env
    assert env["SLURM_CONF"] == "/etc/slurm.conf" and env["HF_HOME"] == "/h"
    # a local job keeps the shell's Slurm allocation (salloc), which decides nothing for its ranks
    assert not is_launcher_var("SLURM_JOB_ID", schedulers=False) and is_launcher_var("TORCHELASTIC_RUN_ID", False)


# ----------------------------------------------------------------------------------------------- per attempt


def test_every_attempt_keeps_its_own_files() -> None:
    from automodel_hydra import config, fault_tolerance
    from automodel_hydra.profile import nsys_prefix
    from automodel_hydra.worker import error_file

    assert attempt_name(0) == "attempt0" and attempt_name(2, requeue=1) == "requeue1.attempt2"
    names = {fault_tolerance.hang_file(Path("L"), 1, a, r).name for a in (0, 1) for r in (0, 1)}
    assert len(names) == 4
    assert error_file(Path("L"), 3).name == "error.rank3.json"
    assert error_file(Path("L"), 3, requeue=2).name == "error.rank3.requeue2.json"
    argv = nsys_prefix(config.NsysConfig(enabled=True), "/o", "job", attempt_vars=(
        ("requeue", "AUTOMODEL_REQUEUE"), ("attempt", "TORCHELASTIC_RESTART_COUNT")))
    assert "--output=/o/job_%h_rank%q{RANK}_requeue%q{AUTOMODEL_REQUEUE}_attempt%q{TORCHELASTIC_RESTART_COUNT}" in argv


def test_a_requeued_srun_ranks_error_file_is_read_as_that_attempts(tmp_path: Path) -> None:
    job = _job(tmp_path)
    first, requeued = job.launch_dir / "error.rank0.json", job.launch_dir / "error.rank0.requeue1.json"
    for path, message in ((first, "ValueError: first"), (requeued, "ValueError: after the requeue")):
        path.write_text(json.dumps({"message": {"message": message}}))
    os.utime(requeued, (1.0, 1.0))  # older, but of the newer attempt
    assert rank_error(job) == "rank 0: ValueError: after the requeue"


# ----------------------------------------------------------------------------------------------- values the ranks get


def test_hydras_runtime_values_resolve_at_plan_time_for_a_function_recipe(tmp_path: Path) -> None:
    from automodel_hydra import config
    from tests.helpers import compose_cfg

    cfg = compose_cfg(["+recipe=tests.hang_recipe:main", "+paths.out=${hydra:runtime.output_dir}/mine",
                       "+paths.name=${hydra:job.name}", "+env.h=${oc.env:HOME}", "+env.o=${output_dir}/x"],
                      output_dir=tmp_path)
    loaded = config.load(cfg)
    assert loaded.recipe_sections["paths"] == {"out": f"{tmp_path}/mine", "name": "train"}
    assert "${" not in json.dumps(config.rank_spec(loaded)["paths"])
    # the ranks' own environment and the keys they get are theirs to resolve
    assert loaded.recipe_sections["env"] == {"h": "${oc.env:HOME}", "o": "${output_dir}/x"}
    # what the ranks cannot resolve is one line at plan time, naming the key
    with pytest.raises(ConfigError) as e:
        config.load(compose_cfg(["+recipe=tests.hang_recipe:main", "+paths.n=${interactive.nproc_per_node}"],
                                output_dir=tmp_path))
    assert str(e.value).startswith("paths.n='${interactive.nproc_per_node}' is invalid: it does not resolve on "
                                   "the ranks") and "\n" not in str(e.value)


# ----------------------------------------------------------------------------------------------- paths


def test_a_name_over_the_filesystems_limit_is_one_line_with_the_way_out(tmp_path: Path) -> None:
    long = "+x1=" + "a" * 130 + ",+x2=" + "b" * 130
    problem = paths.sweep_dir_problem(str(tmp_path), long, "${hydra.job.override_dirname}",
                                      ["+x1=" + "a" * 130, "+x2=" + "b" * 130, "seed=1"])
    assert problem is not None
    line = str(problem)
    assert line.startswith("hydra.sweep.subdir='${hydra.job.override_dirname}' is invalid: it makes a name of 269 "
                           "bytes") and "255-byte limit" in line and "\n" not in line
    assert "hydra.job.config.override_dirname.exclude_keys=[x1,x2,seed]" in line and "${hydra.job.num}" in line
    assert paths.sweep_dir_problem(str(tmp_path), "seed=1", "${hydra.job.override_dirname}") is None
    assert paths.too_long(tmp_path / ("é" * 128)) is not None  # bytes, not characters: 256 bytes
    from automodel_hydra import config
    from tests.helpers import compose_cfg

    cfg = config.load(compose_cfg(["checkpoint.dir=" + "c" * 300], output_dir=tmp_path))
    (problem,) = paths.name_problems(cfg, tmp_path, "train")
    assert str(problem).startswith("checkpoint.dir=") and "255-byte limit" in str(problem)


# ----------------------------------------------------------------------------------------------- readers that go away


def test_a_closed_pipe_costs_nothing_but_the_output(tmp_path: Path) -> None:
    read, write = os.pipe()
    stream = os.fdopen(write, "w", buffering=1)
    os.close(read)  # the reader went away (| head -3)
    guarded = streams.BestEffort(stream)
    with pytest.raises(BrokenPipeError):
        stream.write("a line\n")  # what a progress bar's write meets without the guard
    guarded.write("Writing model shards: 100%\n")  # no error: the fd now points at /dev/null
    guarded.flush()
    assert guarded.gone and os.readlink(f"/proc/self/fd/{stream.fileno()}") == os.devnull
    guarded.write("more\n")  # and every later write, ours or a library's, succeeds unread
    stream.close()


def test_a_write_that_fails_for_another_reason_still_fails(tmp_path: Path) -> None:
    class Full:
        def write(self, text: str) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        streams.BestEffort(tp.cast(tp.TextIO, Full())).write("x")
    assert streams.BestEffort(sys.stderr).isatty() == sys.stderr.isatty()  # everything else is the stream's
