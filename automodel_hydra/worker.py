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
import dataclasses
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

from automodel_hydra import heartbeat, quiet, streams

log = logging.getLogger("automodel_hydra.worker")

#: ``launch/cancelled``: written by a local cancel (automodel_hydra.backends.interactive) before it signals the ranks.
#: ``launch/error.rank<N>.json``: a failed rank's exception where no torchrun agent named an error file for it
#: (Slurm's srun ranks, a rank started by hand); see :func:`error_file`.
RANK_ERROR_PREFIX = "error.rank"

#: Exit code of a rank that stopped early on a signal and was not requeued (128 + SIGTERM, as a shell reports it).
EXIT_STOPPED = 143
#: Exit code of a restarted rank that does not run because the previous attempt's class has no budget left.
EXIT_NOT_RETRIED = 1


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


#: A log record's ``extra`` key: False keeps its traceback off the terminal (it still goes to the job log).
CONSOLE_TRACEBACK = "console_traceback"


class _ConsoleFormatter(logging.Formatter):
    """The terminal's format: a record logged with ``extra={CONSOLE_TRACEBACK: False}`` shows as its one line, its
    traceback left to the job log's handler."""

    def format(self, record: logging.LogRecord) -> str:
        if getattr(record, CONSOLE_TRACEBACK, True):
            return super().format(record)
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        try:
            return super().format(record)
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved


def setup_logging(rank: int, log_file: str | None) -> None:
    """Rank 0 logs INFO to stderr and appends to the job log; other ranks log warnings to stderr and append only
    their errors to the job log (so a failing rank's traceback is in the log ``automodel-hydra logs`` shows). A
    failed rank's traceback goes to the job log only; on the terminal it is one line (:data:`CONSOLE_TRACEBACK`)."""
    fmt = f"[%(asctime)s][rank{rank}][%(name)s][%(levelname)s] - %(message)s"
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(_ConsoleFormatter(fmt))
    handlers: list[logging.Handler] = [console]
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


def requeue_job(environ: tp.Mapping[str, str] = os.environ) -> None:
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


@dataclasses.dataclass(frozen=True)
class Start:
    """Who started this rank and under which scheduler, as the job's plan says (the worker's ``--started-by`` and
    ``--scheduler``: :data:`automodel_hydra.bootstrap.STARTERS`, :data:`~automodel_hydra.bootstrap.SCHEDULERS`). Every
    decision that depends on it (where the rank is, heartbeats, whether Slurm may requeue, the attempt counts) is
    taken from here, never from whatever variables the environment holds: a shell may have left torchrun's,
    Slurm's, SkyPilot's or ft_launcher's there."""

    started_by: str | None = None  # None: a rank started by hand; DistEnv reads whichever launcher's variables
    scheduler: str = "local"

    @classmethod
    def guess(cls, environ: tp.Mapping[str, str]) -> Start:
        """For a rank started by hand (``python -m automodel_hydra.worker launch/job.yaml`` with no plan flags):
        from the environment, the only thing that says anything then."""
        from automodel_hydra.fault_tolerance import RANK_MONITOR_ENV

        started_by = ("ft_launcher" if RANK_MONITOR_ENV in environ else
                      "torchrun" if "TORCHELASTIC_RUN_ID" in environ else None)
        return cls(started_by, "slurm" if "SLURM_JOB_ID" in environ else "local")

    @property
    def agent(self) -> bool:
        """Whether an elastic agent (torchrun, ft_launcher) started the rank: it restarts the worker group."""
        return self.started_by in ("torchrun", "ft_launcher")

    @property
    def slurm(self) -> bool:
        return self.scheduler == "slurm"

    def restart(self, environ: tp.Mapping[str, str]) -> int:
        """The in-job restart count (``TORCHELASTIC_RESTART_COUNT``, which the agent sets); 0 without an agent."""
        return int(environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0) if self.agent else 0

    def requeue(self, environ: tp.Mapping[str, str]) -> int:
        """How often Slurm requeued the job (``SLURM_RESTART_COUNT``, sbatch(1)); 0 off Slurm."""
        return int(environ.get("SLURM_RESTART_COUNT", "0") or 0) if self.slurm else 0


