"""Progress of a sweep while the driver waits for it: jobs submitted / pending / running / done.

:func:`sweep_progress` is a context manager around any blocking wait (``driver.execute`` wraps the backends'
``wait``). A daemon thread asks each job's backend for its state (:func:`backend_states`, the same call as
``automodel-hydra status``) and shows the counts: a live ``rich`` bar on a terminal, otherwise one plain line each
time the counts change, so logs and Slurm output files stay readable. Polls are spaced so that asking the scheduler
takes at most a fifth of the time.
"""

from __future__ import annotations

import collections
import contextlib
import sys
import threading
import time
import typing as tp
from pathlib import Path

from automodel_hydra.states import JobState, StateInfo

if tp.TYPE_CHECKING:
    from automodel_hydra.plan import Submission

#: Seconds between two polls of the job states, unless the caller gives its backends'
#: (:attr:`automodel_hydra.plan.Backend.poll_s`: a scheduler is asked less often than local processes).
DEFAULT_POLL_S = 15.0


def backend_states(records: tp.Sequence[dict[str, tp.Any]]) -> list[StateInfo]:
    """The state of each submission record, from the record's backend: one ``states`` call per backend (one
    sacct call for a whole Slurm array), read through what the job's ranks did
    (:func:`automodel_hydra.outcome.state_info`: no result, no COMPLETED, whatever ``sacct`` says). A state the
    backend cannot give is UNKNOWN with the reason; never an error. What the jobs that ended wrote where they ran
    (a ``slurm.tunnel`` job's login node) is copied back first (``Backend.fetch_results``), so that a resume or a
    report reads their results, not their absence."""
    from automodel_hydra import backends, outcome

    out = [StateInfo(JobState.UNKNOWN)] * len(records)
    by_backend: dict[str, list[int]] = {}
    for i, rec in enumerate(records):
        by_backend.setdefault(rec["backend"], []).append(i)
    for name, idx in by_backend.items():
        try:
            impl = backends.get(name)
            refs = [impl.ref_from_record(records[i]) for i in idx]
            infos = impl.states(refs)
            # what ended elsewhere (a slurm.tunnel job's login node) is copied back first: its result decides
            impl.fetch_results([(ref, Path(records[i]["job_dir"]), records[i].get("log_path"))
                                for ref, i, info in zip(refs, idx, infos) if info.state.final])
            write = getattr(impl, "ranks_write_job_dir", False)  # (a backend of ours says; another's states stand)
            infos = [outcome.state_info(records[i], info, write) for i, info in zip(idx, infos)]
        except Exception as e:
            infos = [StateInfo(JobState.UNKNOWN, f"{type(e).__name__}: {e}".splitlines()[0][:160], False)] * len(idx)
        for i, info in zip(idx, infos):
            out[i] = info
    return out


def job_states(subs: tp.Sequence[Submission[tp.Any]]) -> list[JobState]:
    """Each submitted job's state (see :func:`backend_states`)."""
    return [info.state for info in backend_states([s.record() for s in subs])]


def summarize(states: tp.Sequence[JobState]) -> str:
    """``"4 jobs submitted: 1 pending, 2 running, 1 done (1 COMPLETED)"``."""
    count = collections.Counter(states)
    done = {s.value: n for s, n in sorted(count.items(), key=lambda kv: kv[0].value) if s.final}
    parts = [f"{count[s]} {s.value.lower()}" for s in (JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN)
             if count[s]]
    parts.append(f"{sum(done.values())} done"
                 + (f" ({', '.join(f'{n} {s}' for s, n in done.items())})" if done else ""))
    return f"{len(states)} jobs submitted: " + ", ".join(parts)


def last_line(sweep_dir: str | Path, states: tp.Sequence[JobState | None]) -> str | None:
    """The sweep's last line: its dir, what became of its jobs and the command that reports on them, e.g.
    ``sweep multirun/S: 3 COMPLETED, 1 FAILED; automodel-hydra report multirun/S`` (``states``: each submitted
    job's final state, None for one that was not waited for: ``slurm.detach``). None when no job was submitted
    (a dry run)."""
    if not states:
        return None
    done = collections.Counter(s for s in states if s is not None)
    left = sum(s is None for s in states)
    parts = [f"{n} {s.value}" for s, n in done.most_common()] + ([f"{left} submitted"] if left else [])
    follow = f"automodel-hydra status {sweep_dir}; " if left else ""
    return f"sweep {sweep_dir}: {', '.join(parts)}; {follow}automodel-hydra report {sweep_dir}"


@contextlib.contextmanager
def sweep_progress(subs: tp.Sequence[Submission[tp.Any]], *, tty: bool | None = None,
                   poll_s: float | None = None) -> tp.Iterator[None]:
    """Show the progress of ``subs`` until the block exits (a no-op for fewer than two jobs: a single job's own
    output is its progress).

    Parameters
    ----------
    subs: the submissions being waited for.
    tty: force the live rich bar (True) or plain lines (False); None = ``sys.stderr.isatty()``.
    poll_s: seconds between polls (at least 4x the time a poll took); None = :data:`DEFAULT_POLL_S` (the driver
        gives its backends' :attr:`~automodel_hydra.plan.Backend.poll_s`).
    """
    if len(subs) < 2:
        yield
        return
    tty = sys.stderr.isatty() if tty is None else tty
    poll_s = poll_s if poll_s is not None else DEFAULT_POLL_S
    stop = threading.Event()
    progress = task = None
    if tty:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        progress = Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.description}"), TimeElapsedColumn(), console=Console(stderr=True),
                            transient=False)
        task = progress.add_task("", total=len(subs))
        progress.start()

    last = [""]

    def show(states: list[JobState]) -> None:
        text = summarize(states)
        if text == last[0]:
            return
        last[0] = text
        if progress is not None and task is not None:
            progress.update(task, completed=sum(s.final for s in states), description=text)
        else:
            print(f"sweep: {text}", file=sys.stderr, flush=True)

    def poll() -> None:
        while True:
            start = time.monotonic()
            show(job_states(subs))
            if stop.wait(max(poll_s, 4 * (time.monotonic() - start))):
                return

    thread = threading.Thread(target=poll, name="automodel-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)
        if not thread.is_alive():  # the final counts, unless the scheduler is slow to answer
            show(job_states(subs))
        if progress is not None:
            progress.stop()
