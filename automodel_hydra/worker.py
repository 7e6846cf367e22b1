"""What every rank runs, whichever launcher started it: ``python -m automodel_hydra.worker JOB_YAML``.

Reads the job's validated config (``launch/job.yaml``, written by the driver), initialises torch.distributed from
the launcher's environment (:mod:`automodel_hydra.bootstrap`), runs the recipe, and tears down.

Signals (the rule and its sources: docs/slurm.md, "Signals"). SIGUSR2 and SIGTERM only set a flag, installed
before anything heavy is imported (SIGUSR2's default action would kill a rank that is still importing torch); the
recipe agrees on it across ranks at the next step boundary, every rank checkpoints that same step, and then:

* SIGUSR2 is the time-limit warning (``sbatch --signal=USR2@N``; also ``scancel --signal=USR2``): under Slurm,
  rank 0 requeues the job (``scontrol requeue``, at most ``AUTOMODEL_MAX_REQUEUES`` restarts, counted by
  ``SLURM_RESTART_COUNT``) and the requeued job resumes from that checkpoint by itself
  (``restore_from.path: latest``). Unless the job is being preempted (``scontrol show job``: PreemptTime set;
  sites with ``preempt_send_user_signal`` send the job's signal at preemption): then the ranks wait for Slurm's
  SIGTERM at the end of the grace time, so that the site's PreemptMode applies.
* SIGTERM means the job is being ended by someone else: ``scancel``, a preemption, the time limit itself, a node
  shutdown, torchrun stopping its workers. The worker checkpoints and exits; it never requeues. Slurm then does
  what the site and the user asked: a cancelled job stays CANCELLED, a job preempted under PreemptMode=REQUEUE
  is requeued by Slurm (and resumes), under PreemptMode=CANCEL it ends PREEMPTED.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

from automodel_hydra import heartbeat, quiet

log = logging.getLogger("automodel_hydra.worker")

#: ``launch/cancelled``: written by a local cancel (automodel_hydra.backends.interactive) before it signals the ranks.
#: ``launch/error.rank<N>.json``: a failed rank's exception where no torchrun agent named an error file for it
#: (Slurm's srun ranks, a rank started by hand); see :func:`error_file`.
RANK_ERROR_PREFIX = "error.rank"

#: Exit code of a rank that stopped early on a signal and was not requeued (128 + SIGTERM, as a shell reports it).
EXIT_STOPPED = 143


class StopFlag:
    """Records SIGUSR2/SIGTERM; read by the recipe at step boundaries. Installing it replaces earlier handlers
    (submitit's included, whose rank-0-only checkpoint cannot coordinate a distributed save)."""

    def __init__(self) -> None:
        self.signals: list[int] = []  # in arrival order, each once

    @property
    def signum(self) -> int | None:
        """The first stop signal that arrived, or None."""
        return self.signals[0] if self.signals else None

    @property
    def terminated(self) -> bool:
        """Whether SIGTERM arrived: the job is being ended by someone else, and must not requeue itself."""
        return signal.SIGTERM in self.signals

    def install(self, signums: tp.Iterable[int] = (signal.SIGUSR2, signal.SIGTERM)) -> StopFlag:
        for s in signums:
            signal.signal(s, self._handle)
        return self

    def _handle(self, signum: int, frame: object) -> None:
        if not self.signals:
            log.warning("caught %s: checkpointing at the next step boundary", signal.Signals(signum).name)
        elif signum not in self.signals:
            log.warning("caught %s as well", signal.Signals(signum).name)
        if signum not in self.signals:
            self.signals.append(signum)

    def __call__(self) -> bool:
        return bool(self.signals)


def stop_when_parent_dies(signum: int = signal.SIGTERM) -> None:
    """Have the kernel send ``signum`` to this rank when its parent dies (Linux ``PR_SET_PDEATHSIG``).

    torchrun starts every rank in a session of its own, so when the agent is killed outright (SIGKILL, the
    OOM killer) nothing stops the ranks: they trained on unattended, writing into the run dir while a rerun started.
    With SIGTERM as the death signal they checkpoint at the next step boundary and exit, as on any stop signal."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    pr_set_pdeathsig = 1
    if ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signum), 0, 0, 0) != 0:
        log.warning("prctl(PR_SET_PDEATHSIG) failed: this rank will outlive a killed torchrun agent")
    elif os.getppid() != parent:  # the parent died before the request took effect
        os.kill(os.getpid(), signum)


def setup_logging(rank: int, log_file: str | None) -> None:
    """Rank 0 logs INFO to stderr and appends to the job log; other ranks log warnings to stderr and append only
    their errors to the job log (so a failing rank's traceback is in the log ``automodel-hydra logs`` shows)."""
    fmt = f"[%(asctime)s][rank{rank}][%(name)s][%(levelname)s] - %(message)s"
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    if log_file:
        to_file = logging.FileHandler(log_file, mode="a")
        to_file.setLevel(logging.INFO if rank == 0 else logging.ERROR)
        handlers.append(to_file)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format=fmt, handlers=handlers,
                        force=True)


def slurm_requeue_target(environ: tp.Mapping[str, str]) -> str:
    """The id ``scontrol requeue`` needs: ``ARRAYJOB_TASK`` inside an array, else ``SLURM_JOB_ID``."""
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ["SLURM_JOB_ID"]


def requeues_left(environ: tp.Mapping[str, str] = os.environ) -> bool:
    """Whether this Slurm job may be requeued once more (the same answer on every rank).

    ``SLURM_RESTART_COUNT`` counts every restart, Slurm's own requeues after a preemption or node failure
    included, so ``AUTOMODEL_MAX_REQUEUES`` bounds the job's restarts of any cause."""
    if "SLURM_JOB_ID" not in environ:
        return False
    return int(environ.get("SLURM_RESTART_COUNT", "0")) < int(environ.get("AUTOMODEL_MAX_REQUEUES", "0"))


def preempt_time(scontrol_show_job: str) -> str | None:
    """``PreemptTime`` from ``scontrol show job`` output, or None when unset (``None``/``Unknown``): set from the
    moment Slurm selects the job for preemption (slurm.conf(5), GraceTime and PreemptParameters)."""
    m = re.search(r"\bPreemptTime=(\S+)", scontrol_show_job)
    return m.group(1) if m and m.group(1) not in ("None", "Unknown", "(null)", "0") else None


def being_preempted(environ: tp.Mapping[str, str] = os.environ) -> bool:
    """Whether Slurm has selected this job for preemption (``scontrol show job``); False when that cannot be told.

    A site with ``SlurmctldParameters=preempt_send_user_signal`` sends the job's ``--signal`` (our SIGUSR2) when it
    preempts it (slurm.conf(5)): that SIGUSR2 is not the time-limit warning."""
    try:
        proc = subprocess.run(["scontrol", "show", "job", "-o", environ["SLURM_JOB_ID"]], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("could not ask scontrol whether this job is being preempted (%s); assuming it is not", e)
        return False
    return proc.returncode == 0 and preempt_time(proc.stdout) is not None


#: What a rank does after it checkpointed on a signal (:func:`after_stop`).
REQUEUE, EXIT, WAIT = "requeue", "exit", "wait"


def after_stop(*, usr2: bool, term: bool, preempted: bool, requeues_left: bool) -> tuple[str, str]:
    """The rule for a job that stopped on a signal (docs/slurm.md, "Signals"): ``(action, why)``.

    ``usr2``/``term``: whether any rank caught SIGUSR2/SIGTERM; ``preempted``: Slurm has selected the job for
    preemption; ``requeues_left``: :func:`requeues_left` (False outside Slurm). Actions:

    * :data:`REQUEUE` -- SIGUSR2 alone, the time-limit warning: rank 0 runs ``scontrol requeue``.
    * :data:`WAIT` -- SIGUSR2 sent because Slurm preempts the job (PreemptTime set; a site with
      ``preempt_send_user_signal`` and a GraceTime): wait for Slurm's SIGTERM at the end of the grace time, so
      that the site's PreemptMode applies (a job that ended by itself would be neither requeued nor PREEMPTED).
    * :data:`EXIT` -- SIGTERM (scancel, preemption, the time limit itself, node shutdown, torchrun): Slurm
      decides what follows; or SIGUSR2 with no requeue left (the job ends FAILED, its checkpoint kept).
    """
    if term:
        return EXIT, "SIGTERM: the job is being ended (scancel, preemption, time limit); Slurm decides what follows"
    if usr2 and preempted:
        return WAIT, "SIGUSR2 came with a preemption (PreemptTime is set); waiting for Slurm to end the job"
    if not usr2:
        return EXIT, "no SIGUSR2"
    if not requeues_left:
        return EXIT, "no requeue left (slurm.max_requeues, counted by SLURM_RESTART_COUNT)"
    return REQUEUE, "SIGUSR2: the time-limit warning"


def wait_for_sigterm(stop: StopFlag, poll_s: float = 0.5) -> None:
    """Sleep until SIGTERM has arrived (Slurm ends a preempted job with it at the end of its GraceTime)."""
    while not stop.terminated:
        time.sleep(poll_s)


def requeue(environ: tp.Mapping[str, str] = os.environ) -> None:
    """Ask Slurm to requeue this job (``scontrol requeue``); it restarts and resumes from its checkpoint."""
    target = slurm_requeue_target(environ)
    log.warning("requeuing Slurm job %s (restart %s of slurm.max_requeues=%s)", target,
                int(environ.get("SLURM_RESTART_COUNT", "0")) + 1, environ.get("AUTOMODEL_MAX_REQUEUES"))
    subprocess.run(["scontrol", "requeue", target], check=True)


def _agree(flags: tp.Sequence[bool], dist_env: tp.Any) -> list[bool]:
    """Each flag true on every rank when it is true on any rank (one all_reduce MAX)."""
    import torch
    import torch.distributed as dist

    if dist_env.env.world_size <= 1 or not dist.is_initialized():
        return [bool(f) for f in flags]
    t = torch.tensor([int(f) for f in flags], device=dist_env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def run(job_file: str | Path, log_file: str | None = None, stop: StopFlag | None = None) -> dict[str, tp.Any]:
    """Run one rank of the job described by ``job_file``. Returns the recipe's final metrics.

    ``stop``: the flag the signal handlers set (installed here when not given). Raises SystemExit(EXIT_STOPPED)
    when a signal stopped training and the job was not requeued (:func:`after_stop`)."""
    stop = stop or StopFlag().install()
    from omegaconf import DictConfig, OmegaConf

    from automodel_hydra import config, recipes
    from automodel_hydra.bootstrap import DistEnv, init_distributed
    from automodel_hydra.plan import CANCELLED_MARK, RESULT_FILE

    if "TORCHELASTIC_RUN_ID" in os.environ:  # started by torchrun: stop with the agent
        stop_when_parent_dies()
    env = DistEnv.from_environ()
    setup_logging(env.rank, log_file)
    os.environ.setdefault("TORCHELASTIC_ERROR_FILE", str(error_file(Path(job_file).parent, env.rank)))
    action, why = EXIT, ""
    try:
        raw = OmegaConf.load(job_file)
        if not isinstance(raw, DictConfig):
            raise TypeError(f"{job_file}: expected the job's config (a mapping), found a list")
        cfg = config.load_rank(raw)
        with init_distributed(env, timeout_minutes=cfg.dist_env.timeout_minutes) as dist_env:
            log.info("%r on %s", env, dist_env.device)
            recipe = recipes.resolve(cfg.recipe)  # the bundled recipe, an AutoModel recipe or a user's function
            start_heartbeats(Path(job_file).parent, env.rank)
            capture = capture_range(cfg, env.rank)
            try:
                result = recipes.run_recipe(recipe, cfg if cfg.bundled else cfg.recipe_sections, dist_env,
                                            should_stop=stop, output_dir=cfg.output_dir)
            finally:
                heartbeat.uninstall()
                if capture is not None:
                    capture.close()
            if result.get("stopped_early"):
                in_slurm = "SLURM_JOB_ID" in os.environ
                usr2 = signal.SIGUSR2 in stop.signals
                # rank 0 alone asks scontrol (one call per job), and only when SIGUSR2 is all it caught
                preempted = in_slurm and env.rank == 0 and usr2 and not stop.terminated and being_preempted()
                usr2, term, preempted = _agree([usr2, stop.terminated, preempted], dist_env)
                action, why = after_stop(usr2=usr2, term=term, preempted=preempted,
                                         requeues_left=in_slurm and requeues_left())
    except (SystemExit, KeyboardInterrupt):
        raise  # a stop's own orderly exit (EXIT_STOPPED), not a failure
    except BaseException as e:
        from automodel_hydra.schema import UserError

        if isinstance(e, UserError):  # a mistake the user can fix: its one line, no traceback
            log.error("rank %d failed: %s: %s", env.rank, type(e).__name__, e)
            raise
        log.error("rank %d failed", env.rank, exc_info=e)
        cause = failure_cause(e)
        if cause is e:
            raise  # torch's ``record`` (main) writes it to this rank's error file
        raise cause from e
    if result.get("stopped_early"):
        if action == REQUEUE:
            if env.rank == 0:  # every rank has finished its checkpoint: the recipe waited for it
                requeue()
            return result
        if (Path(job_file).parent / CANCELLED_MARK).exists() and "SLURM_JOB_ID" not in os.environ:
            # a local run the user cancelled: the stop is the outcome asked for, so the ranks end cleanly and
            # torchrun exits quietly (the mark tells status it was CANCELLED)
            log.warning("stopped at step %s on a signal; cancelled by the user: exiting cleanly", result.get("step"))
            return result
        log.warning("stopped at step %s on a signal; not requeued: %s", result.get("step"), why)
        if action == WAIT:
            wait_for_sigterm(stop)
        raise SystemExit(EXIT_STOPPED)
    if env.rank == 0:
        from automodel_hydra.plan import read_run_id

        result = write_result(Path(cfg.output_dir) / RESULT_FILE, result, read_run_id(Path(job_file).parent))
    return result


def failure_cause(error: BaseException) -> Exception:
    """The exception a failed rank reports: ``error`` itself when it is an ``Exception``; else the first cause it
    carries. torch's ``CheckpointException`` (a ``BaseException``, raised by ``torch.distributed.checkpoint`` for a
    save onto a full disk or a load into a model of another shape) holds each rank's own exception in
    ``failures`` (``{rank: (exception, traceback)}``); its text starts with ``CheckpointException ranks:...``
    and names no cause. torch's ``record`` writes only ``Exception``s to the error file, so anything else would
    reach neither the error file nor the launching command's last line.

    Returns an ``Exception`` whose first line names the cause (``ValueError: Size mismatch between saved ...``,
    ``OSError: [Errno 28] No space left on device``): of several ranks' causes an ``OSError`` first, else the
    lowest rank's; a ``RuntimeError`` quoting ``error`` when no cause is found."""
    if isinstance(error, Exception):
        return error
    failures = getattr(error, "failures", None)
    if isinstance(failures, dict):
        causes = []
        for rank in sorted(failures, key=str):
            found = failures[rank]
            exc = found[0] if isinstance(found, tuple) and found else found
            if isinstance(exc, BaseException):
                causes.append(failure_cause(exc))
        # the system's own reason first: on a full disk one rank may see ENOSPC and another only torch's zip
        # writer's "unexpected pos" for the same short write
        for cause in sorted(causes, key=lambda c: not isinstance(c, OSError)):
            return cause
    text = next((line for line in str(error).splitlines() if line.strip()), "")
    return RuntimeError(f"{type(error).__name__}: {text}")


def capture_range(cfg: tp.Any, rank: int) -> tp.Any:
    """Under ``profile=nsys`` (``nsys profile --capture-range=cudaProfilerApi``), the capture range of a recipe that
    is not the bundled one (which calls the profiler API itself): :class:`automodel_hydra.profile.StepRange`,
    installed; None when profiling is off, for the bundled recipe, and for one that sets its own range (AutoModel's
    ``benchmark.nsys_start``)."""
    from automodel_hydra import profile

    if not cfg.profile.nsys.enabled or cfg.bundled:
        return None
    if profile.recipe_controls_range(cfg.recipe_sections):
        if rank == 0:
            log.info("nsys capture range: the recipe's own (benchmark.nsys_start/nsys_end); profile.nsys.start_step"
                     " and stop_step are not used")
        return None
    return profile.StepRange(cfg.profile.nsys, rank).install()


def start_heartbeats(launch_dir: Path, rank: int) -> None:
    """Under ``ft_launcher``: one heartbeat per optimizer step and the hung-rank watchdog
    (:func:`automodel_hydra.heartbeat.install`); rank 0 of a restarted attempt records it and why the previous
    attempt ended (``launch/ft/attempts.jsonl``). Elsewhere nothing."""
    if not heartbeat.under_ft_launcher():
        return
    from automodel_hydra import fault_tolerance

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if rank == 0 and attempt > 0:
        fault_tolerance.record_attempt(launch_dir, attempt, time.time())
        log.warning("in-job restart %d: %s", attempt, fault_tolerance.restart_reason(launch_dir, attempt - 1))
    heartbeat.install(launch_dir, rank)


def error_file(launch_dir: Path, rank: int) -> Path:
    """Where a rank that no torchrun agent started records its exception: ``launch/error.rank<N>.json``.

    torch's ``record`` (torch.distributed.elastic.multiprocessing.errors, wrapped around :func:`run` by
    :func:`main`) writes a failed rank's exception, traceback and time to ``$TORCHELASTIC_ERROR_FILE``. torchrun
    names that file for each of its ranks (under its ``--log-dir``; it fills its "Root Cause" summary from it);
    srun's ranks get this one. Either way the launching command quotes the lowest failed rank's exception as its
    last line (:func:`automodel_hydra.plan.rank_error`)."""
    return launch_dir / f"{RANK_ERROR_PREFIX}{rank}.json"


def write_result(path: Path, result: dict[str, tp.Any], run_id: str | None = None) -> dict[str, tp.Any]:
    """Rank 0's final metrics, written atomically with the launch's id (``run_id``, from ``launch/run_id``; the
    launcher takes the file for this launch's only when the ids agree). Returns what was written.

    A run with nothing left to do — its result has no ``loss``, at the ``step`` of an earlier result that has one
    (a rerun of a finished run, a Slurm requeue after the last step, a recipe that resumed at its end) — keeps the
    earlier result (re-stamped with this launch's id) and says so in one line, instead of replacing it with
    ``loss: null``."""
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        earlier = None
    if (result.get("loss") is None and result.get("step") is not None and isinstance(earlier, dict)
            and earlier.get("step") == result.get("step") and earlier.get("loss") is not None):
        log.warning("already at step %s: nothing left to train; the earlier result is kept (%s)",
                    result["step"], path)
        result = {k: v for k, v in earlier.items() if k != "run_id"}
    out = {**result, "run_id": run_id} if run_id else dict(result)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return out


def main(argv: list[str] | None = None) -> None:
    # first of all: a SIGUSR2 (or SIGTERM) while torch and the recipe are still being imported (5-15 s) must set
    # the flag, not end the rank with the signal's default action
    stop = StopFlag().install()
    parser = argparse.ArgumentParser(prog="python -m automodel_hydra.worker", description=__doc__.splitlines()[0])
    parser.add_argument("job_file", help="the job's launch/job.yaml")
    parser.add_argument("--log-file", default=None, help="job log rank 0 appends to")
    args = parser.parse_args(argv)
    quiet.install()  # before torch: its import prints dependencies' lines that tell the user nothing
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        # an exception is written to this rank's error file (see error_file): torchrun's "Root Cause" and our
        # last line both come from it
        record(run)(args.job_file, args.log_file, stop)
    finally:
        # skip the interpreter's final collection of torch/transformers objects (~1 s per rank at exit, more
        # under load): a rank stopped by Slurm has KillWait seconds (default 30) from SIGTERM to SIGKILL
        gc.freeze()


if __name__ == "__main__":
    main()
