"""The ``fault_tolerance:`` section and the facts every launcher and every rank share about it.

With ``fault_tolerance.enabled=true`` the job's ranks are started by ``ft_launcher`` (nvidia-resiliency-ext's
fault-tolerance launcher: torchrun's options plus ``--ft-*``) instead of torchrun: one launcher per node, a rank
monitor per rank fed by heartbeats (:mod:`automodel_hydra.heartbeat`, one per optimizer step), a rank without a
heartbeat for ``rank_heartbeat_timeout`` seconds is ended with ``rank_termination_signal`` and the worker group is
restarted in place, at most ``max_restarts`` times. The field names and their meaning are those of NeMo-Run's
``FaultTolerance`` launcher (``nemo_run.core.execution.launcher``), which passes them to ``ft_launcher`` the same
way (:func:`ft_args`). docs/fault-tolerance.md has the defaults and why, and what happens on each launcher.

Evidence a job leaves in ``launch/ft/`` (written by the ranks, read by the launching command and ``status``):

* ``hang.rank<R>.attempt<A>.json`` and ``stack.rank<R>.attempt<A>.txt``: a rank of attempt ``A`` that sent no
  heartbeat for a while (:data:`DUMP_FRACTION` of ``rank_heartbeat_timeout``), with its rank, host, step and time,
  and the Python stack of every thread; ``resumed_at`` is added when a heartbeat came after all (not a hang);
* ``attempts.jsonl``: one line per restarted attempt, written by its rank 0: the attempt, the time, the step it
  resumes from (when the recipe says) and why the previous attempt ended
  (:func:`automodel_hydra.outcome.explain`).

Attempts are named by :func:`automodel_hydra.plan.attempt_name` (``attempt<A>``, after a Slurm requeue
``requeue<K>.attempt<A>``): no attempt's record replaces another's.

Every record carries the launch id of the launch that wrote it (``run_id``, from ``launch/run_id``), and readers
take only the records of the job's current launch: an earlier launch's hangs and restarts, left in the same job
dir, are never reported as this one's. No clock is compared (the nodes and the file server need not share the
submitting host's clock).

This module imports only :mod:`automodel_hydra.schema`, :mod:`automodel_hydra.plan` (the launch id) and the
standard library, so every backend, the worker and the CLI can use it.
"""

from __future__ import annotations

import json
import signal
import typing as tp
from dataclasses import dataclass
from pathlib import Path

from automodel_hydra.plan import attempt_name, read_run_id
from automodel_hydra.schema import require

#: The pip extra that installs ``ft_launcher`` (``nvidia-resiliency-ext``).
EXTRA = "fault-tolerance"
#: The launcher's command name (nvidia-resiliency-ext's console script).
LAUNCHER = "ft_launcher"
#: Set in every rank ``ft_launcher`` starts (the rank monitor's socket): a rank without it was not started by
#: ``ft_launcher`` and sends no heartbeat (nvidia_resiliency_ext.fault_tolerance.data).
RANK_MONITOR_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
#: Where the evidence goes, under the job's ``launch/`` dir.
EVIDENCE_DIR = "ft"
ATTEMPTS_FILE = "attempts.jsonl"
#: A rank's stack is written once it has sent no heartbeat for this fraction of ``rank_heartbeat_timeout``: early
#: enough to be written before the rank monitor ends the rank (it checks every ``workload_check_interval`` s).
DUMP_FRACTION = 0.6

SIGNALS = ("SIGKILL", "SIGTERM", "SIGINT", "SIGABRT", "SIGQUIT", "SIGUSR1")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


