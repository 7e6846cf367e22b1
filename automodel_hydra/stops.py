"""Stopping what a launch started: the signal rules of the launching command and the bounded stop of a local job.

The rules (the table is in docs/architecture.md, "Stopping"):

* The launching command (``python train.py``, ``-m`` sweeps) turns the first SIGINT (Ctrl-C: a terminal sends it
  to the whole foreground process group; ``kill -INT PID``, ``timeout -s INT`` send it to the pid alone), SIGTERM
  or SIGHUP into :class:`StopRequested` while it waits (:func:`stop_signals`). Local jobs run in sessions of their
  own, so a terminal's Ctrl-C reaches only the launcher either way, and the launcher decides what is stopped.
* A local job is stopped by :func:`stop_group`: SIGTERM to its ranks (they checkpoint at the next step boundary),
  then at most ``grace_s`` seconds (``interactive.kill_wait_s``, default 30 s: Slurm's ``KillWait`` default, the
  same bound a cluster gives) for the job's processes to end, then SIGKILL to every process that is left: the
  group's head (torchrun, or whatever launcher heads it), every process below it and their process groups. A
  rank blocked in a collective or hung inside its step never reads its stop flag; the kill is what ends it.
* A second signal while a stop is under way ends the grace time at once (:data:`HURRY`).

Nothing here knows which launcher process heads a job's group: the head is a pid, its ranks are the processes
below it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import threading
import time
import typing as tp
from pathlib import Path

log = logging.getLogger(__name__)

#: Seconds a stopped local job's ranks get to checkpoint and exit before what is left is killed (the default of
#: ``interactive.kill_wait_s``: slurm.conf(5) ``KillWait`` defaults to 30 s, the bound a Slurm job gets).
DEFAULT_KILL_WAIT_S = 30.0

#: Set by a second stop signal while a stop is under way: skip the rest of the grace time.
HURRY = threading.Event()

#: The signals that stop a launching command: every one asks the ranks to checkpoint first (the table above).
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def exit_status(signum: int) -> int:
    """Exit status of a launching command stopped by signal ``signum``: 128 + its number, as a shell reports a
    process killed by it (SIGINT: 130, SIGTERM: 143)."""
    return 128 + signum


#: A launching command stopped as Ctrl-C stops it (also when its jobs were cancelled from elsewhere): 130.
CTRL_C_EXIT = exit_status(signal.SIGINT)


class StopRequested(BaseException):
    """The launching command got a stop signal while it waited (:func:`stop_signals`). A BaseException, like the
    KeyboardInterrupt it stands for, so no ``except Exception`` between the wait and the driver swallows it.

    ``signum``: the signal; ``results``: what a backend that stopped its jobs found (job dir -> its JobResult),
    filled in on the way up."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.results: dict[str, tp.Any] = {}

    @property
    def how(self) -> str:
        """``Ctrl-C`` for SIGINT, else the signal's name (``SIGTERM``)."""
        return "Ctrl-C" if self.signum == signal.SIGINT else signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return exit_status(self.signum)


def as_stop(error: BaseException) -> StopRequested:
    """``error`` (a StopRequested, or the KeyboardInterrupt Python raised for SIGINT) as a StopRequested."""
    return error if isinstance(error, StopRequested) else StopRequested(signal.SIGINT)


@contextlib.contextmanager
def stop_signals() -> tp.Iterator[None]:
    """While the block runs (in the main thread): the first SIGINT, SIGTERM or SIGHUP raises
    :class:`StopRequested`; later ones set :data:`HURRY` (end the grace time now) instead of interrupting the stop.
    Python's default SIGTERM/SIGHUP action would kill this process at once and leave the jobs unattended. A signal
    this process inherited as ignored (``nohup``, a shell's background job ignores SIGINT) stays ignored. Elsewhere
    than the main thread, a no-op."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    fired: list[int] = []
    HURRY.clear()

    def handler(signum: int, frame: object) -> None:
        if fired:
            if not HURRY.is_set():
                log.warning("caught %s again: ending what is left now", signal.Signals(signum).name)
            HURRY.set()
            return
        fired.append(signum)
        raise StopRequested(signum)

    old: dict[signal.Signals, tp.Any] = {}
    for s in STOP_SIGNALS:
        current = signal.getsignal(s)
        if current is not signal.SIG_IGN:
            old[s] = signal.signal(s, handler)
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


# ----------------------------------------------------------------------------------------------- processes


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux ``/proc/PID/task/*/children``)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError, ValueError):
            out += [int(c) for c in (task / "children").read_text().split()]
    return out


def tree(pid: int) -> list[int]:
    """Every process below ``pid``, parents before their children."""
    out, todo = [], [pid]
    while todo:
        kids = children(todo.pop(0))
        out += kids
        todo += kids
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended and not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def describe(pid: int) -> str:
    """``rank 1 (pid 123)`` for a rank (its ``RANK``), else ``<program> (pid 123)``: ``torchrun``, ``python``."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    words = [a.decode(errors="replace") for a in argv if a]
    rank = None
    with contextlib.suppress(OSError):
        for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
            if item.startswith(b"RANK="):
                rank = item[5:].decode(errors="replace")
    if "automodel_hydra.worker" in words and rank is not None:
        return f"rank {rank} (pid {pid})"
    if "torch.distributed.run" in words or any(w.endswith("/torchrun") for w in words[:2]):
        return f"torchrun (pid {pid})"
    name = next((w for w in words if not w.startswith("-")), "?").rsplit("/", 1)[-1]
    if len(words) > 2 and words[1] == "-m":
        name = words[2]
    if name == "automodel_hydra.agent" and len(words) > 4:  # the agent it runs: torchrun, ft_launcher
        name = words[4]
    return f"{name} (pid {pid})"


