"""Interactive backend: torchrun on this node (``python train.py``).

``plan`` writes ``launch/torchrun.sh``: the exact command, runnable by hand. ``submit`` starts one torchrun group
per job; a sweep's jobs run side by side on disjoint devices (``CUDA_VISIBLE_DEVICES`` on GPUs, CPU affinity and
``OMP_NUM_THREADS`` on CPU cores), each with its own rendezvous port, at most ``interactive.max_parallel`` at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import typing as tp
from concurrent.futures import Future
from pathlib import Path

from automodel_hydra.config import TrainConfig
from automodel_hydra.plan import JobResult, JobSpec, Plan, Submission, worker_argv
from automodel_hydra.profile import nsys_check_lines, nsys_prefix

log = logging.getLogger(__name__)

NAME = "interactive"
SCRIPT = "torchrun.sh"
CANCELLED_MARK = "cancelled"  # issue 6: written by cancel(record); torchrun itself exits 1 on SIGTERM


def cuda_device_count() -> int:
    """Visible CUDA devices, without importing torch when there is no NVIDIA driver (keeps start-up fast)."""
    if not Path("/proc/driver/nvidia").exists() and "CUDA_VISIBLE_DEVICES" not in os.environ:
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def cpu_cores() -> list[int]:
    """CPU cores this process may run on (its affinity mask, which containers and Slurm narrow)."""
    return sorted(os.sched_getaffinity(0))


def resolve_nproc(value: str, gpus: int, cpus: int) -> int:
    """``interactive.nproc_per_node``: ``auto`` = one worker per GPU, else one per CPU core; else the integer."""
    if value == "auto":
        return gpus or cpus
    return int(value)


@dataclasses.dataclass(frozen=True)
class Payload:
    nproc: int
    master_port: int | None
    max_parallel: int | None
    uses_gpus: bool


def plan(cfg: TrainConfig, job: JobSpec) -> Plan:
    """torchrun argv for ``cfg.interactive`` as a bash script (pure apart from counting devices)."""
    ic = cfg.interactive
    gpus = cuda_device_count()
    nproc = resolve_nproc(ic.nproc_per_node, gpus, len(cpu_cores()))
    worker = worker_argv(job, python=sys.executable)
    prefix = nsys_prefix(cfg.profile.nsys, cfg.output_dir, job.job_name, rank_var="RANK")
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", f"--nproc_per_node={nproc}",
                f"--max_restarts={ic.max_restarts}", "--rdzv-backend=c10d"]
    # torchrun -m runs `python -m`; with a profiler prefix it must run an executable instead (--no-python)
    tail = ["--no-python", *prefix, *worker] if prefix else worker[2:]
    lines = [
        "#!/usr/bin/env bash",
        # issue 7: a newline in the job name (hydra.job.name) would end the comment and run the rest as code
        f"# {job.job_name!r}: torchrun on this node, {nproc} worker(s). Planned by automodel-hydra.",
        "# Rendezvous port: AUTOMODEL_RDZV_PORT (interactive.master_port, moved to a free one at start), or 0: the",
        "# rendezvous store binds a port the OS picks, so jobs on one host never collide. Rank 0 logs the port.",
        "set -euo pipefail",
        *nsys_check_lines(cfg.profile.nsys),
        f"export PYTHONPATH={shlex.quote(str(job.project_root))}${{PYTHONPATH:+:$PYTHONPATH}}",
        "export PYTHONUNBUFFERED=1",
        f"export OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{max(1, len(cpu_cores()) // nproc)}}}  # CPU threads per worker",
        "exec " + shlex.join(torchrun) + ' --rdzv-endpoint="127.0.0.1:${AUTOMODEL_RDZV_PORT:-0}" '
        + shlex.join(tail),
        "",
    ]
    payload = Payload(nproc, ic.master_port, ic.max_parallel, gpus > 0)
    return Plan(NAME, job, {SCRIPT: "\n".join(lines)}, payload, group_key=(ic.max_parallel,))


# ----------------------------------------------------------------------------------------------- side effects


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


LOCK = "lock"


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

    def __init__(self, plans: tp.Sequence[Plan], quiet: bool, locks: tp.Sequence[int]) -> None:
        self.plans, self.quiet, self.locks = plans, quiet, locks
        first = plans[0].payload
        self.slots = list(range(cuda_device_count())) if first.uses_gpus else cpu_cores()
        self.max_parallel = first.max_parallel or len(plans)
        self.futures: list[Future[JobResult]] = [Future() for _ in plans]
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.cond = threading.Condition()
        self.cancelled = False

    def start(self) -> None:
        threading.Thread(target=self._loop, name="automodel-interactive", daemon=True).start()

    def _loop(self) -> None:
        free, running, ports = list(self.slots), {}, set()
        pending = list(range(len(self.plans)))
        while pending or running:
            with self.cond:
                while pending and not self.cancelled:
                    i = pending[0]
                    need = min(self.plans[i].payload.nproc, len(self.slots))
                    if len(running) >= self.max_parallel or (running and need > len(free)):
                        break
                    pending.pop(0)
                    if (self.plans[i].job.launch_dir / CANCELLED_MARK).exists():  # issue 6: cancelled while queued
                        self.futures[i].set_result(JobResult("CANCELLED", error="cancelled before start"))
                        continue
                    devices, free = free[:need], free[need:]
                    base = self.plans[i].payload.master_port
                    port = None if base is None else free_port(base, ports)
                    ports.add(port)
                    running[i] = (devices, port, self._start(i, devices, port, packed=len(self.plans) > 1))
                if self.cancelled:
                    for i in pending:
                        (self.plans[i].job.launch_dir / CANCELLED_MARK).touch()  # issue 6: status says so later
                        self.futures[i].set_result(JobResult("CANCELLED", error="cancelled before start"))
                    pending = []
                self.cond.wait(timeout=0.2)
            for i, (devices, port, proc) in list(running.items()):
                if proc.poll() is not None:
                    del running[i]
                    free += devices
                    ports.discard(port)
                    self.futures[i].set_result(_result(self.plans[i], proc.returncode))

    def _start(self, i: int, devices: list[int], port: int | None, packed: bool) -> subprocess.Popen[bytes]:
        plan = self.plans[i]
        env = dict(os.environ)
        env.pop("AUTOMODEL_RDZV_PORT", None)
        if port is not None:
            env["AUTOMODEL_RDZV_PORT"] = str(port)
        preexec = None
        if packed and plan.payload.uses_gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        elif packed:
            env["OMP_NUM_THREADS"] = str(max(1, len(devices) // plan.payload.nproc))
            preexec = lambda: os.sched_setaffinity(0, devices)  # noqa: E731
        log.info("job %s: torchrun with %d worker(s), rendezvous port %s%s", plan.job.job_num or 0,
                 plan.payload.nproc, port or "picked by the OS (rank 0 logs it)", f", devices {devices}" if packed else "")
        out = open(plan.job.launch_dir / "torchrun.out", "ab") if self.quiet else None  # noqa: SIM115
        proc = subprocess.Popen(["bash", str(plan.job.launch_dir / SCRIPT)], env=env, stdout=out, stderr=out,
                                start_new_session=True, preexec_fn=preexec, pass_fds=(self.locks[i],))
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
                    (self.plans[i].job.launch_dir / CANCELLED_MARK).touch()  # issue 6: CANCELLED, not FAILED
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(proc.pid, signal.SIGTERM)
            self.cond.notify_all()


def _result(plan: Plan, returncode: int) -> JobResult:
    result_file = plan.job.job_dir / "result.json"
    if returncode == 0 and result_file.exists():
        return JobResult("COMPLETED", json.loads(result_file.read_text()))
    tail = ""
    out = plan.job.launch_dir / "torchrun.out"
    if out.exists():
        tail = "\n" + "\n".join(out.read_text(errors="replace").splitlines()[-30:])
    cancelled = returncode in (-signal.SIGTERM, 143) or (plan.job.launch_dir / CANCELLED_MARK).exists()  # issue 6
    state = "CANCELLED" if cancelled else "FAILED"
    return JobResult(state, error=f"torchrun exited with {returncode} (job dir {plan.job.job_dir}){tail}")


def submit(plans: tp.Sequence[Plan]) -> list[Submission]:
    """Start the planned torchrun groups (packed onto free devices). Returns at once; see :func:`wait`."""
    for p in plans:  # issue 6: a rerun in the same dir starts uncancelled
        (p.job.launch_dir / CANCELLED_MARK).unlink(missing_ok=True)
    locks: list[int] = []
    try:
        for p in plans:  # every dir is ours before anything starts
            locks.append(lock_job_dir(p.job))
    except RuntimeError:
        for fd in locks:
            os.close(fd)
        raise
    sched = _Scheduler(plans, quiet=len(plans) > 1, locks=locks)
    sched.start()
    return [Submission(p, ids=[], log_path=str(p.job.log_file), handle=(sched, f)) for p, f in zip(plans, sched.futures)]


def wait(subs: tp.Sequence[Submission]) -> list[JobResult]:
    """Block until every job ends. Ctrl-C / SIGTERM stops the workers with a checkpoint, then re-raises."""
    restore = _raise_on_termination()
    try:
        return [s.handle[1].result() for s in subs]
    except BaseException:
        for s in subs:
            s.handle[0].cancel()
        for s in subs:
            s.handle[1].result(timeout=120)
        raise
    finally:
        restore()


def _raise_on_termination() -> tp.Callable[[], None]:
    """issue 7: Python's default SIGTERM/SIGHUP action kills this process at once, and the torchrun groups (own
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