@dataclass
class FaultToleranceConfig:
    """Hang detection and in-job restarts with ``ft_launcher`` (``fault_tolerance:``; off by default).

    Field names: NeMo-Run's ``FaultTolerance`` launcher. Seconds are wall-clock seconds on each rank."""

    # run the ranks under ft_launcher: heartbeats, hang detection, in-job restarts (pip extra: fault-tolerance)
    enabled: bool = False
    # s without a heartbeat (one per optimizer step) after which a rank counts as hung; must exceed the longest
    # gap between two optimizer steps (a checkpoint save, a validation pass)
    rank_heartbeat_timeout: float = 300.0
    # s before the first heartbeat (imports, model load, process group, checkpoint load, first step)
    initial_rank_heartbeat_timeout: float = 1200.0
    # in-job restarts of the whole worker group (same allocation) after a hang or a failed rank
    max_restarts: int = 3
    # how the rank monitor ends a hung rank (ft_launcher's default SIGKILL: a hung rank may not react to others)
    rank_termination_signal: str = "SIGKILL"
    # s between the rank monitors' checks of the heartbeats
    workload_check_interval: float = 5.0
    # ft_launcher's and the rank monitors' log level
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        key = "fault_tolerance."
        for name in ("rank_heartbeat_timeout", "initial_rank_heartbeat_timeout", "workload_check_interval"):
            value = getattr(self, name)
            require(value > 0, key + name, value, "a number of seconds > 0")
        require(self.workload_check_interval < self.rank_heartbeat_timeout, key + "workload_check_interval",
                self.workload_check_interval,
                f"less than fault_tolerance.rank_heartbeat_timeout={self.rank_heartbeat_timeout} (a hang is seen "
                "only at a check)")
        require(self.max_restarts >= 0, key + "max_restarts", self.max_restarts, "an integer >= 0")
        require(str(self.rank_termination_signal).upper() in SIGNALS, key + "rank_termination_signal",
                self.rank_termination_signal, f"one of {', '.join(SIGNALS)}")
        self.rank_termination_signal = str(self.rank_termination_signal).upper()
        require(str(self.log_level).upper() in LOG_LEVELS, key + "log_level", self.log_level,
                f"one of {', '.join(LOG_LEVELS)}")
        self.log_level = str(self.log_level).upper()


def ft_args(ft: FaultToleranceConfig) -> list[str]:
    """``ft_launcher``'s own options for ``ft``, as NeMo-Run's ``ft_launcher`` component passes them
    (``--ft-<field>``), plus ``--max-restarts``. The NIC health monitor is turned off: it needs NVML and
    InfiniBand devices, and on a node without them it logs an error per rank and checks nothing."""
    return [f"--ft-workload-check-interval={ft.workload_check_interval:g}",
            f"--ft-initial-rank-heartbeat-timeout={ft.initial_rank_heartbeat_timeout:g}",
            f"--ft-rank-heartbeat-timeout={ft.rank_heartbeat_timeout:g}",
            f"--ft-rank-termination-signal={ft.rank_termination_signal}",
            f"--ft-log-level={ft.log_level}",
            "--ft-enable-nic-monitor=false",
            f"--max-restarts={ft.max_restarts}"]


def missing_launcher_line(where: str) -> str:
    """The one line for a job with ``fault_tolerance.enabled=true`` and no ``ft_launcher`` ``where``."""
    return (f"fault_tolerance.enabled=true needs {LAUNCHER} {where}, and there is none: install it with "
            f"pip install 'automodel-hydra[{EXTRA}]' (nvidia-resiliency-ext), or set fault_tolerance.enabled=false")


# ----------------------------------------------------------------------------------------------- evidence


def evidence_dir(launch_dir: Path) -> Path:
    return Path(launch_dir) / EVIDENCE_DIR


def hang_file(launch_dir: Path, rank: int, attempt: int, requeue: int = 0) -> Path:
    return evidence_dir(launch_dir) / f"hang.rank{rank}.{attempt_name(attempt, requeue)}.json"


def stack_file(launch_dir: Path, rank: int, attempt: int, requeue: int = 0) -> Path:
    return evidence_dir(launch_dir) / f"stack.rank{rank}.{attempt_name(attempt, requeue)}.txt"


def this_launch(current: str | None, record: tp.Mapping[str, tp.Any]) -> bool:
    """Whether ``record`` was written by the job's current launch: its ``run_id`` is ``current`` (``launch/run_id``'s,
    :func:`automodel_hydra.plan.read_run_id`; a job started without a launch id, by hand, takes every record)."""
    return current is None or record.get("run_id") == current


