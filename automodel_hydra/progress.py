"""Progress of a sweep while the driver waits for it: jobs submitted / pending / running / done.

:func:`sweep_progress` is a context manager around any blocking wait (``driver.execute`` wraps the backends'
``wait``). A daemon thread asks each job's backend for its state (``status(record)``, the same call as
``automodel-hydra status``) and shows the counts: a live ``rich`` bar on a terminal, otherwise one plain line each
time the counts change, so logs and Slurm output files stay readable.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import typing as tp

if tp.TYPE_CHECKING:
    from automodel_hydra.plan import Submission

#: Seconds between two polls of the job states, per backend (Slurm and SkyPilot are asked less often).
POLL_S = {"interactive": 1.0}
DEFAULT_POLL_S = 15.0


def job_states(subs: tp.Sequence[Submission]) -> list[str]:
    """Each job's state from its backend's ``status(record)``; UNKNOWN when the backend cannot tell."""
    from automodel_hydra import backends

    states = []
    for sub in subs:
        try:
            states.append(backends.get(sub.plan.backend).status(sub.record()))
        except Exception:  # noqa: BLE001  (a display must never break the wait it decorates)
            states.append("UNKNOWN")
    return states


def summarize(states: tp.Sequence[str]) -> str:
    """``"4 jobs: 1 pending, 2 running, 1 done (1 COMPLETED)"``."""
    from automodel_hydra.plan import FINISHED

    count = collections.Counter(states)
    done = {s: n for s, n in sorted(count.items()) if s in FINISHED}
    parts = [f"{count[s]} {s.lower()}" for s in ("PENDING", "RUNNING", "PREEMPTED", "UNKNOWN") if count[s]]
    parts.append(f"{sum(done.values())} done" + (f" ({', '.join(f'{n} {s}' for s, n in done.items())})" if done else ""))
    return f"{len(states)} jobs submitted: " + ", ".join(parts)


@contextlib.contextmanager
def sweep_progress(subs: tp.Sequence[Submission], *, tty: bool | None = None,
                   poll_s: float | None = None) -> tp.Iterator[None]:
    """Show the progress of ``subs`` until the block exits (a no-op for fewer than two jobs: a single job's own
    output is its progress).

    Parameters
    ----------
    subs: the submissions being waited for.
    tty: force the live rich bar (True) or plain lines (False); None = ``sys.stderr.isatty()``.
    poll_s: seconds between polls; None = :data:`POLL_S` of the first job's backend.
    """
    if len(subs) < 2:
        yield
        return
    from automodel_hydra.plan import FINISHED

    tty = sys.stderr.isatty() if tty is None else tty
    poll_s = poll_s if poll_s is not None else POLL_S.get(subs[0].plan.backend, DEFAULT_POLL_S)
    stop = threading.Event()
    progress = task = None
    if tty:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
                            TimeElapsedColumn(), console=Console(stderr=True), transient=False)
        task = progress.add_task("", total=len(subs))
        progress.start()

    last = [""]

    def show(states: list[str]) -> None:
        text = summarize(states)
        if text == last[0]:
            return
        last[0] = text
        if progress is not None:
            progress.update(task, completed=sum(s in FINISHED for s in states), description=text)
        else:
            print(f"sweep: {text}", file=sys.stderr, flush=True)

    def poll() -> None:
        while True:
            show(job_states(subs))
            if stop.wait(poll_s):
                return

    thread = threading.Thread(target=poll, name="automodel-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=poll_s + 5)
        show(job_states(subs))  # the final counts, once more
        if progress is not None:
            progress.stop()
