"""Heartbeats without user code, and the evidence of a hung rank (every rank; see
:mod:`automodel_hydra.fault_tolerance`).

:func:`install` is called by the worker once the process group is up, before the recipe runs, for a rank that the
job's plan has ``ft_launcher`` start (``--started-by ft_launcher``; never guessed from a rank monitor's socket
found in the environment). It

* connects nvidia-resiliency-ext's ``RankMonitorClient`` (``init_workload_monitoring``), whose config (the
  heartbeat timeouts) comes from the rank monitor;
* registers one global optimizer step hook (torch's public
  ``torch.optim.optimizer.register_optimizer_step_post_hook``): every ``optimizer.step()`` of any
  ``torch.optim.Optimizer`` sends one heartbeat. So the bundled recipe, NeMo AutoModel's recipe classes and a
  user's function are all monitored unmodified. A recipe that steps no ``torch.optim`` optimizer must call
  :func:`beat` once per step itself (docs/fault-tolerance.md);
* starts a watchdog thread: once the rank has sent no heartbeat for
  :data:`~automodel_hydra.fault_tolerance.DUMP_FRACTION` of ``rank_heartbeat_timeout`` (of the initial timeout
  before the first one), it writes ``launch/ft/hang.rank<R>.attempt<A>.json`` (rank, host, step, time) and the
  Python stack of every thread (``faulthandler.dump_traceback``) to ``launch/ft/stack.rank<R>.attempt<A>.txt``,
  before the rank monitor ends the rank. A heartbeat that comes after all marks the record ``resumed_at``.
  When ``rank_termination_signal`` is one a process can catch (not SIGKILL), faulthandler is also registered on it
  (``chain=True``, so the worker's own handler still runs): the C-level dump reaches the stack file even when the
  rank is blocked in C code holding the GIL, where the watchdog thread cannot run.

The step a heartbeat reports is the optimizer's own count where it keeps one (``state[p]["step"]`` of Adam, AdamW
and most others, restored with a checkpoint), else the count of ``step()`` calls in this attempt; a hang "at step
N" means step N was in progress: N - 1 steps had completed.
"""

from __future__ import annotations

import contextlib
import datetime
import faulthandler
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
import typing as tp
from pathlib import Path

from automodel_hydra import fault_tolerance as ftm
from automodel_hydra import ledger
from automodel_hydra.plan import read_run_id

log = logging.getLogger(__name__)