def status(record: dict[str, tp.Any]) -> str:
    """State of a past interactive job from what it left behind (there is no scheduler to ask): RUNNING while its
    processes hold the dir's run lock, COMPLETED when rank 0 wrote ``result.json``, else FAILED/CANCELLED."""
    job_dir = Path(record["job_dir"])
    if job_running(job_dir):  # locked: started (pid written at start) or queued in a sweep
        return "RUNNING" if _pid(job_dir) is not None else "PENDING"
    if (job_dir / "result.json").exists():
        return "COMPLETED"
    if (job_dir / "launch" / CANCELLED_MARK).exists():  # issue 6: torchrun itself exits 1 on SIGTERM
        return "CANCELLED"
    return "FAILED" if _pid(job_dir) is not None else "PENDING"


def _pid(job_dir: Path) -> int | None:
    path = job_dir / "launch" / "pid"
    return int(path.read_text()) if path.exists() else None


def cancel(record: dict[str, tp.Any]) -> None:
    """SIGTERM the job's torchrun process group (workers checkpoint at the next step, then exit)."""
    (Path(record["job_dir"]) / "launch" / CANCELLED_MARK).touch()  # issue 6: read by status and by the queue
    job_dir = Path(record["job_dir"])
    pid = _pid(job_dir)
    if pid is not None and job_running(job_dir):  # never signal a pid that no longer belongs to this job
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
