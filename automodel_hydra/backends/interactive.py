"""Interactive backend: torchrun on this node (``python train.py``).

``plan`` writes ``launch/torchrun.sh``: the exact command, runnable by hand (a call job, one process running a
Hydra task function that is not ours: ``launch/call.sh``, see :mod:`automodel_hydra.call`). ``submit`` starts one
torchrun group per job; a sweep's jobs run side by side on disjoint devices (``CUDA_VISIBLE_DEVICES`` on GPUs, CPU
affinity and ``OMP_NUM_THREADS`` on CPU cores), each with its own rendezvous port, at most
``interactive.max_parallel`` at once.

Files a job leaves in ``launch/``: ``torchrun.sh`` (the plan), ``torchrun/`` (torchrun's ``--log-dir``: a failed
rank's error file), ``lock`` (the run lock, :mod:`automodel_hydra.records`: held by the job's processes while they
run, a second run in the dir is refused), ``pid`` (the torchrun group's pid), ``torchrun.out`` (torchrun's own output
in a sweep, where jobs run side by side; ``call.out`` for call jobs) and ``cancel.json`` (the cancel's record,
:func:`automodel_hydra.records.write_cancel`: torchrun itself exits 1 on SIGTERM, so the record is what tells a
cancelled job from a failed one; once the stop is over it holds what became of the job's processes: ended within
the grace time, or which ones were killed).

Stopping (Ctrl-C or SIGTERM to the launching command, ``automodel-hydra cancel``): :func:`automodel_hydra.stops.
stop_group` asks the ranks to checkpoint (SIGTERM), gives them ``interactive.kill_wait_s`` seconds, then kills
every process of the job that is left (a rank hung in its step or blocked in a collective never reads its stop
flag).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import typing as tp
from concurrent.futures import Future
from pathlib import Path

from automodel_hydra import agent, fault_tolerance, outcome, records, stops, sweep_policy
from automodel_hydra.backends.interactive_config import InteractiveConfig as InteractiveConfig
from automodel_hydra.bootstrap import is_launcher_var
from automodel_hydra.plan import (
    CALL_RESULT_FILE,
    PID_FILE,
    RESULT_FILE,
    TORCHRUN_LOG_DIR,
    Backend,
    Batch,
    JobResult,
    JobSpec,
    Plan,
    PreflightError,
    Submission,
    SubmitError,
    call_argv,
    error_stamps,
    launch_dir,
    read_result,
    tracker_env,
    worker_argv,
    written_by_this_launch,
)
from automodel_hydra.profile import missing_nsys_line, nsys_check_lines, nsys_prefix
from automodel_hydra.states import JobState, StateInfo

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

log = logging.getLogger(__name__)

SCRIPT = "torchrun.sh"
CALL_SCRIPT = "call.sh"


def cuda_device_count() -> int:
    """Visible CUDA devices, without importing torch when there is no NVIDIA driver (keeps start-up fast)."""
    if not Path("/proc/driver/nvidia").exists() and "CUDA_VISIBLE_DEVICES" not in os.environ:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def find_ft_launcher() -> str | None:
    """Where this Python finds ``ft_launcher``'s package (nvidia-resiliency-ext's ``fault_tolerance``, whose
    launcher :mod:`automodel_hydra.agent` runs in this interpreter), or None when it cannot import it. Looked up
    without importing it (that would import torch)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("nvidia_resiliency_ext.fault_tolerance")
    except (ImportError, ValueError):
        return None
    return None if spec is None else str(spec.origin or spec.name)


def cpu_cores() -> list[int]:
    """CPU cores this process may run on (its affinity mask, which containers, ``taskset`` and Slurm narrow)."""
    return sorted(os.sched_getaffinity(0))