@dataclasses.dataclass
class Ended:
    """What :func:`stop_group` did: ``killed`` names each process it had to SIGKILL after the grace time (empty:
    everything ended by itself), ``left`` each one still there after the kill (a process in uninterruptible
    sleep), ``grace_s`` the grace time it gave."""

    grace_s: float
    killed: list[str] = dataclasses.field(default_factory=list)
    left: list[str] = dataclasses.field(default_factory=list)

    def text(self) -> str:
        """``ended within the 30 s grace time`` / ``killed after 30 s: rank 1 (pid 12), ...`` / ``...; still
        running after SIGKILL: ...``."""
        if not self.killed and not self.left:
            return f"ended within the {self.grace_s:g} s grace time"
        parts = []
        if self.killed:
            parts.append(f"killed after {self.grace_s:g} s: {', '.join(self.killed)}")
        if self.left:
            parts.append(f"still running after SIGKILL: {', '.join(self.left)}")
        return "; ".join(parts)


def signal_ranks(head: int, signum: int = signal.SIGTERM, *, head_is_rank: bool = False) -> None:
    """Send ``signum`` to the ranks of the job headed by ``head``: its child processes (torchrun and ft_launcher
    start each rank in a session of its own, so the head's process group does not hold them). Signalling the
    ranks, not the head, lets each checkpoint and end cleanly, and the head exit by itself without the traceback
    torchrun prints when it is signalled. ``head_is_rank`` (a call job, one process), or no child found: the
    head's process group instead. A child with the head's own command line is a forked helper, not a rank
    (ft_launcher's rank monitors, which the head ends itself: signalled, they die and the ranks' heartbeats fail
    mid-checkpoint), and is left to the head."""
    head_argv = _cmdline(head)
    kids = [] if head_is_rank else [pid for pid in children(head) if _cmdline(pid) != head_argv]
    for pid in kids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    if not kids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(head, signum)


def _cmdline(pid: int) -> bytes | None:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None


def kill_all(head: int, known: tp.Iterable[int] = ()) -> list[int]:
    """SIGKILL ``head``, every process below it now, ``known`` (processes seen below it earlier that may have been
    orphaned since) and the process group each of them leads (a rank's data-loader workers). Returns the pids that
    were alive and were signalled, head first."""
    pids = list(dict.fromkeys([head, *tree(head), *known]))
    hit = []
    for pid in pids:
        if not alive(pid):
            continue
        hit.append(pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if os.getpgid(pid) == pid:
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return hit


def stop_group(head: int, grace_s: float, *, head_is_rank: bool = False,
               ended: tp.Callable[[], bool] | None = None, hurry: threading.Event = HURRY,
               on_kill: tp.Callable[[Ended], None] | None = None, poll_s: float = 0.1) -> Ended:
    """Stop the job headed by pid ``head``: SIGTERM its ranks (:func:`signal_ranks`), wait at most ``grace_s``
    seconds (less when ``hurry`` is set) for the head and every process seen below it to be gone (and for
    ``ended()``, when given: the caller's own view, e.g. its ``Popen.poll``), then SIGKILL what is left
    (:func:`kill_all`) and wait up to 10 s more for it to go. ``on_kill(ended)`` is called just before the kill
    with what is about to be killed (so that a record of it exists before anyone sees the job end).

    Returns an :class:`Ended` naming what had to be killed (``rank 1 (pid 123)``, ``torchrun (pid 120)``)."""
    seen = set(tree(head))
    names = {pid: describe(pid) for pid in [head, *seen]}

    def gone() -> bool:
        return not alive(head) and not any(alive(p) for p in seen)

    def finished() -> bool:
        return (ended is None or ended()) and gone()

    signal_ranks(head, head_is_rank=head_is_rank)
    deadline = time.monotonic() + grace_s
    while not finished() and time.monotonic() < deadline and not hurry.is_set():
        now = set(tree(head)) - seen  # a rank started during the stop (a restart) is the job's too
        for pid in now:
            names[pid] = describe(pid)
        seen |= now
        time.sleep(poll_s)
    result = Ended(grace_s)
    if finished():
        return result
    for pid in [head, *tree(head), *seen]:
        names.setdefault(pid, describe(pid))
    doomed = [p for p in dict.fromkeys([head, *tree(head), *seen]) if alive(p)]
    result.killed = [names[p] for p in doomed]
    if on_kill is not None:
        on_kill(result)
    hit = kill_all(head, seen)
    result.killed = [names.get(p, f"pid {p}") for p in dict.fromkeys([*doomed, *hit])]
    log.warning("the job's processes did not end within %g s of the stop signal: killed %s", grace_s,
                ", ".join(result.killed))
    until = time.monotonic() + 10
    while time.monotonic() < until and any(alive(p) for p in hit):
        time.sleep(poll_s)
    result.left = [names.get(p, f"pid {p}") for p in hit if alive(p)]
    return result
