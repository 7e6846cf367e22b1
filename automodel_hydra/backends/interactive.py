"""Interactive backend: torchrun on this node (``python train.py``).

``plan`` writes ``launch/torchrun.sh``: the exact command, runnable by hand (a call job, one process running a
Hydra task function that is not ours: ``launch/call.sh``, see :mod:`automodel_hydra.call`). ``submit`` starts one
torchrun group per job; a sweep's jobs run side by side on disjoint devices (``CUDA_VISIBLE_DEVICES`` on GPUs, CPU
affinity and ``OMP_NUM_THREADS`` on CPU cores), each with its own rendezvous port, at most
``interactive.max_parallel`` at once.

Files a job leaves in ``launch/``: ``torchrun.sh`` (the plan), ``torchrun/`` (torchrun's ``--log-dir``: a failed
rank's error file), ``lock`` (held by the job's processes while they run:
a second run in the dir is refused), ``pid`` (the torchrun group's pid), ``torchrun.out`` (torchrun's own output in
a sweep, where jobs run side by side; ``call.out`` for call jobs) and ``cancelled`` (written by a cancel: torchrun
itself exits 1 on SIGTERM, so the mark is what tells a cancelled job from a failed one).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
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
from dataclasses import dataclass
from pathlib import Path

from automodel_hydra import fault_tolerance
from automodel_hydra.plan import (
    CALL_RESULT_FILE,
    RESULT_FILE,
    TORCHRUN_LOG_DIR,
    Backend,
    Batch,
    JobResult,
    JobSpec,
    Plan,
    PreflightError,
    Submission,
    call_argv,
    rank_error,
    read_result,
    worker_argv,
)
from automodel_hydra.profile import nsys_check_lines, nsys_prefix
from automodel_hydra.schema import at_least, check_port, require
from automodel_hydra.states import JobState, StateInfo

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

log = logging.getLogger(__name__)

SCRIPT = "torchrun.sh"
CALL_SCRIPT = "call.sh"
CANCELLED_MARK = "cancelled"
LOCK = "lock"


@dataclass
class InteractiveConfig:
    """torchrun on this node (``launcher=interactive``, the default)."""

    # workers on this node: "auto" = one per visible GPU, else one per CPU core; or an integer >= 1
    nproc_per_node: str = "auto"
    # rendezvous port; null = one the OS picks, so jobs sharing the host never collide (rank 0 logs it); a port
    # given here moves to the next free one when taken (logged)
    master_port: tp.Optional[int] = None
    # torchrun --max-restarts: restart the whole worker group this often after a worker fails
    max_restarts: int = 0
    # sweeps (-m): jobs run side by side on disjoint devices; null = as many as the devices allow
    max_parallel: tp.Optional[int] = None
    # not supported here: requeue is a Slurm feature (slurm.max_requeues); set only to get a clear error
    max_requeues: tp.Optional[int] = None

    def __post_init__(self) -> None:
        if self.nproc_per_node != "auto":
            ok = str(self.nproc_per_node).isdigit() and int(self.nproc_per_node) >= 1
            require(ok, "interactive.nproc_per_node", self.nproc_per_node, "'auto' or an integer >= 1")
        if self.master_port is not None:
            check_port("interactive.master_port", self.master_port)
        require(self.max_restarts >= 0, "interactive.max_restarts", self.max_restarts, "must be >= 0")
        at_least("interactive.max_parallel", self.max_parallel)
        require(self.max_requeues is None, "interactive.max_requeues", self.max_requeues,
                "requeue is a Slurm feature (launcher=slurm slurm.max_requeues=N); interactive runs restart "
                "failed workers with interactive.max_restarts")


def cuda_device_count() -> int:
    """Visible CUDA devices, without importing torch when there is no NVIDIA driver (keeps start-up fast)."""
    if not Path("/proc/driver/nvidia").exists() and "CUDA_VISIBLE_DEVICES" not in os.environ:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def find_ft_launcher() -> str | None:
    """``ft_launcher`` beside this Python (the venv's console script, whether or not the venv is activated), else
    on PATH; None when neither has one."""
    beside = Path(sys.executable).parent / fault_tolerance.LAUNCHER
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(fault_tolerance.LAUNCHER)


def cpu_cores() -> list[int]:
    """CPU cores this process may run on (its affinity mask, which containers and Slurm narrow)."""
    return sorted(os.sched_getaffinity(0))


def resolve_nproc(value: str, gpus: int, cpus: int) -> int:
    """``interactive.nproc_per_node``: ``auto`` = one worker per GPU, else one per CPU core; else the integer."""
    if value == "auto":
        return gpus or cpus
    return int(value)


@dataclasses.dataclass(frozen=True)
class Request:
    """What starting one torchrun group needs besides its script."""

    nproc: int
    master_port: int | None
    max_parallel: int | None
    uses_gpus: bool
    env: tuple[tuple[str, str], ...]  # hydra.job.env_set
    workdir: str | None
    launcher: str = "torchrun"  # or "ft_launcher" (fault_tolerance.enabled)


@dataclasses.dataclass(frozen=True)
class LocalRef:
    """A local job: its dir (the run lock and pid live in ``launch/``) and when it was started (epoch s)."""

    job_dir: str
    started_at: float = 0.0

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
    raise RuntimeError(f"no free TCP port in {start}..{start + 1999}")


def lock_job_dir(job: JobSpec) -> int:
    """Take the job dir's run lock (``flock`` on ``launch/lock``) and return its fd; the torchrun group inherits it,
    so the lock lives exactly as long as the job's processes, whoever started them.

    Raises RuntimeError naming the dir and the holder's pid when another run is using this dir (two runs writing
    one ``checkpoints/`` and ``metrics.jsonl`` would corrupt both)."""
    path = job.launch_dir / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise RuntimeError(f"{job.job_dir} is in use by another run (pid {holder}); wait for it, cancel it "
                           f"(automodel-hydra cancel {job.job_dir}), or choose another hydra.run.dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    (job.launch_dir / "pid").unlink(missing_ok=True)  # a pid left by an earlier run names another process now
    return fd


def job_running(job_dir: Path) -> bool:
    """Whether a run holds the job dir's lock right now (no pid guessing: a recycled pid cannot fool it)."""
    path = Path(job_dir) / "launch" / LOCK
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False