class StepCount:
    """The optimizer steps this rank completed, for its end record: torch's global step post-hook
    (``torch.optim.optimizer.register_optimizer_step_post_hook``), the optimizer's own count where it keeps one
    (restored with a checkpoint), else the calls of this process."""

    def __init__(self) -> None:
        self.calls, self.step = 0, 0
        self.resumed: int | None = None  # the step this process started from (its first step's count - 1)
        self._handle: tp.Any = None

    def install(self) -> StepCount:
        import torch.optim.optimizer as optim

        self._handle = optim.register_optimizer_step_post_hook(self._hook)
        return self

    def _hook(self, optimizer: tp.Any, args: tp.Any, kwargs: tp.Any) -> None:
        self.calls += 1
        self.step = heartbeat.optimizer_step(optimizer) or self.calls
        if self.resumed is None:
            self.resumed = self.step - 1

    def close(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def run(job_file: str | Path, log_file: str | None = None, stop: StopFlag | None = None,
        start: Start | None = None) -> dict[str, tp.Any]:
    """Run one rank of the job described by ``job_file``. Returns the recipe's final metrics.

    ``stop``: the flag the signal handlers set (installed here when not given); ``start``: who started the rank
    (the job's plan; None: a rank started by hand, :meth:`Start.guess`). Raises SystemExit(EXIT_STOPPED)
    when a signal stopped training and the job was not requeued (:func:`after_stop`). Every way out leaves the
    rank's end record (:func:`automodel_hydra.outcome.record_end`), from which the job's state is read."""
    stop = stop or StopFlag().install()
    start = start or Start.guess(os.environ)
    from omegaconf import DictConfig, OmegaConf

    from automodel_hydra import config, failures, health, ledger, outcome, recipes
    from automodel_hydra.bootstrap import DistEnv, init_distributed
    from automodel_hydra.plan import RESULT_FILE, read_run_id
    from automodel_hydra.records import read_cancel

    if start.agent:  # torchrun's or ft_launcher's worker: stop with the agent
        stop_when_parent_dies()
    env = DistEnv.from_environ(started_by=start.started_by)
    setup_logging(env.rank, log_file)
    launch = Path(job_file).parent
    restart, requeue = start.restart(os.environ), start.requeue(os.environ)
    if not start.agent:  # an agent names each rank's error file itself (per attempt, under its --log-dir)
        os.environ["TORCHELASTIC_ERROR_FILE"] = str(error_file(launch, env.rank, requeue))
    if start.started_by == "ft_launcher" and restart > 0:
        refuse_restart(launch, env.rank, restart, requeue)
    steps = StepCount().install()
    if env.rank == 0:
        ledger.record_start(launch, restart, requeue)
    preempting = False

    def end(how: str, step: int | None = None, error: str | None = None,
            failure: failures.Failure | None = None) -> None:
        if step is None:  # the optimizer's count; a function recipe without one: the last step it logged
            step = steps.step if steps.calls else getattr(dist_env, "last_step", None) or steps.step
        outcome.record_end(launch, rank=env.rank, world_size=env.world_size, how=how, restart=restart,
                           requeue=requeue, step=step, error=error, failure=failure, resumed=steps.resumed,
                           signals=[signal.Signals(s).name for s in stop.signals], preempting=preempting)

    action, why = EXIT, ""
    capture, dist_env = None, None
    try:
        raw = OmegaConf.load(job_file)
        if not isinstance(raw, DictConfig):
            raise TypeError(f"{job_file}: expected the job's config (a mapping), found a list")
        cfg = config.load_rank(raw)
        with init_distributed(env, timeout_minutes=cfg.dist_env.timeout_minutes) as dist_env:
            log.info("%r on %s", env, dist_env.device)
            health.before_training(cfg.health_check, start.slurm, dist_env, launch, restart, requeue)
            recipe = recipes.resolve(cfg.recipe)  # the bundled recipe, an AutoModel recipe or a user's function
            start_attempt(launch, env.rank, start, restart, requeue)
            capture = capture_range(cfg, env.rank)
            result = recipes.run_recipe(recipe, cfg.kind.rank_config(cfg), dist_env,
                                        should_stop=stop, output_dir=cfg.output_dir)
            if capture is not None:
                capture.close()
            if result.get("stopped_early"):
                usr2 = signal.SIGUSR2 in stop.signals
                # rank 0 alone asks scontrol (one call per job): a stop during a preemption is no time limit
                # (SIGUSR2) and no cancel (SIGTERM); the ledger records which
                preempted = start.slurm and env.rank == 0 and being_preempted()
                usr2, term, preempted = _agree([usr2, stop.terminated, preempted], dist_env)
                preempting = preempted
                action, why = after_stop(usr2=usr2, term=term, preempted=preempted,
                                         requeues_left=start.slurm and requeues_left())
            else:  # recorded before the process group goes: a peer in a collective sees this rank leave after
                if env.rank == 0:  # its record, so the records' order is the events' (failures.first_end)
                    result = write_result(Path(cfg.output_dir) / RESULT_FILE, result, read_run_id(launch))
                end(outcome.RETURNED)
            heartbeat.uninstall()
    except (SystemExit, KeyboardInterrupt):
        heartbeat.uninstall()
        if capture is not None:
            capture.close()
        end(outcome.STOPPED)
        raise  # a stop's own orderly exit (EXIT_STOPPED), not a failure
    except BaseException as e:
        cause = failure_cause(e)
        # progress: an optimizer step (or a function recipe's logged step) here, or in an earlier attempt of this launch
        progressed = (steps.calls > 0 or getattr(dist_env, "logged", 0) > 0
                      or any((r.get("step") or 0) > 0 for r in outcome.ends(launch)))
        failure = failures.of_exception(cause, progressed=progressed)
        where = f" (traceback: {log_file})" if log_file else ""
        # one line on the terminal, the class first; the traceback goes to the job log (and torch's error file,
        # the launching command's last line quotes the first failed rank's)
        log.error("rank %d failed: %s%s", env.rank, failure.line(), where, exc_info=cause,
                  extra={CONSOLE_TRACEBACK: False})
        end(outcome.RAISED, error=failure.evidence, failure=failure)
        if start.started_by == "ft_launcher":
            restart_or_not(launch, failure, restart, requeue)
        heartbeat.uninstall()
        if capture is not None:
            capture.close()
        steps.close()
        if cause is e:
            raise  # torch's ``record`` (main) writes it to this rank's error file
        raise cause from e
    steps.close()
    if result.get("stopped_early"):
        end(outcome.STOPPED, step=result.get("step") if isinstance(result.get("step"), int) else None)
        if action == REQUEUE:
            if env.rank == 0:  # every rank has finished its checkpoint: the recipe waited for it
                requeue_job()
            return result
        if read_cancel(launch) is not None and not start.slurm:
            # a local run the user cancelled: the stop is the outcome asked for, so the ranks end cleanly and
            # torchrun exits quietly (the cancel's record tells status it was CANCELLED)
            log.warning("stopped at step %s on a signal; cancelled by the user: exiting cleanly", result.get("step"))
            return result
        log.warning("stopped at step %s on a signal; not requeued: %s", result.get("step"), why)
        if action == WAIT:
            wait_for_sigterm(stop)
        raise SystemExit(EXIT_STOPPED)
    return result


def restart_or_not(launch: Path, failure: tp.Any, restart: int, requeue: int) -> None:
    """Under ``ft_launcher``: whether the failed attempt (its class so far, :func:`automodel_hydra.ledger.ending`)
    may restart, by ``failure_budget`` (:func:`automodel_hydra.failures.decide`); when not, ask the launcher not to
    restart (:func:`automodel_hydra.heartbeat.no_restart`) and say why in one line; the first rank records it."""
    from automodel_hydra import failures, ledger

    budget = failures.FailureBudget.of_job(launch)
    # the attempt's class, not this rank's: its "Connection closed by peer" may echo a peer that ended first
    failure = ledger.ending(launch, restart, requeue) or failure
    decision = failures.decide(failure, ledger.failed_before(launch, (requeue, restart)), budget)
    if not ledger.decision_file(launch, restart, requeue).exists():
        ledger.record_decision(launch, restart, requeue, failure, decision, by="ft_launcher")
    if not decision.retry and heartbeat.no_restart(failure.line()):
        log.error("the attempt ended %s: %s", failure.line(), decision.why)


def refuse_restart(launch: Path, rank: int, restart: int, requeue: int) -> None:
    """A rank of an in-job restart, before anything else: when the attempt before ended in a class whose budget is
    spent and no rank could say so (a hung rank is killed by its rank monitor; a rank killed outright), ask
    ``ft_launcher`` not to restart again and exit :data:`EXIT_NOT_RETRIED` without a record (this attempt never
    ran; the job's state is the previous attempt's). Rank 0 records the decision and says it in one line."""
    from automodel_hydra import failures, ledger

    rows = [a for a in ledger.attempts(launch) if (a.requeue, a.restart) < (requeue, restart)]
    if not rows or rows[-1].kind in (ledger.COMPLETED, ledger.RUNNING):
        return
    last = rows[-1]
    failure = failures.Failure(last.kind, last.evidence)
    before = [a.kind for a in rows[:-1] if a.kind not in (ledger.COMPLETED, ledger.RUNNING)]
    decision = failures.decide(failure, before, failures.FailureBudget.of_job(launch))
    if decision.retry:
        return
    if rank == 0:
        if not ledger.decision_file(launch, last.restart, last.requeue).exists():
            ledger.record_decision(launch, last.restart, last.requeue, failure, decision, by="ft_launcher")
        log.error("%s: %s", failure.line(), decision.why)
    heartbeat.no_restart(failure.line())
    raise SystemExit(EXIT_NOT_RETRIED)


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

    if not cfg.profile.nsys.enabled:
        return None
    own = cfg.kind.own_capture_range(cfg)
    if own is not None:
        if own and rank == 0:
            log.info("%s", own)
        return None
    return profile.StepRange(cfg.profile.nsys, rank).install()


def start_attempt(launch_dir: Path, rank: int, start: Start, restart: int, requeue: int = 0) -> None:
    """Rank 0 of a restarted attempt (an agent restarted the worker group) records it and why the attempt before
    ended (``launch/ft/attempts.jsonl``, :func:`automodel_hydra.outcome.explain`), and logs one line; under
    ``ft_launcher`` every rank starts its heartbeats and the hung-rank watchdog
    (:func:`automodel_hydra.heartbeat.install`)."""
    if start.agent and rank == 0 and restart > 0:
        from automodel_hydra import fault_tolerance, outcome
        from automodel_hydra.plan import JobSpec

        reason = (outcome.explain(JobSpec(launch_dir.parent, ""), attempt=(requeue, restart - 1))
                  or "a rank ended without a record (killed by a signal?)")
        fault_tolerance.record_attempt(launch_dir, restart, time.time(), reason, requeue=requeue)
        log.warning("in-job restart %d: %s", restart, reason)
    if start.started_by == "ft_launcher":
        heartbeat.install(launch_dir, rank, restart, requeue)


def error_file(launch_dir: Path, rank: int, requeue: int = 0) -> Path:
    """Where a rank that no torchrun agent started records its exception: ``launch/error.rank<N>.json``, after a
    Slurm requeue ``launch/error.rank<N>.requeue<K>.json`` (each attempt keeps its own).

    torch's ``record`` (torch.distributed.elastic.multiprocessing.errors, wrapped around :func:`run` by
    :func:`main`) writes a failed rank's exception, traceback and time to ``$TORCHELASTIC_ERROR_FILE``. torchrun
    names that file for each of its ranks (under its ``--log-dir``; it fills its "Root Cause" summary from it);
    srun's ranks get this one. Either way the launching command quotes the lowest failed rank's exception as its
    last line (:func:`automodel_hydra.plan.rank_error`)."""
    return launch_dir / (f"{RANK_ERROR_PREFIX}{rank}.json" if not requeue else
                         f"{RANK_ERROR_PREFIX}{rank}.requeue{requeue}.json")


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
    streams.best_effort()  # a terminal or pipe that goes away never fails the rank (automodel_hydra.streams)
    from automodel_hydra.bootstrap import SCHEDULERS, STARTERS

    parser = argparse.ArgumentParser(prog="python -m automodel_hydra.worker", description=__doc__.splitlines()[0])
    parser.add_argument("job_file", help="the job's launch/job.yaml")
    parser.add_argument("--log-file", default=None, help="job log rank 0 appends to")
    parser.add_argument("--started-by", choices=STARTERS, default=None,
                        help="who started this rank, as the job's plan says (default: read the environment)")
    parser.add_argument("--scheduler", choices=SCHEDULERS, default=None,
                        help="the scheduler the job runs under, as the job's plan says")
    args = parser.parse_args(argv)
    start = Start(args.started_by, args.scheduler or "local") if args.started_by else None
    quiet.install()  # before torch: its import prints dependencies' lines that tell the user nothing
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        # an exception is written to this rank's error file (see error_file): torchrun's "Root Cause" and our
        # last line both come from it
        record(run)(args.job_file, args.log_file, stop, start)
    except Exception:
        # logged (one line here, the traceback in the job log) and in the error file: not printed again by the
        # interpreter (torch.distributed's excepthook would print it once more, "[rank1]: Traceback ...")
        raise SystemExit(1) from None
    finally:
        # skip the interpreter's final collection of torch/transformers objects (~1 s per rank at exit, more
        # under load): a rank stopped by Slurm has KillWait seconds (default 30) from SIGTERM to SIGKILL
        gc.freeze()


if __name__ == "__main__":
    main()