class Monitor:
    """One rank's heartbeats and its watchdog. ``client`` is the ``RankMonitorClient`` (None in tests of the
    watchdog alone); timeouts in seconds."""

    def __init__(self, launch_dir: Path, rank: int, attempt: int, client: tp.Any, *, timeout_s: float,
                 initial_timeout_s: float, termination_signal: int = signal.SIGKILL, poll_s: float = 0.5,
                 requeue: int = 0) -> None:
        self.launch_dir, self.rank, self.attempt, self.client = Path(launch_dir), rank, attempt, client
        self.requeue = requeue
        self.timeout_s, self.initial_timeout_s, self.poll_s = timeout_s, initial_timeout_s, poll_s
        self.host = socket.gethostname()
        self.main_ident = threading.main_thread().ident
        self.steps = 0  # step() calls in this attempt
        self.step = 0  # the last completed step (the optimizer's count where it keeps one)
        self.last = time.monotonic()
        self.dumped = False
        self._stack: tp.IO[str] | None = None
        self._stop = threading.Event()
        self._hook: tp.Any = None
        self._lock = threading.Lock()
        self.stack_path = ftm.stack_file(self.launch_dir, rank, attempt, requeue)
        self.hang_path = ftm.hang_file(self.launch_dir, rank, attempt, requeue)
        self.stack_path.parent.mkdir(parents=True, exist_ok=True)
        if termination_signal != signal.SIGKILL:
            self._stack = self.stack_path.open("w", encoding="utf-8")
            faulthandler.register(termination_signal, file=self._stack, all_threads=True, chain=True)
            self._signal: int | None = termination_signal
        else:
            self._signal = None

    # --- heartbeats ---------------------------------------------------------------------------------------------

    def beat(self, optimizer: tp.Any = None) -> None:
        """One heartbeat: a step completed (``optimizer``: the one that stepped, for its step count)."""
        self.steps += 1
        self.step = optimizer_step(optimizer) or self.steps
        with self._lock:
            self.last = time.monotonic()
            if self.dumped:  # the rank was slow, not hung
                self.dumped = False
                self._update_hang(resumed_at=_now(), resumed_step=self.step)
        if self.client is not None:
            try:
                self.client.send_heartbeat()
            except Exception as e:  # the monitor is gone (the launcher is stopping): training must not fail on it
                log.warning("heartbeats stop: the rank monitor does not answer (%s)", str(e).splitlines()[0])
                self.client = None

    def hook(self, optimizer: tp.Any, args: tp.Any, kwargs: tp.Any) -> None:
        """The global optimizer step post-hook (torch's signature)."""
        self.beat(optimizer)

    # --- watchdog -----------------------------------------------------------------------------------------------

    def start(self) -> Monitor:
        import torch.optim.optimizer as optim

        self._hook = optim.register_optimizer_step_post_hook(self.hook)
        threading.Thread(target=self._watch, name="automodel-ft-watchdog", daemon=True).start()
        return self

    def timeout(self) -> tuple[float, str]:
        """The timeout that ends this rank when it stays silent, and its key: ``rank_heartbeat_timeout`` once it
        sent a heartbeat, ``initial_rank_heartbeat_timeout`` before (ft_launcher's rank monitor applies them so)."""
        if self.steps:
            return self.timeout_s, "rank_heartbeat_timeout"
        return self.initial_timeout_s, "initial_rank_heartbeat_timeout"

    def silent_after(self) -> float:
        """Seconds without a heartbeat after which the stack is written."""
        return ftm.DUMP_FRACTION * self.timeout()[0]

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            self.check()

    def check(self) -> bool:
        """Write the evidence when the rank has been silent too long (once per silence); True when it did."""
        with self._lock:
            silent = time.monotonic() - self.last
            if self.dumped or silent < self.silent_after():
                return False
            self.dumped = True
        self.dump(silent)
        return True

    def dump(self, silent_s: float) -> None:
        """Write ``hang.rank<R>.attempt<A>.json`` and the stack of every thread."""
        timeout_s, timeout_key = self.timeout()
        record = {"rank": self.rank, "host": self.host, "node": ledger.node_name(),
                  "attempt": self.attempt, "requeue": self.requeue,
                  "step": self.step + 1, "completed_steps": self.step, "silent_s": round(silent_s, 1),
                  "timeout_s": timeout_s, "timeout_key": timeout_key, "time": time.time(), "at": _now(),
                  "pid": os.getpid(), "stack": str(self.stack_path), "waiting_in": waiting_in(self.main_ident),
                  "run_id": read_run_id(self.launch_dir)}
        header = (f"rank {self.rank} on {self.host} (pid {os.getpid()}), attempt {self.attempt}: no heartbeat for "
                  f"{silent_s:.1f} s at step {self.step + 1} ({self.step} completed), {record['at']}\n")
        if self._stack is not None:  # keep the faulthandler registration's file; the dump goes after the header
            f = self._stack
            f.seek(0)
            f.truncate()
        else:
            f = self.stack_path.open("w", encoding="utf-8")
        f.write(header)
        f.flush()
        faulthandler.dump_traceback(file=f, all_threads=True)
        if self._signal is not None:
            f.write(f"\n(at {ftm.LAUNCHER}'s {signal.Signals(self._signal).name} the stacks follow again)\n")
        f.flush()
        if f is not self._stack:
            f.close()
        _write_json(self.hang_path, record)
        if record["waiting_in"] is not None:  # blocked in a collective: waiting for the silent rank, not hung itself
            log.info("waiting in %s for %.1f s at step %d (a peer is silent): stack in %s", record["waiting_in"],
                     silent_s, self.step + 1, self.stack_path)
        else:
            log.error("no heartbeat for %.1f s at step %d (fault_tolerance.%s=%g s ends this rank): stack of every "
                      "thread in %s", silent_s, self.step + 1, timeout_key, timeout_s, self.stack_path)

    def _update_hang(self, **extra: tp.Any) -> None:
        try:
            record = json.loads(self.hang_path.read_text())
        except (OSError, ValueError):
            return
        record.update(extra)
        _write_json(self.hang_path, record)

    def close(self) -> None:
        """Stop the watchdog, remove the hook and disconnect from the rank monitor (at the end of the recipe)."""
        self._stop.set()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._signal is not None:
            faulthandler.unregister(self._signal)
            self._signal = None
        if self._stack is not None:
            self._stack.close()
            self._stack = None
        if self.client is not None:
            with contextlib.suppress(OSError):
                self.client.shutdown_workload_monitoring()
            self.client = None


_active: Monitor | None = None


def beat() -> None:
    """One heartbeat from a recipe that steps no ``torch.optim`` optimizer (call once per training step); a
    no-op outside ``ft_launcher``."""
    if _active is not None:
        _active.beat()