class _Scheduler:
    """Packs jobs onto disjoint device slots; one thread, jobs start as slots free up (in input order)."""

    def __init__(self, plans: tp.Sequence[Plan[Request]], quiet: bool, locks: tp.Sequence[int],
                 started_at: float) -> None:
        self.plans, self.quiet, self.locks, self.started_at = plans, quiet, locks, started_at
        first = plans[0].request
        self.slots = list(range(cuda_device_count())) if first.uses_gpus else cpu_cores()
        self.max_parallel = first.max_parallel or len(plans)
        self.futures: list[Future[JobResult]] = [Future() for _ in plans]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.cond = threading.Condition()
        self.cancelled = False

    def start(self) -> None:
        threading.Thread(target=self._loop, name="automodel-interactive", daemon=True).start()

    def _loop(self) -> None:
        free = list(self.slots)
        running: dict[int, tuple[list[int], int | None, subprocess.Popen[bytes]]] = {}
        ports: set[int] = set()
        pending = list(range(len(self.plans)))
        while pending or running:
            with self.cond:
                while pending and not self.cancelled:
                    i = pending[0]
                    need = min(self.plans[i].request.nproc, len(self.slots))
                    if len(running) >= self.max_parallel or (running and need > len(free)):
                        break
                    pending.pop(0)
                    if (self.plans[i].job.launch_dir / CANCELLED_MARK).exists():  # cancelled while queued
                        self.futures[i].set_result(JobResult(JobState.CANCELLED, error="cancelled before start"))
                        continue
                    devices, free = free[:need], free[need:]
                    base = self.plans[i].request.master_port
                    port = None if base is None else free_port(base, ports)
                    if port is not None:
                        ports.add(port)
                    running[i] = (devices, port, self._start(i, devices, port, packed=len(self.plans) > 1))
                if self.cancelled:
                    for i in pending:
                        (self.plans[i].job.launch_dir / CANCELLED_MARK).touch()  # status says so later
                        self.futures[i].set_result(JobResult(JobState.CANCELLED, error="cancelled before start"))
                    pending = []
                self.cond.wait(timeout=0.2)
            for i, (devices, port, proc) in list(running.items()):
                if proc.poll() is not None:
                    del running[i]
                    free += devices
                    if port is not None:
                        ports.discard(port)
                    self.futures[i].set_result(_result(self.plans[i], proc.returncode, self.started_at))

    def _start(self, i: int, devices: list[int], port: int | None, packed: bool) -> subprocess.Popen[bytes]:
        plan = self.plans[i]
        env = {**os.environ, **dict(plan.request.env)}
        env.pop("AUTOMODEL_RDZV_PORT", None)
        if port is not None:
            env["AUTOMODEL_RDZV_PORT"] = str(port)
        preexec = None
        if packed and plan.request.uses_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        elif packed:
            env["OMP_NUM_THREADS"] = str(max(1, len(devices) // plan.request.nproc))
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
        (plan.job.launch_dir / "pid").write_text(f"{proc.pid}\n")
        self.procs[i] = proc
        return proc

    def cancel(self) -> None:
        """SIGTERM every running torchrun group (workers checkpoint and exit); queued jobs never start."""
        with self.cond:
            self.cancelled = True
            for i, proc in self.procs.items():
                if proc.poll() is None:
                    (self.plans[i].job.launch_dir / CANCELLED_MARK).touch()  # CANCELLED, not FAILED
                    stop_ranks(proc.pid)
            self.cond.notify_all()



def _script(plan: Plan[Request]) -> str:
    """The plan's script: ``torchrun.sh``, or ``call.sh`` for a call job."""
    return CALL_SCRIPT if plan.job.call is not None else SCRIPT


def _out_name(plan: Plan[Request]) -> str:
    """Where a packed job's own output goes (``torchrun.out``, ``call.out``)."""
    return _script(plan).replace(".sh", ".out")


def _result(plan: Plan[Request], returncode: int, started_at: float) -> JobResult:
    value = read_result(plan.job)
    restarts = fault_tolerance.restart_summary(plan.job.launch_dir, started_at)  # "" without in-job restarts
    if returncode == 0 and value is not None and plan.job.result_file.stat().st_mtime >= started_at - 1:
        if restarts:
            log.warning("job %s completed, %s", plan.job.job_num or 0, restarts)
        return JobResult(JobState.COMPLETED, value)
    tail = ""
    out = plan.job.launch_dir / _out_name(plan)
    if out.exists():
        tail = "\n" + "\n".join(out.read_text(errors="replace").splitlines()[-30:])
    cancelled = returncode in (-signal.SIGTERM, 143) or (plan.job.launch_dir / CANCELLED_MARK).exists()
    state = JobState.CANCELLED if cancelled else JobState.FAILED
    # what ended it, quoted in the command's last line: a hung rank (fault tolerance), else the rank's exception
    why = fault_tolerance.final_hang(plan.job.launch_dir, started_at) or rank_error(plan.job, started_at)
    if restarts:
        why = f"{why + '; ' if why else ''}{restarts}"
    what = "the call's process" if plan.job.call is not None else plan.request.launcher
    return JobResult(state, error=f"{why + '; ' if why else ''}{what} exited with {returncode} "
                                  f"(job dir {plan.job.job_dir}){tail}")


class Interactive(Backend[Request, LocalRef]):
    """torchrun on this node. Preflight counts the devices here; a sweep's jobs are one batch, packed."""

    name = "interactive"

    def __init__(self) -> None:
        self.gpus: int | None = None
        self.cpus: list[int] = []
        self.ft_launcher: str | None = None  # preflight's find_ft_launcher(), for jobs with fault tolerance
        self._futures: dict[str, Future[JobResult]] = {}
        self._schedulers: list[_Scheduler] = []

    def preflight(self, cfgs: tp.Sequence[TrainConfig]) -> None:
        from automodel_hydra.config import host_problems

        for cfg in cfgs:
            for problem in host_problems(cfg):
                raise problem
        if any(cfg.fault_tolerance.enabled for cfg in cfgs):
            self.ft_launcher = find_ft_launcher()
            if self.ft_launcher is None:
                raise PreflightError(fault_tolerance.missing_launcher_line("beside this Python or on PATH"))
        self.gpus, self.cpus = cuda_device_count(), cpu_cores()

    def _devices(self) -> tuple[int, list[int]]:
        if self.gpus is None:  # planned without a preflight (tests of planning alone)
            self.gpus, self.cpus = cuda_device_count(), cpu_cores()
        return self.gpus, self.cpus

    def world_size(self, cfg: TrainConfig) -> int:
        gpus, cpus = self._devices()
        return resolve_nproc(cfg.interactive.nproc_per_node, gpus, len(cpus))

    def plan(self, cfg: TrainConfig, job: JobSpec) -> Plan[Request]:
        """torchrun argv for ``cfg.interactive`` as a bash script (pure, given the devices preflight counted); for
        a call job, one process (:meth:`plan_call`)."""
        if job.call is not None:
            return self.plan_call(cfg, job)
        ic = cfg.interactive
        gpus, cpus = self._devices()
        nproc = resolve_nproc(ic.nproc_per_node, gpus, len(cpus))
        worker = worker_argv(job, python=sys.executable)
        prefix = nsys_prefix(cfg.profile.nsys, cfg.output_dir, job.job_name, rank_var="RANK")
        ft = cfg.fault_tolerance
        # ft_launcher takes torchrun's options (and the same rendezvous) plus its own, --max-restarts included
        launcher = ([self.ft_launcher or fault_tolerance.LAUNCHER, *fault_tolerance.ft_args(ft)] if ft.enabled else
                    [sys.executable, "-m", "torch.distributed.run", f"--max_restarts={ic.max_restarts}"])
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
            *(["# hydra.job.env_set", *(f"export {k}={shlex.quote(v)}" for k, v in job.env)] if job.env else []),
            *([f"cd {shlex.quote(str(job.workdir))}  # hydra.job.chdir"] if job.workdir else []),
            "exec " + shlex.join(torchrun) + ' --rdzv-endpoint="127.0.0.1:${AUTOMODEL_RDZV_PORT:-0}" '
            + shlex.join(tail),
            "",
        ]
        request = Request(nproc, ic.master_port, ic.max_parallel, gpus > 0, job.env,
                          str(job.workdir) if job.workdir else None, "ft_launcher" if ft.enabled else "torchrun")
        return Plan(self.name, job, {SCRIPT: "\n".join(lines)}, request, wait=True, group_key=(ic.max_parallel,))

    def plan_call(self, cfg: TrainConfig, job: JobSpec) -> Plan[Request]:
        """A call job: ``launch/call.sh`` runs one process (no torchrun, no rendezvous) with this project on
        PYTHONPATH. In a sweep it gets one device slot like a 1-worker job (a GPU, else a CPU core), so calls run
        side by side, at most ``interactive.max_parallel`` at once. ``env_set`` and ``chdir`` are applied by
        Hydra's ``run_job`` in that process, so the script sets neither."""
        ic = cfg.interactive
        gpus, _ = self._devices()
        lines = [
            "#!/usr/bin/env bash",
            f"# {job.job_name!r}: one process running the Hydra job's task function (launch/{job.call_file.name}). "
            "Planned by automodel-hydra.",
            "set -euo pipefail",
            f"export PYTHONPATH={shlex.quote(str(job.project_root))}${{PYTHONPATH:+:$PYTHONPATH}}",
            "export PYTHONUNBUFFERED=1",
            "exec " + shlex.join(call_argv(job, python=sys.executable)),
            "",
        ]
        request = Request(1, None, ic.max_parallel, gpus > 0, (), None)
        return Plan(self.name, job, {CALL_SCRIPT: "\n".join(lines)}, request, wait=True,
                    group_key=(ic.max_parallel,))

    def batches(self, plans: tp.Sequence[Plan[Request]], sweep_dir: Path | None) -> list[Batch[Request]]:
        """All jobs in one batch: they are packed onto this node's devices together."""
        files = {p.job.launch_dir / name: text for p in plans for name, text in p.files.items()}
        return [Batch(tuple(plans), files)]

    def submit(self, batch: Batch[Request]) -> list[Submission[LocalRef]]:
        """Start the planned torchrun groups (packed onto free devices). Returns at once; see :meth:`wait`."""
        plans = batch.plans
        for p in plans:  # a rerun in the same dir starts uncancelled
            (p.job.launch_dir / CANCELLED_MARK).unlink(missing_ok=True)
        locks: list[int] = []
        try:
            for p in plans:  # every dir is ours before anything starts
                locks.append(lock_job_dir(p.job))
        except RuntimeError:
            for fd in locks:
                os.close(fd)
            raise
        started = time.time()
        sched = _Scheduler(plans, quiet=len(plans) > 1, locks=locks, started_at=started)
        self._schedulers.append(sched)
        sched.start()
        subs = []
        for p, future in zip(plans, sched.futures):
            self._futures[str(p.job.job_dir)] = future
            subs.append(Submission(p, LocalRef(str(p.job.job_dir), started), log_path=str(p.job.log_file)))
        return subs

    def wait(self, subs: tp.Sequence[Submission[LocalRef]]) -> list[JobResult]:
        """Block until every job ends. Ctrl-C / SIGTERM stops the workers with a checkpoint, then re-raises."""
        restore = _raise_on_termination()
        futures = [self._futures[s.ref.job_dir] for s in subs]
        try:
            return [f.result() for f in futures]
        except BaseException:
            for sched in self._schedulers:
                sched.cancel()
            for f in futures:
                f.result(timeout=120)
            raise
        finally:
            restore()

    def states(self, refs: tp.Sequence[LocalRef]) -> list[StateInfo]:
        return [StateInfo(local_state(Path(r.job_dir), r.started_at)) for r in refs]

    def cancel(self, refs: tp.Sequence[LocalRef]) -> None:
        """SIGTERM each job's torchrun process group (workers checkpoint at the next step, then exit)."""
        for ref in refs:
            job_dir = Path(ref.job_dir)
            (job_dir / "launch" / CANCELLED_MARK).touch()  # read by states() and by a sweep's queue
            pid = _pid(job_dir)
            if pid is not None and job_running(job_dir):  # never signal a pid that no longer belongs to this job
                stop_ranks(pid)

    def ref_from_record(self, record: tp.Mapping[str, tp.Any]) -> LocalRef:
        ref = record.get("ref") or {}
        return LocalRef(str(ref.get("job_dir", record["job_dir"])), float(ref.get("started_at", 0.0)))


def _raise_on_termination() -> tp.Callable[[], None]:
    """Python's default SIGTERM/SIGHUP action kills this process at once, and the torchrun groups (own
    sessions) would train on unattended. Turn the first such signal into SystemExit(128 + signum), so :func:`wait`
    stops the workers with a checkpoint first; later ones are ignored while it does. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    fired: list[int] = []

    def handler(signum: int, frame: object) -> None:
        if not fired:
            fired.append(signum)
            log.warning("caught %s: stopping the workers with a checkpoint", signal.Signals(signum).name)
            raise SystemExit(128 + signum)

    old = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGHUP)}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore



def stop_ranks(torchrun_pid: int) -> None:
    """SIGTERM the ranks of the torchrun agent ``torchrun_pid`` (its child processes, from ``/proc``): they
    checkpoint at the next step and end cleanly, and torchrun exits by itself, without the traceback it prints
    when it is signalled itself. Falls back to the agent's process group when no rank is found."""
    children = []
    agent = _cmdline(torchrun_pid)
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # a child with the agent's own command line is a forked helper, not a rank: ft_launcher's rank monitors,
        # which the agent ends itself (signalled, they die, and the ranks' heartbeats fail mid-checkpoint)
        if len(fields) > 1 and fields[1] == str(torchrun_pid) and _cmdline(int(stat.parent.name)) != agent:
            children.append(int(stat.parent.name))
    for pid in children or []:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if not children:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(torchrun_pid, signal.SIGTERM)


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def local_state(job_dir: Path, started_at: float = 0.0) -> JobState:
    """State of a local job from what it left behind (there is no scheduler to ask): RUNNING while its processes
    hold the dir's run lock, COMPLETED when rank 0 wrote ``result.json`` after the job started, else
    CANCELLED/FAILED; PENDING while a sweep's queue holds it."""
    if job_running(job_dir):  # locked: started (pid written at start) or queued in a sweep
        return JobState.RUNNING if _pid(job_dir) is not None else JobState.PENDING
    for result in (job_dir / RESULT_FILE, job_dir / "launch" / CALL_RESULT_FILE):  # a recipe's, a call's
        if result.exists() and result.stat().st_mtime >= started_at - 1:
            return JobState.COMPLETED
    if (job_dir / "launch" / CANCELLED_MARK).exists():
        return JobState.CANCELLED
    return JobState.FAILED if _pid(job_dir) is not None else JobState.PENDING


def _pid(job_dir: Path) -> int | None:
    path = job_dir / "launch" / "pid"
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None
