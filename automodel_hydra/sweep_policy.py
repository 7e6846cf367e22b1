"""Stopping a sweep that keeps failing: ``hydra.launcher.sweep_policy.max_failures=N``.

After N members of one launch have failed, the members not started yet are cancelled (CANCELLED in
``automodel-hydra status``, never started) and the members already running finish; one line says so, and
``automodel-hydra resume S`` later runs the failed and the cancelled ones again (:mod:`automodel_hydra.resume`).
The default, null, never stops a sweep: a failed member says nothing about the others, so every point runs.

Who stops what: the local launcher's queue counts failures as its members end and starts no other member once N
have failed (nothing can start in between); for a scheduler's jobs (a Slurm array, SkyPilot jobs) the launching
command, while it waits, asks for the members' states and cancels those still PENDING (:func:`watch`), so the
policy needs a launch that waits (not ``slurm.detach=true``). A failure is a final state other than COMPLETED,
CANCELLED (someone's stop) and PREEMPTED (the scheduler's choice, requeued where allowed): FAILED, TIMEOUT,
OUT_OF_MEMORY, NODE_FAIL, BOOT_FAIL, DEADLINE, and UNKNOWN once final.

A member counts once it has failed for good, not at each failed attempt: a Slurm member whose attempt failed and
that the job requeued under its failure budget (``slurm.failure_budget``, docs/failures.md) is PENDING again, not
failed, because the budget judged that failure worth another attempt (a bad node, a lost peer), and it may yet
complete; it counts when its last attempt fails. Such a member waits behind the array's pending tasks, so under a
budget the stop comes later than the first failed attempts. When the sweep stops, a requeued member still pending
is cancelled with the members not started yet, and the line names it apart (:func:`stop_line`).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import typing as tp
from pathlib import Path

from automodel_hydra import records
from automodel_hydra.schema import ConfigError
from automodel_hydra.states import JobState

if tp.TYPE_CHECKING:
    from automodel_hydra.plan import Backend, Submission

#: The launcher key (``hydra/launcher=automodel``'s config).
KEY = "hydra.launcher.sweep_policy.max_failures"
#: Final states that are not a failure of the member: done, stopped by someone, preempted by the scheduler.
NOT_FAILURES = (JobState.COMPLETED, JobState.CANCELLED, JobState.PREEMPTED)
#: Seconds between two state queries of :func:`watch`.
WATCH_POLL_S = 3.0


def check(value: tp.Any) -> int | None:
    """The policy's value: None (never stop) or a whole number of failed members >= 1. Raises ConfigError
    naming the key, the value and what is valid."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(KEY, value, "a whole number of members failed for good (a member requeued under its "
                          "failure budget counts once its last attempt fails), 1 or more, after which the members "
                          "not started yet are cancelled; or null: never stop (the default)")
    return value


def is_failure(state: JobState) -> bool:
    """Whether a member's end counts towards ``max_failures`` (see the module docstring)."""
    return state.final and state not in NOT_FAILURES


def to_cancel(states: tp.Sequence[JobState], max_failures: int) -> list[int]:
    """The members to cancel now (their indices): every PENDING one once ``max_failures`` have failed. Pure."""
    if sum(is_failure(s) for s in states) < max_failures:
        return []
    return [i for i, s in enumerate(states) if s is JobState.PENDING]


def _nums(members: tp.Sequence[int | None]) -> str:
    return ", ".join(f"#{n or 0}" for n in members[:12]) + (", ..." if len(members) > 12 else "")


def stop_line(failures: int, max_failures: int, cancelled: tp.Sequence[int | None], where: Path | str | None,
              requeued: tp.Sequence[int | None] = ()) -> str:
    """``sweep stopped after 2 members failed for good (hydra.launcher.sweep_policy.max_failures=2): 3 member(s)
    not started yet are cancelled (#4, #5, #6), and 1 requeued after a failed attempt (#1); running ones finish;
    automodel-hydra resume S runs the failed and cancelled ones again``. ``cancelled``: the job numbers of the
    members cancelled before they started; ``requeued``: of those cancelled while pending again after an attempt
    (a requeue under the failure budget)."""
    again = f"automodel-hydra resume {where}" if where is not None else "a resume"
    also = f", and {len(requeued)} requeued after a failed attempt ({_nums(requeued)})" if requeued else ""
    return (f"sweep stopped after {failures} member{'s' if failures != 1 else ''} failed for good "
            f"({KEY}={max_failures}): {len(cancelled)} member(s) not started yet are cancelled "
            f"({_nums(cancelled) or 'none'}){also}; running ones finish; {again} runs the failed and cancelled ones "
            "again")


def started(launch: Path) -> bool:
    """Whether the member whose launch dir is ``launch`` started an attempt in its current launch (rank 0's start
    record of this launch: :func:`automodel_hydra.ledger.attempts`), as a requeued member has. A member whose
    ranks write elsewhere (a ``slurm.tunnel`` or SkyPilot job) reads as not started."""
    from automodel_hydra import ledger

    return bool(ledger.attempts(launch))


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@contextlib.contextmanager
def watch(subs: tp.Sequence[Submission[tp.Any]], impls: tp.Mapping[str, Backend[tp.Any, tp.Any, tp.Any]],
          max_failures: int | None, sweep_dir: Path | None, poll_s: float = WATCH_POLL_S) -> tp.Iterator[None]:
    """While the block waits for ``subs`` (a scheduler's jobs), ask for their states every ``poll_s`` seconds
    (one query per backend: :func:`automodel_hydra.progress.job_states`) and, once ``max_failures`` have failed,
    cancel every member still PENDING through its backend, once, with :func:`stop_line`. No-op for None."""
    if max_failures is None or not subs:
        yield
        return
    from automodel_hydra.progress import job_states

    stop = threading.Event()

    def poll() -> None:
        while not stop.wait(poll_s):
            try:
                states = job_states(subs)
            except Exception:  # (the scheduler did not answer: ask again next time)
                continue
            pending = to_cancel(states, max_failures)
            if pending or all(s.final for s in states):
                if pending:
                    by_backend: dict[str, list[tp.Any]] = {}
                    for i in pending:
                        by_backend.setdefault(subs[i].plan.backend, []).append(subs[i].ref)
                    for name, refs in by_backend.items():
                        with contextlib.suppress(Exception):
                            impls[name].cancel(refs, pending_only=True)
                    for i in pending:  # what we sent is known, though Slurm keeps no record of a pending task's end
                        if subs[i].ids:
                            records.write_cancel(subs[i].plan.job.launch_dir, subs[i].ids, JobState.PENDING,
                                                 by=f"the sweep's {KEY}={max_failures} stop")
                    failed = sum(is_failure(s) for s in states)
                    again = [i for i in pending if started(subs[i].plan.job.launch_dir)]
                    say(stop_line(failed, max_failures, [subs[i].plan.job.job_num for i in pending if i not in again],
                                  sweep_dir, [subs[i].plan.job.job_num for i in again]))
                return

    thread = threading.Thread(target=poll, name="automodel-sweep-policy", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