def hangs(launch_dir: Path, attempt: int | None = None) -> list[dict[str, tp.Any]]:
    """The hangs of the current launch recorded in ``launch/ft/`` (of ``attempt`` only, when given), lowest attempt
    and rank first; a record with ``resumed_at`` (a heartbeat came after all) is no hang and is left out. Within an
    attempt the ranks that were not waiting in a collective (``waiting_in`` unset) come first: the others were
    waiting for them."""
    found, current = [], read_run_id(launch_dir)  # the launch id, read once
    for path in evidence_dir(launch_dir).glob("hang.rank*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("resumed_at") is not None or not this_launch(current, record):
            continue
        if attempt is None or record.get("attempt") == attempt:
            found.append(record)
    # a rank waiting in a collective waits for the hung one: the ranks that were not waiting come first
    return sorted(found, key=lambda r: (r.get("requeue") or 0, r.get("attempt", 0), r.get("waiting_in") is not None,
                                        r.get("rank", 0)))


def describe_hang(record: tp.Mapping[str, tp.Any]) -> str:
    """``"rank 1 hung at step 5 on host vm (no heartbeat within fault_tolerance.rank_heartbeat_timeout=8 s; stack:
    <path>)"``: the timeout that ends a silent rank (the initial one before its first heartbeat), not how long it
    had been silent when its stack was taken (:data:`DUMP_FRACTION` of that timeout)."""
    if record.get("timeout_s") is not None:
        within = f"no heartbeat within fault_tolerance.{record.get('timeout_key')}={record.get('timeout_s'):g} s"
    else:  # a record of an older version: only how long the rank had been silent when its stack was taken
        within = f"no heartbeat for {record.get('silent_s')} s"
    return (f"rank {record.get('rank')} hung at step {record.get('step')} on host {record.get('host')} ({within}; "
            f"stack: {record.get('stack')})")


def record_attempt(launch_dir: Path, attempt: int, time_s: float, reason: str, resumed_step: int | None = None,
                   requeue: int = 0) -> None:
    """Rank 0 of a restarted attempt: append its line to ``launch/ft/attempts.jsonl`` (``reason``: why the attempt
    before it ended, :func:`automodel_hydra.outcome.explain`)."""
    path = evidence_dir(launch_dir) / ATTEMPTS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    line = {"attempt": attempt, "requeue": requeue, "time": time_s, "resumed_step": resumed_step, "reason": reason,
            "run_id": read_run_id(launch_dir)}
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps(line) + "\n")


def attempts(launch_dir: Path) -> list[dict[str, tp.Any]]:
    """The restarted attempts of the current launch recorded so far (``attempts.jsonl``), in order; a torn line is
    skipped."""
    path = evidence_dir(launch_dir) / ATTEMPTS_FILE
    rows, current = [], read_run_id(launch_dir)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and this_launch(current, row):
            rows.append(row)
    return rows


def restart_summary(launch_dir: Path) -> str:
    """``"restarted 1x: rank 1 hung at step 5"`` for the restarts of the current launch, or ``""`` when there were
    none (several restarts: their reasons joined with ``"; "``)."""
    rows = attempts(launch_dir)
    if not rows:
        return ""
    reasons = [str(r.get("reason", "?")) for r in rows]
    return f"restarted {len(rows)}x: " + "; ".join(reasons)


def final_hang(launch_dir: Path) -> str | None:
    """The hang recorded for the current launch's last attempt (its last restart, else the first attempt),
    described (:func:`describe_hang`), or None: what ended a job whose restarts were spent."""
    rows = [*attempts(launch_dir), *hangs(launch_dir)]
    last = max(((int(r.get("requeue") or 0), int(r.get("attempt", 0))) for r in rows), default=(0, 0))
    found = [h for h in hangs(launch_dir, last[1]) if int(h.get("requeue") or 0) == last[0]]
    return describe_hang(found[0]) if found else None


def termination_signal(ft_name: str) -> int:
    """``rank_termination_signal`` as a signal number."""
    return int(getattr(signal, ft_name))