def visible_gpus(count: int, environ: tp.Mapping[str, str] | None = None) -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` entries: ``count`` (what CUDA sees,
    :func:`cuda_device_count`) entries of the ``CUDA_VISIBLE_DEVICES`` the user or Slurm already set (indices or
    ``GPU-``/``MIG-`` UUIDs, in their order), else ``0 .. count-1``.

    A packed job gets a subset of these names, so a sweep started under ``CUDA_VISIBLE_DEVICES=2,3`` runs on 2 and
    3, never on 0 and 1 (CUDA numbers the visible devices from 0, so an index of ours would name another GPU).
    CUDA reads the list up to its first invalid entry (CUDA C Programming Guide, "CUDA Environment Variables"),
    which is why only the first ``count`` entries are kept."""
    env = os.environ if environ is None else environ
    given = env.get("CUDA_VISIBLE_DEVICES")
    if given is None:
        return [str(i) for i in range(count)]
    return [d.strip() for d in given.split(",") if d.strip()][:count]


def tracker_lines(job: JobSpec) -> list[str]:
    """The script's exports of the job's tracker run (:func:`automodel_hydra.plan.tracker_env`), before
    ``hydra.job.env_set``'s, which win."""
    env = tracker_env(job)
    if not env:
        return []
    return ["# one W&B run per job for its whole life: launch/tracker_id (hydra.job.env_set wins)",
            *(f"export {k}={shlex.quote(v)}" for k, v in env)]


def pack_env(devices: tp.Sequence[tp.Any], uses_gpus: bool, nproc: int,
             environ: tp.Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables a packed sweep job gets on top of ``environ`` (default ``os.environ``) for its device slots
    ``devices`` (entries of :func:`visible_gpus`, or CPU cores of :func:`cpu_cores`): its GPUs as
    ``CUDA_VISIBLE_DEVICES``; on CPU cores ``OMP_NUM_THREADS`` (cores per worker) unless the environment already
    sets it (then the user's thread count stands, as in ``torchrun.sh``). The cores themselves are applied as the
    job's affinity (``os.sched_setaffinity``), a subset of this process's own mask."""
    env = os.environ if environ is None else environ
    if uses_gpus:
        return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}
    if "OMP_NUM_THREADS" in env:
        return {}
    return {"OMP_NUM_THREADS": str(max(1, len(devices) // nproc))}


def resolve_nproc(value: str, gpus: int, cpus: int) -> int:
    """``interactive.nproc_per_node``: ``auto`` = one worker per GPU, else one per CPU core; else the integer."""
    if value == "auto":
        return gpus or cpus
    return int(value)


@dataclasses.dataclass(frozen=True)
class Devices:
    """What :meth:`Interactive.preflight` counts here: visible CUDA devices and the CPU cores this process may
    run on."""

    gpus: int
    cpus: tuple[int, ...]
    ft_launcher: str | None = None  # find_ft_launcher(), when a job has fault tolerance

    @classmethod
    def here(cls, ft_launcher: str | None = None) -> Devices:
        return cls(cuda_device_count(), tuple(cpu_cores()), ft_launcher)


@dataclasses.dataclass(frozen=True)
class Request:
    """What starting one torchrun group needs besides its script."""

    nproc: int
    master_port: int | None
    max_parallel: int | None
    uses_gpus: bool
    env: tuple[tuple[str, str], ...]  # hydra.job.env_set
    workdir: str | None
    kill_wait_s: float = stops.DEFAULT_KILL_WAIT_S  # interactive.kill_wait_s
    launcher: str = "torchrun"  # or "ft_launcher" (fault_tolerance.enabled)


@dataclasses.dataclass(frozen=True)
class LocalRef:
    """A local job: its dir (the run lock and pid live in ``launch/``), when it was started (epoch s, this host's
    clock: shown to people, never compared with a file's mtime), the grace
    time a stop gives it (``interactive.kill_wait_s``) and whether its head process is its only rank (a call
    job)."""

    job_dir: str
    started_at: float = 0.0
    kill_wait_s: float = stops.DEFAULT_KILL_WAIT_S
    single_process: bool = False

    @property
    def ids(self) -> list[str]:
        pid = _pid(Path(self.job_dir))
        return [str(pid)] if pid is not None else []




def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def free_port(start: int, exclude: tp.Container[int] = ()) -> int:
    """The first port >= ``start`` that is bindable on this host and not in ``exclude``."""
    for port in range(start, min(start + 2000, 65536)):
        if port not in exclude and port_is_free(port):
            return port
    raise SubmitError(f"no free TCP port in {start}..{start + 1999}")


class _Scheduler:
    """Packs jobs onto disjoint device slots; one thread, jobs start as slots free up (in input order)."""

    def __init__(self, plans: tp.Sequence[Plan[Request]], quiet: bool, locks: tp.Sequence[int],
                 max_failures: int | None = None) -> None:
        self.plans, self.quiet, self.locks, self.max_failures = plans, quiet, locks, max_failures
        self.failures = 0  # members that ended failed (sweep_policy.is_failure), against max_failures
        self.stamps = [error_stamps(p.job) for p in plans]  # what an earlier launch left (rank_error)
        first = plans[0].request
        # what the environment already allows (CUDA_VISIBLE_DEVICES, the affinity mask) is what jobs share
        self.slots: list[tp.Any] = visible_gpus(cuda_device_count()) if first.uses_gpus else cpu_cores()
        self.max_parallel = first.max_parallel or len(plans)
        self.futures: list[Future[JobResult]] = [Future() for _ in plans]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.cond = threading.Condition()
        self.cancelled = False
        self.stoppers: list[threading.Thread] = []
        self.ended = 0  # jobs whose process has exited: each exit wakes the loop at once (no polling delay)

    def start(self) -> None:
        threading.Thread(target=self._loop, name="automodel-interactive", daemon=True).start()

    def _loop(self) -> None:
        free = list(self.slots)
        running: dict[int, tuple[list[tp.Any], int | None, subprocess.Popen[bytes]]] = {}
        ports: set[int] = set()
        pending = list(range(len(self.plans)))
        seen = 0  # self.ended when the loop last looked at its running jobs
        while pending or running:
            with self.cond:
                stopped = self.max_failures is not None and self.failures >= self.max_failures and bool(pending)
                while pending and not self.cancelled and not stopped:
                    i = pending[0]
                    need = min(self.plans[i].request.nproc, len(self.slots))
                    if len(running) >= self.max_parallel or (running and need > len(free)):
                        break
                    pending.pop(0)
                    if records.read_cancel(self.plans[i].job.launch_dir):  # cancelled while queued
                        self.futures[i].set_result(JobResult(JobState.CANCELLED, error="cancelled before start",
                                                             stop="never started"))
                        continue
                    devices, free = free[:need], free[need:]
                    base = self.plans[i].request.master_port
                    port = None if base is None else free_port(base, ports)
                    if port is not None:
                        ports.add(port)
                    running[i] = (devices, port, self._start(i, devices, port, packed=len(self.plans) > 1))
                if self.cancelled or stopped:
                    for i in pending:
                        records.write_cancel(self.plans[i].job.launch_dir)  # status says so later
                        os.close(self.locks[i])  # its dir is free: CANCELLED, not queued
                        self.futures[i].set_result(JobResult(JobState.CANCELLED, error="cancelled before start",
                                                             stop="never started"))
                    if stopped and not self.cancelled:
                        sweep_policy.say(sweep_policy.stop_line(self.failures, tp.cast(int, self.max_failures), [
                            self.plans[i].job.job_num for i in pending], self.plans[0].job.job_dir.parent))
                    pending = []
                if self.ended == seen:
                    self.cond.wait(timeout=0.2)  # the timeout only bounds a missed wake-up
                seen = self.ended
            for i, (devices, port, proc) in list(running.items()):
                if proc.poll() is not None:
                    del running[i]
                    free += devices
                    if port is not None:
                        ports.discard(port)
                    result = _result(self.plans[i], proc.returncode, self.stamps[i])
                    self.failures += sweep_policy.is_failure(result.state)
                    self.futures[i].set_result(result)

    def _start(self, i: int, devices: list[tp.Any], port: int | None, packed: bool) -> subprocess.Popen[bytes]:
        plan = self.plans[i]
        # an agent's variables left in this shell (a notebook run under torchrun) are not the job's: its agent sets
        # its own; the shell's Slurm allocation (salloc) is kept, and decides nothing for the ranks either
        env = {**{k: v for k, v in os.environ.items() if not is_launcher_var(k, schedulers=False)},
               **dict(plan.request.env)}
        env.pop("AUTOMODEL_RDZV_PORT", None)
        if port is not None:
            env["AUTOMODEL_RDZV_PORT"] = str(port)
        preexec = None
        if packed:
            env.update(pack_env(devices, plan.request.uses_gpus, plan.request.nproc, env))
            if not plan.request.uses_gpus:
                preexec = lambda: os.sched_setaffinity(0, devices)  # noqa: E731
        if plan.job.call is not None:
            log.info("job %s: one process%s", plan.job.job_num or 0, f", devices {devices}" if packed else "")
        else:
            log.info("job %s: %s with %d worker(s), rendezvous port %s%s", plan.job.job_num or 0,
                     plan.request.launcher, plan.request.nproc, port or "picked by the OS (rank 0 logs it)",
                     f", devices {devices}" if packed else "")
        script = _script(plan)
        out = open(plan.job.launch_dir / _out_name(plan), "ab") if self.quiet else None  # noqa: SIM115
        proc = subprocess.Popen(["bash", str(plan.job.launch_dir / script)], env=env, stdout=out, stderr=out,
                                start_new_session=True, preexec_fn=preexec, pass_fds=(self.locks[i],),
                                cwd=plan.request.workdir)
        os.close(self.locks[i])  # the group holds the run lock now, for as long as any of its processes lives
        plan.job.pid_file.write_text(f"{proc.pid}\n")
        self.procs[i] = proc
        threading.Thread(target=self._waiter, args=(proc,), name="automodel-wait", daemon=True).start()
        return proc

    def _waiter(self, proc: subprocess.Popen[bytes]) -> None:
        """Wake the loop the moment ``proc`` exits, so that a job's end is seen without waiting for the loop's
        next 0.2 s timeout (that poll interval was 0.1 s of every local launch, on average)."""
        proc.wait()
        with self.cond:
            self.ended += 1
            self.cond.notify_all()

    def cancel(self) -> None:
        """Stop every running job (:func:`stop_job`, each in a thread of its own: their grace times run side by
        side); queued jobs never start. Returns at once; :meth:`join` waits for the stops."""
        with self.cond:
            self.cancelled = True
            for i, proc in self.procs.items():
                if proc.poll() is None:
                    plan = self.plans[i]
                    t = threading.Thread(target=stop_job, name="automodel-stop", daemon=True,
                                         args=(plan.job.launch_dir, proc.pid, plan.request.kill_wait_s,
                                               plan.job.call is not None, lambda p=proc: p.poll() is not None))
                    t.start()
                    self.stoppers.append(t)
            self.cond.notify_all()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the stops :meth:`cancel` started."""
        until = time.monotonic() + timeout
        for t in self.stoppers:
            t.join(max(0.0, until - time.monotonic()))



def _script(plan: Plan[Request]) -> str:
    """The plan's script: ``torchrun.sh``, or ``call.sh`` for a call job."""
    return CALL_SCRIPT if plan.job.call is not None else SCRIPT


def _out_name(plan: Plan[Request]) -> str:
    """Where a packed job's own output goes (``torchrun.out``, ``call.out``)."""
    return _script(plan).replace(".sh", ".out")


def _result(plan: Plan[Request], returncode: int, stamps: tp.Mapping[str, tuple[int, int]]) -> JobResult:
    """How a local job ended: what its ranks did (:func:`automodel_hydra.outcome.derive`), with the launcher's exit
    status as the scheduler's word (0: COMPLETED, else FAILED; CANCELLED after a cancel or on SIGTERM); the line
    names the rank that ended first and how, the launcher's exit status and its log (``launch/agent.<host>.log``)."""
    restarts = fault_tolerance.restart_summary(plan.job.launch_dir)  # "" without in-job restarts
    cancel = records.read_cancel(plan.job.launch_dir)
    cancelled = returncode in (-signal.SIGTERM, 143) or cancel is not None
    verdict = outcome.derive(plan.job, JobState.COMPLETED if returncode == 0 else JobState.FAILED, stamps)
    if verdict.state is JobState.COMPLETED:
        if restarts:
            log.warning("job %s completed, %s", plan.job.job_num or 0, restarts)
        return JobResult(JobState.COMPLETED, read_result(plan.job))
    if cancelled:
        how = cancel.how if cancel is not None else None  # what the stop did (stop_job), when it is over
        if how:
            return JobResult(JobState.CANCELLED, error=f"cancelled: {how}", stop=how)
        verdict = dataclasses.replace(verdict, state=JobState.CANCELLED)
    tail = ""
    out = plan.job.launch_dir / _out_name(plan)
    if out.exists():  # a packed job's own output (the ranks' lines of a sweep job)
        tail = "\n" + "\n".join(out.read_text(errors="replace").splitlines()[-30:])
    why = verdict.why
    if restarts:
        why = f"{why + '; ' if why else ''}{restarts}"
    if plan.job.call is not None:
        what = f"the call's process exited with {returncode} (job dir {plan.job.job_dir})"
    else:
        what = (f"{plan.request.launcher} exited with {returncode} (its log: {agent.log_file(plan.job.launch_dir)}; "
                f"job dir {plan.job.job_dir})")
    return JobResult(verdict.state, error=f"{why + '; ' if why else ''}{what}{tail}", traceback=verdict.traceback)


class Interactive(Backend[Request, LocalRef, Devices]):
    """torchrun on this node. Preflight counts the devices here; a sweep's jobs are one batch, packed."""

    name = "interactive"
    stops_after_failures = True  # its queue starts no member once max_failures have failed
    holds_run_lock = True  # a queued or running job's processes hold launch/lock (records.take_lock)
    ranks_import_here = True  # torchrun here, on this Python
    poll_s = 1.0

    def __init__(self) -> None:
        self._futures: dict[str, Future[JobResult]] = {}
        self._schedulers: list[_Scheduler] = []

    def preflight(self, cfgs: tp.Sequence[TrainConfig]) -> Devices:
        from automodel_hydra.config import host_problems
        from automodel_hydra.paths import write_problems

        for cfg in cfgs:  # the ranks run here: every path they read or write can be checked now
            for problem in [*host_problems(cfg), *write_problems(cfg)]:
                raise problem
        warned: set[str] = set()
        asked: dict[str | None, str | None] = {}  # one question per recipe, not per sweep point
        from automodel_hydra import recipes

        for cfg in cfgs:  # e.g. an AutoModel recipe's CUDA calls, asked here where its ranks will run
            target = recipes.recipe_target(cfg.recipe)
            if target not in asked:  # the recipe resolved already (the driver's check_recipe)
                asked[target] = cfg.kind.local_problem(cfg, recipes.resolve)
            line = asked[target]
            if line is not None and not cfg.dry_run:
                raise PreflightError(line)
            if line is not None and line not in warned:
                warned.add(line)
                log.warning("%s (dry run: planned anyway)", line)
        if any(cfg.profile.nsys.enabled for cfg in cfgs) and shutil.which("nsys") is None:
            # found here, before torchrun starts (the script checks again, for a run of it by hand)
            line = missing_nsys_line("on this machine")
            if not all(cfg.dry_run for cfg in cfgs):
                raise PreflightError(line)
            log.warning("%s (dry run: planned anyway)", line)
        ft_launcher = None
        if any(cfg.fault_tolerance.enabled for cfg in cfgs):
            ft_launcher = find_ft_launcher()
            if ft_launcher is None:
                raise PreflightError(fault_tolerance.missing_launcher_line(f"in this Python ({sys.executable})"))
        return Devices.here(ft_launcher)

    def world_size(self, cfg: TrainConfig, facts: Devices | None = None) -> int:
        devices = facts or Devices.here()  # none: planned without a preflight (tests of planning alone)
        return resolve_nproc(cfg.interactive.nproc_per_node, devices.gpus, len(devices.cpus))

    def ranks_see_local_files(self, cfg: TrainConfig) -> bool:
        return True

    def plan(self, cfg: TrainConfig, job: JobSpec, facts: Devices | None = None) -> Plan[Request]:
        """torchrun argv for ``cfg.interactive`` as a bash script (pure, given the devices preflight counted); for
        a call job, one process (:meth:`plan_call`)."""
        devices = facts or Devices.here()  # none: planned without a preflight (tests of planning alone)
        if job.call is not None:
            return self.plan_call(cfg, job, devices)
        ic = cfg.interactive
        gpus, cpus = devices.gpus, devices.cpus
        nproc = resolve_nproc(ic.nproc_per_node, gpus, len(cpus))
        ft = cfg.fault_tolerance
        worker = worker_argv(job, python=sys.executable, started_by="ft_launcher" if ft.enabled else "torchrun",
                             scheduler="local")
        prefix = nsys_prefix(cfg.profile.nsys, cfg.output_dir, job.job_name, rank_var="RANK",
                             attempt_vars=(("attempt", "TORCHELASTIC_RESTART_COUNT"),))
        # the agent runs in automodel_hydra.agent, its own output in launch/agent.<host>.log; ft_launcher takes
        # torchrun's options (and the same rendezvous) plus its own, --max-restarts included
        launcher = ([*agent.argv(job.launch_dir, fault_tolerance.LAUNCHER, sys.executable),
                     *fault_tolerance.ft_args(ft)] if ft.enabled else
                    [*agent.argv(job.launch_dir, "torchrun", sys.executable), f"--max_restarts={ic.max_restarts}"])
        torchrun = [*launcher, "--nnodes=1", f"--nproc_per_node={nproc}", "--rdzv-backend=c10d",
                    # each rank's error file (torch's `record`) lands here: torchrun's Root Cause and our last line
                    f"--log-dir={job.launch_dir / TORCHRUN_LOG_DIR}"]
        # torchrun -m runs `python -m`; with a profiler prefix it must run an executable instead (--no-python)
        tail = ["--no-python", *prefix, *worker] if prefix else worker[2:]
        lines = [
            "#!/usr/bin/env bash",
            # !r: a newline in the job name (hydra.job.name) would end the comment and run the rest as code
            f"# {job.job_name!r}: {'ft_launcher' if ft.enabled else 'torchrun'} on this node, {nproc} worker(s). "
            "Planned by automodel-hydra.",
            "# Rendezvous port: AUTOMODEL_RDZV_PORT (interactive.master_port, moved to a free one at start), or 0: "
            "the",
            "# rendezvous store binds a port the OS picks, so jobs on one host never collide. Rank 0 logs the port.",
            "set -euo pipefail",
            *nsys_check_lines(cfg.profile.nsys, shlex.quote(str(job.log_file))),
            f"export PYTHONPATH={shlex.quote(str(job.project_root))}${{PYTHONPATH:+:$PYTHONPATH}}",
            "export PYTHONUNBUFFERED=1",
            f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{max(1, len(cpus) // nproc)}}}  # CPU threads per worker",
            *tracker_lines(job),
            *(["# hydra.job.env_set", *(f"export {k}={shlex.quote(v)}" for k, v in job.env)] if job.env else []),
            *([f"cd {shlex.quote(str(job.workdir))}  # hydra.job.chdir"] if job.workdir else []),
            "exec " + shlex.join(torchrun) + ' --rdzv-endpoint="127.0.0.1:${AUTOMODEL_RDZV_PORT:-0}" '
            + shlex.join(tail),
            "",
        ]
        request = Request(nproc, ic.master_port, ic.max_parallel, gpus > 0, job.env,
                          str(job.workdir) if job.workdir else None, ic.kill_wait_s,
                          "ft_launcher" if ft.enabled else "torchrun")
        return Plan(self.name, job, {SCRIPT: "\n".join(lines)}, request, wait=True, group_key=(ic.max_parallel,))

    def plan_call(self, cfg: TrainConfig, job: JobSpec, devices: Devices) -> Plan[Request]:
        """A call job: ``launch/call.sh`` runs one process (no torchrun, no rendezvous) with this project on
        PYTHONPATH. In a sweep it gets one device slot like a 1-worker job (a GPU, else a CPU core), so calls run
        side by side, at most ``interactive.max_parallel`` at once. ``env_set`` and ``chdir`` are applied by
        Hydra's ``run_job`` in that process, so the script sets neither."""
        ic = cfg.interactive
        gpus = devices.gpus
        lines = [
            "#!/usr/bin/env bash",
            f"# {job.job_name!r}: one process running the Hydra job's task function (launch/{job.call_file.name}). "
            "Planned by automodel-hydra.",
            "set -euo pipefail",
            f"export PYTHONPATH={shlex.quote(str(job.project_root))}${{PYTHONPATH:+:$PYTHONPATH}}",
            "export PYTHONUNBUFFERED=1",
            *tracker_lines(job),
            "exec " + shlex.join(call_argv(job, python=sys.executable)),
            "",
        ]
        request = Request(1, None, ic.max_parallel, gpus > 0, (), None, ic.kill_wait_s)
        return Plan(self.name, job, {CALL_SCRIPT: "\n".join(lines)}, request, wait=True,
                    group_key=(ic.max_parallel,))

    def batches(self, plans: tp.Sequence[Plan[Request]], sweep_dir: Path | None,
                facts: Devices | None = None) -> list[Batch[Request]]:
        """All jobs in one batch: they are packed onto this node's devices together."""
        files = {p.job.launch_dir / name: text for p in plans for name, text in p.files.items()}
        return [Batch(tuple(plans), files)]

    def submit(self, batch: Batch[Request]) -> list[Submission[LocalRef]]:
        """Start the planned torchrun groups (packed onto free devices). Returns at once; see :meth:`wait`."""
        plans = batch.plans
        for p in plans:  # a rerun in the same dir starts uncancelled
            records.clear_cancel(p.job.launch_dir)
        locks: list[int] = []
        try:
            for p in plans:  # every dir is ours before anything starts
                locks.append(records.take_lock(p.job.job_dir))
        except RuntimeError:
            for fd in locks:
                os.close(fd)
            raise
        for p in plans:  # the dirs are ours: an earlier run's pid is not this one's (PENDING until it starts)
            p.job.pid_file.unlink(missing_ok=True)
        started = time.time()
        sched = _Scheduler(plans, quiet=len(plans) > 1, locks=locks, max_failures=batch.max_failures)
        self._schedulers.append(sched)
        sched.start()
        subs = []
        for p, future in zip(plans, sched.futures):
            self._futures[str(p.job.job_dir)] = future
            ref = LocalRef(str(p.job.job_dir), started, p.request.kill_wait_s, p.job.call is not None)
            subs.append(Submission(p, ref, log_path=str(p.job.log_file)))
        return subs

    def wait(self, subs: tp.Sequence[Submission[LocalRef]]) -> list[JobResult]:
        """Block until every job ends. A stop signal while waiting (KeyboardInterrupt, or
        :class:`~automodel_hydra.stops.StopRequested` from the driver's handlers) stops every job (queued ones
        never start; running ones get ``interactive.kill_wait_s`` to checkpoint, then what is left is killed) and
        is re-raised as a StopRequested whose ``results`` say what became of each job."""
        futures = [self._futures[s.ref.job_dir] for s in subs]
        try:
            return [f.result() for f in futures]
        except BaseException as e:
            if not isinstance(e, (KeyboardInterrupt, stops.StopRequested)):
                raise
            stop = stops.as_stop(e)
            for sched in self._schedulers:
                sched.cancel()
            grace = max((s.plan.request.kill_wait_s for s in subs), default=stops.DEFAULT_KILL_WAIT_S)
            for sched in self._schedulers:
                sched.join(grace + 30)
            for s, f in zip(subs, futures):
                with contextlib.suppress(Exception):
                    result = f.result(timeout=5)
                    cancel = records.read_cancel(s.plan.job.launch_dir)
                    if result.state is JobState.CANCELLED and result.stop is None and cancel is not None:
                        # the stop's end (stop_job wrote it after the future)
                        result = dataclasses.replace(result, stop=cancel.how)
                    stop.results[s.ref.job_dir] = result
            raise stop from None

    def states(self, refs: tp.Sequence[LocalRef]) -> list[StateInfo]:
        out = []
        for r in refs:
            state = local_state(Path(r.job_dir))
            orphan = state is JobState.CANCELLED and records.read_cancel(launch_dir(r.job_dir)) is None
            out.append(StateInfo(state, ORPHANED if orphan else ""))
        return out

    def cancel(self, refs: tp.Sequence[LocalRef], pending_only: bool = False) -> None:
        """Stop each job (:func:`stop_job`: its ranks checkpoint, and what is left after ``kill_wait_s`` is
        killed); returns when every job has ended. A queued job is marked and never starts."""
        threads = []
        for ref in refs:
            job_dir = Path(ref.job_dir)
            if pending_only and _pid(job_dir) is not None:
                continue
            records.write_cancel(launch_dir(job_dir))  # read by states() and by a sweep's queue
            pid = _pid(job_dir)
            if pid is not None and records.locked(job_dir):  # never signal a pid that no longer belongs to this job
                t = threading.Thread(target=stop_job, args=(launch_dir(job_dir), pid, ref.kill_wait_s,
                                                            ref.single_process), daemon=True)
                t.start()
                threads.append(t)
        for t in threads:
            t.join()

    def ref_from_record(self, record: tp.Mapping[str, tp.Any]) -> LocalRef:
        ref = record.get("ref") or {}
        return LocalRef(str(ref.get("job_dir", record["job_dir"])), float(ref.get("started_at", 0.0)),
                        float(ref.get("kill_wait_s", stops.DEFAULT_KILL_WAIT_S)), bool(ref.get("single_process")))


def stop_job(launch_dir: Path, head: int, grace_s: float, single_process: bool = False,
             ended: tp.Callable[[], bool] | None = None) -> stops.Ended:
    """Stop one local job headed by pid ``head`` (:func:`automodel_hydra.stops.stop_group`) and write what became
    of its processes into its cancel record (:func:`automodel_hydra.records.write_cancel`, written first: the ranks
    read it to end cleanly, and :func:`local_state` to say CANCELLED). Its ``how`` then reads ``ended within the 30 s
    grace time`` or ``killed after 30 s: rank 1 (pid 12), torchrun (pid 10)`` (:meth:`automodel_hydra.stops.Ended.
    text`): what the launching command's stop line repeats."""
    records.write_cancel(launch_dir)
    # a rank known to be hung (fault tolerance's watchdog recorded it) cannot checkpoint, and the ranks blocked in
    # a collective waiting for it cannot either: no grace time, the job is ended at once
    hung = fault_tolerance.final_hang(launch_dir)
    if hung is not None:
        grace_s = 0.0
        log.warning("stopping at once, no grace time: %s (a hung rank cannot checkpoint)", hung)

    def record(what: stops.Ended) -> None:
        text = what.text()
        if hung is not None and what.killed:
            text = f"killed at once, {hung.split(' (')[0]} and could not checkpoint: {', '.join(what.killed)}"
        records.write_cancel(launch_dir, how=text)

    result = stops.stop_group(head, grace_s, head_is_rank=single_process, ended=ended, on_kill=record)
    record(result)
    return result


#: The reason beside a queued member whose launching command ended before starting it (killed, ``kill -9``):
#: CANCELLED, since nothing will start it.
ORPHANED = "never started: the command that queued it ended first"


def local_state(job_dir: Path) -> JobState:
    """State of a local job from what it left behind (there is no scheduler to ask): RUNNING while its processes
    hold the dir's run lock, COMPLETED when rank 0's ``result.json`` (a call's ``call_result.pkl``) carries the
    id of the job's launch (``launch/run_id``; never a comparison of clocks), else CANCELLED/FAILED; PENDING
    while a sweep's queue holds it (the lock), CANCELLED once no queue does and it never started (no pid: the
    command that queued it ended first, say by ``kill -9``; nothing will start it, so it is not pending)."""
    if records.locked(job_dir):  # locked: started (pid written at start) or queued in a sweep
        return JobState.RUNNING if _pid(job_dir) is not None else JobState.PENDING
    job = JobSpec(job_dir=job_dir, job_name="")
    for result in (job_dir / RESULT_FILE, launch_dir(job_dir) / CALL_RESULT_FILE):  # a recipe's, a call's
        if written_by_this_launch(job, result):
            call = JobSpec(job_dir=job_dir, job_name="", call=b"") if result.suffix == ".pkl" else job
            # what the ranks did: a result, and no rank of the last attempt ended otherwise than by returning
            return outcome.derive(call, JobState.COMPLETED).state
    if records.read_cancel(launch_dir(job_dir)) is not None:
        return JobState.CANCELLED
    return JobState.FAILED if _pid(job_dir) is not None else JobState.CANCELLED


def _pid(job_dir: Path) -> int | None:
    path = launch_dir(job_dir) / PID_FILE
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None