def install(launch_dir: Path, rank: int, attempt: int = 0, requeue: int = 0,
            environ: tp.Mapping[str, str] = os.environ) -> Monitor:
    """Heartbeats and the watchdog for this rank, which ``ft_launcher`` started (the job's plan says so: the
    worker's ``--started-by ft_launcher``; a rank monitor's socket left in another job's environment is never taken
    for one). Call once the process group is up. ``attempt``/``requeue``: this rank's in-job restart and Slurm
    requeue counts. Raises RuntimeError when the rank monitor's socket (``FT_RANK_MONITOR_IPC_SOCKET``, which
    ft_launcher sets in every rank) is missing, and what ``RankMonitorClient.init_workload_monitoring`` raises."""
    global _active
    if ftm.RANK_MONITOR_ENV not in environ:
        raise RuntimeError(f"{ftm.LAUNCHER} started this rank (the job's plan says so), but ${ftm.RANK_MONITOR_ENV} "
                           "is not set: no rank monitor to send heartbeats to")
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client = RankMonitorClient()
    client.init_workload_monitoring()
    cfg = client.cfg
    big = 10.0 * 365 * 24 * 3600  # a timeout of None means none
    monitor = Monitor(launch_dir, rank, attempt, client,
                      timeout_s=float(cfg.rank_heartbeat_timeout or big),
                      initial_timeout_s=float(cfg.initial_rank_heartbeat_timeout or big),
                      termination_signal=int(cfg.rank_termination_signal), requeue=requeue)
    _active = monitor.start()
    log.info("fault tolerance: heartbeats on every optimizer step (attempt %d, heartbeat timeout %s s)", attempt,
             cfg.rank_heartbeat_timeout)
    return monitor


def no_restart(reason: str) -> bool:
    """Ask this rank's ``ft_launcher`` not to restart the worker group: a failure that a restart repeats
    (:mod:`automodel_hydra.failures`). nvidia-resiliency-ext's workload control request
    ``WorkloadAction.ShutdownWorkload`` ("shutdown rendezvous, do not restart ranks",
    ``RankMonitorClient.send_workload_control_request``) reaches the launcher over its IPC socket; at the next
    rendezvous, which the failure starts, the launcher closes the rendezvous and every node's launcher exits
    instead of restarting. Returns whether the request was sent (False outside ft_launcher, or when the
    launcher's socket is gone)."""
    try:
        from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient, WorkloadAction, WorkloadControlRequest
    except ImportError:
        return False
    client = _active.client if _active is not None and _active.client is not None else None
    try:
        if client is None:  # failed before the heartbeats started: connect for this request alone
            client = RankMonitorClient()
            client.init_workload_monitoring()
        client.send_workload_control_request(WorkloadControlRequest(WorkloadAction.ShutdownWorkload, reason))
    except Exception as e:  # the request is best effort: the failure itself is reported either way
        log.warning("could not ask %s not to restart (%s)", ftm.LAUNCHER, str(e).splitlines()[0] if str(e) else e)
        return False
    return True


def uninstall() -> None:
    global _active
    if _active is not None:
        _active.close()
        _active = None


#: Where a rank that waits for its peers is (the main thread inside one of these packages): a collective or
#: barrier of torch.distributed, a DDP backward waiting for its gradient all-reduce, a checkpoint's collectives.
_WAITING_IN = ("/torch/distributed/", "/torch/autograd/", "/torch/nn/parallel/")


def waiting_in(ident: int | None) -> str | None:
    """The torch.distributed/autograd function the thread ``ident`` is in now (its innermost Python frame, e.g.
    ``"all_reduce"``), or None:
    a rank blocked there waits for a peer, and the peer that is not waiting is the hung one."""
    frame = sys._current_frames().get(ident) if ident is not None else None
    if frame is None:
        return None
    path = frame.f_code.co_filename.replace("\\", "/")  # the innermost frame: where the thread is now
    return frame.f_code.co_name if any(part in path for part in _WAITING_IN) else None


def optimizer_step(optimizer: tp.Any) -> int | None:
    """The optimizer's own step count (``state[p]["step"]`` of its first parameter), when it keeps one."""
    try:
        param = optimizer.param_groups[0]["params"][0]
        step = optimizer.state[param]["step"]
        return int(step.item() if hasattr(step, "item") else step)
    except (AttributeError, IndexError, KeyError, TypeError, ValueError):
        return None


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _write_json(path: Path, record: dict[str, tp.Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(record, indent=2) + "\n")
    os.replace(tmp, path)
