"""Every failure gets the right response: what ended an attempt (its *class*), and whether it is tried again.

One pure classifier, :func:`classify`, turns the evidence the launcher keeps about an attempt's end
(:class:`Evidence`: Slurm's state, a hang record, the stop signal a rank caught or the one that killed it, an exit
code, an exception's types and first lines, whether training had made progress) into a :class:`Failure`: its class
and one line of evidence. It serves both levels: a rank that raises (:func:`of_exception`, in the worker, which
then asks ``ft_launcher`` not to restart where the budget says so) and a whole attempt (:mod:`automodel_hydra.ledger`,
which reads the ranks' records, and the Slurm requeue hook :mod:`automodel_hydra.retry`).

The classes, first match wins (docs/failures.md has the table, the defaults and why):

* :data:`CANCELLED` -- a user's stop: Slurm's CANCELLED, a local cancel (``launch/cancelled``), SIGTERM/SIGINT
  with nothing else to say; never retried;
* :data:`PREEMPTED` -- Slurm's PREEMPTED, or a stop signal while ``PreemptTime`` is set;
* :data:`TIME_LIMIT` -- Slurm's TIMEOUT or DEADLINE, or the time-limit warning (SIGUSR2, ``sbatch --signal``);
* :data:`NODE_FAILURE` -- Slurm's NODE_FAIL or BOOT_FAIL; a failed health check before training
  (``HealthCheckError``, :mod:`automodel_hydra.health`);
* :data:`OOM` -- Slurm's OUT_OF_MEMORY, ``MemoryError``, ``torch.OutOfMemoryError`` (``torch.cuda.OutOfMemoryError``),
  a message with "out of memory" (``CUDA out of memory``, ``CUBLAS_STATUS_ALLOC_FAILED``);
* :data:`HANG` -- a rank without a heartbeat for ``fault_tolerance.rank_heartbeat_timeout`` (its hang record);
* :data:`COMM` -- the collectives' transport failed or a peer is gone: torch's ``DistBackendError``,
  ``DistNetworkError``, ``DistStoreError``, our ``RendezvousError`` (a peer that never arrived), and messages of
  NCCL and gloo (``NCCL error``, ``ncclInternalError``, ``Connection closed by peer``, ``Connection reset by
  peer``, ``Broken pipe``, ...);
* :data:`USER_ERROR` -- the job's own input: a config value (:class:`~automodel_hydra.schema.UserError`, OmegaConf's
  errors: an unknown key, a wrong type, an interpolation that does not resolve), code that does not import
  (``ImportError``, ``SyntaxError``), or any exception before the first optimizer step of a job that never made
  one: the same config and code fail the same way on every attempt;
* :data:`CRASH` -- any other exception, or a rank gone without a record, after progress.

An attempt of several ranks is classed by the rank whose end ended it (:func:`first_end` over each rank's
:class:`RankEnd` in :attr:`Evidence.ends`), never by a rank that only saw it: a peer's "Connection closed by peer"
is the echo of another rank's end, and the first rank to end is the cause. A rank that *returned* while
the others trained is the recipe's own doing (its data or its loop ended early on that rank): a restart repeats it,
so it is a :data:`USER_ERROR`.

The exception's causes (``__cause__``, ``__context__``) count too: Hydra's ``instantiate`` raises
``InstantiationException`` from the ``ImportError`` of a ``_target_``; an OOM wrapped in a RuntimeError is an OOM.

:class:`FailureBudget` is the ``failure_budget:`` section (retries per class); :func:`decide` says whether an attempt
that ended in a class is tried again, given the classes of the attempts before it.

This module imports only the standard library and :mod:`automodel_hydra.schema`.
"""

from __future__ import annotations

import collections
import dataclasses
import typing as tp
from pathlib import Path

from automodel_hydra.schema import UserError, require

PREEMPTED = "preempted"
TIME_LIMIT = "time_limit"
NODE_FAILURE = "node_failure"
HANG = "hang"
OOM = "oom"
COMM = "comm"
USER_ERROR = "user_error"
CRASH = "crash"
CANCELLED = "cancelled"
#: Every class, in the order :func:`classify` tries them.
CLASSES = (CANCELLED, PREEMPTED, TIME_LIMIT, NODE_FAILURE, OOM, HANG, COMM, USER_ERROR, CRASH)
#: Classes that spend no failure budget: the scheduler took the allocation away; bounded by ``slurm.max_requeues``.
NOT_SPENT = frozenset({PREEMPTED, TIME_LIMIT})
#: Classes with a budget of their own (``failure_budget.<class>``).
BUDGETED = (NODE_FAILURE, COMM, HANG, OOM, USER_ERROR, CRASH)
#: The classes whose failure a restart repeats (a budget of 0 by default, and the line says why).
REPEATS = frozenset({USER_ERROR, OOM})

#: Slurm's job state codes (squeue(1), "JOB STATE CODES") -> class.
SLURM_STATES = {"CANCELLED": CANCELLED, "PREEMPTED": PREEMPTED, "TIMEOUT": TIME_LIMIT, "DEADLINE": TIME_LIMIT,
                "NODE_FAIL": NODE_FAILURE, "BOOT_FAIL": NODE_FAILURE, "OUT_OF_MEMORY": OOM}
#: Exception types (any class in the MRO, by name) and message fragments (lower case) of each class.
_OOM_TYPES = frozenset({"MemoryError", "OutOfMemoryError"})
_OOM_TEXT = ("out of memory", "cublas_status_alloc_failed", "cuda error: out of memory")
_COMM_TYPES = frozenset({"DistBackendError", "DistNetworkError", "DistStoreError", "RendezvousError", "ConnectionError",
                         "BrokenPipeError", "ConnectionResetError", "ConnectionAbortedError"})
_COMM_TEXT = ("nccl", "gloo", "connection closed by peer", "connection reset by peer", "broken pipe",
              "socket timeout", "connection refused", "processgroup", "watchdog caught collective",
              "unhandled system error")
_INPUT_TYPES = frozenset({"ImportError", "ModuleNotFoundError", "SyntaxError", "OmegaConfBaseException"})
#: What a rank sees when a peer's process went away (lower case): gloo's "Connection closed by peer" and "Read
#: error ... Connection reset by peer" (gloo/transport/tcp/pair.cc), a write to a closed socket ("Broken pipe"),
#: NCCL's ncclRemoteError ("remote process exited or there was a network error").
_PEER_GONE_TEXT = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exit",
                   "ncclremoteerror")

#: How a rank's end is known: its end record's ``how`` (the worker's), a hang record, or nothing at all.
RETURNED, STOPPED, RAISED = "returned", "stopped", "raised"
#: A rank with a hang record (:mod:`automodel_hydra.fault_tolerance`) and no end of its own.
HUNG = "hung"
#: A rank of the attempt with neither an end nor a hang record: killed by a signal (the OOM killer, SIGKILL), or
#: its process crashed before it could write one.
GONE = "gone"


@dataclasses.dataclass(frozen=True)
class Failure:
    """A failure's class (one of :data:`CLASSES`) and its evidence, one line (``Type: message``, or what the
    scheduler or a record said)."""

    kind: str
    evidence: str

    def line(self) -> str:
        """``"user_error: ModuleNotFoundError: No module named 'x'"``."""
        return f"{self.kind}: {self.evidence}"


@dataclasses.dataclass(frozen=True)
class Error:
    """One exception of a chain: the names of its type's classes (MRO, most derived first) and its first line."""

    types: tuple[str, ...]
    line: str


@dataclasses.dataclass(frozen=True)
class RankEnd:
    """How one rank of an attempt ended.

    ``how``: :data:`RETURNED`, :data:`STOPPED` (on a signal), :data:`RAISED`, :data:`HUNG` or :data:`GONE`;
    ``time``: when, by the file server's modification time of its record (seconds; None for :data:`GONE`: no
    record, no time); ``step``: the step it reached; ``failure``: what the rank said of its own end (RAISED: the
    class and line it recorded; HUNG: the hang's description); ``node``: where it ran (None: unknown)."""

    rank: int
    how: str
    time: float | None = None
    step: int | None = None
    failure: Failure | None = None
    node: str | None = None

    @property
    def echo(self) -> bool:
        """Whether this end only says that a peer went away (a :data:`COMM` error with "Connection closed by
        peer", "Connection reset by peer", "Broken pipe", NCCL's remote error): the echo of another rank's end
        wherever another rank ended otherwise."""
        return (self.how == RAISED and self.failure is not None and self.failure.kind == COMM
                and any(t in self.failure.evidence.lower() for t in _PEER_GONE_TEXT))

    def describe(self, everyone_returned: bool = False) -> str:
        """``"rank 1 returned at step 3 while the others trained"``, ``"rank 0: RuntimeError: ..."``, ``"rank 1
        stopped at step 4 on a signal"``, ``"rank 1 ended without a record (...)"``, a hang's description."""
        at = f" at step {self.step}" if self.step is not None else ""
        if self.how == RETURNED:
            return f"rank {self.rank} returned{at}" + ("" if everyone_returned else " while the others trained")
        if self.how == STOPPED:
            return f"rank {self.rank} stopped{at} on a signal"
        if self.how == GONE:
            return f"rank {self.rank} ended without a record (killed by a signal, or its process crashed)"
        if self.how == HUNG:
            return self.failure.evidence if self.failure else f"rank {self.rank} hung{at}"
        return f"rank {self.rank}: {self.failure.evidence if self.failure else 'an error'}"


#: Within one modification time (a file server's clock ticks coarsely), which end is taken first.
_TIE = {RAISED: 0, RETURNED: 1, HUNG: 2, STOPPED: 3}


def first_end(ends: tp.Sequence[RankEnd]) -> RankEnd | None:
    """The rank whose end ended the attempt, from every rank's end (one per rank; a rank without any record is
    :data:`GONE`); None when every rank returned (the attempt completed) or nothing is known. Pure.

    * an :attr:`~RankEnd.echo` (a peer gone) is never the cause while another rank ended otherwise: it saw that
      end; where every end is an echo, the first is (the transport failed under all of them);
    * of the others, the first by ``time`` (ties: a raise, then a return, a hang, a stop; then the lower rank): a
      rank that returned while the others trained, raised, hung, or was stopped by a signal first is the cause,
      and what the others did came after it (an agent stops the whole group once one rank ended);
    * a rank :data:`GONE` without a record has no time: it is the cause over returns and stops, never over a rank
      that raised or hung (the agent kills the rest of a failed group, and a rank killed then leaves no record).
    """
    if not ends or all(e.how == RETURNED for e in ends):
        return None
    real = [e for e in ends if not e.echo] or list(ends)
    timed = sorted((e for e in real if e.how != GONE),
                   key=lambda e: (e.time if e.time is not None else 0.0, _TIE.get(e.how, 9), e.rank))
    gone = [e for e in real if e.how == GONE]
    if gone and not any(e.how in (RAISED, HUNG) for e in timed):
        return min(gone, key=lambda e: e.rank)
    return timed[0] if timed else None


@dataclasses.dataclass(frozen=True)
class Evidence:
    """What is known about how an attempt (or a rank) ended; every field optional.

    ``slurm_state``: sacct's state of the attempt (``NODE_FAIL``, ...); ``cancelled``: a user's cancel is recorded
    (``launch/cancelled``); ``preempting``: Slurm had selected the job for preemption (``PreemptTime``); ``hang``: a
    hang record's description; ``signal``: the stop signal a rank caught (``SIGUSR2``, ``SIGTERM``) or the one that
    killed it (``SIGKILL``); ``exit_code``: a process's exit status; ``errors``: the exception and its causes,
    outermost first; ``progressed``: the job had completed an optimizer step (in this attempt or one before);
    ``detail``: what the attempt's records say in one line, used as the evidence where no exception is quoted;
    ``ends``: how each rank of an attempt ended (:class:`RankEnd`): the rank that ended first classes the attempt
    (:func:`first_end`)."""

    slurm_state: str | None = None
    cancelled: bool = False
    preempting: bool = False
    hang: str | None = None
    signal: str | None = None
    exit_code: int | None = None
    errors: tuple[Error, ...] = ()
    progressed: bool = True
    detail: str | None = None
    ends: tuple[RankEnd, ...] = ()


def _has(errors: tp.Sequence[Error], types: frozenset[str], text: tp.Sequence[str]) -> Error | None:
    for e in errors:
        if types.intersection(e.types) or any(t in e.line.lower() for t in text):
            return e
    return None


def classify(ev: Evidence) -> Failure:
    """The class of an attempt's (or a rank's) end and its evidence line, by the rules of the module docstring,
    first match wins. Pure."""
    said = ev.detail
    state = (ev.slurm_state or "").upper()
    if ev.cancelled or SLURM_STATES.get(state) == CANCELLED:
        return Failure(CANCELLED, said or ("cancelled by the user" if ev.cancelled else f"Slurm state {state}"))
    if SLURM_STATES.get(state) == PREEMPTED or (ev.preempting and ev.signal in ("SIGTERM", "SIGUSR2")):
        return Failure(PREEMPTED, f"Slurm state {state}" if state else f"{ev.signal} while PreemptTime is set")
    if SLURM_STATES.get(state) == TIME_LIMIT or ev.signal == "SIGUSR2":
        return Failure(TIME_LIMIT, f"Slurm state {state}" if state else "SIGUSR2: the time-limit warning")
    if state in SLURM_STATES:
        return Failure(SLURM_STATES[state], f"Slurm state {state}" + (f" ({said})" if said else ""))
    found = next((e for e in ev.errors if "HealthCheckError" in e.types), None)
    if found is not None:  # the health check before training (automodel_hydra.health) blames a node
        return Failure(NODE_FAILURE, found.line)
    found = _has(ev.errors, _OOM_TYPES, _OOM_TEXT)
    if found is not None:
        return Failure(OOM, found.line)
    if ev.hang:
        return Failure(HANG, ev.hang)
    cause = first_end(ev.ends)
    if cause is not None and cause.how != STOPPED:  # a stop on a signal: the signal's rules below
        return _of_end(cause)
    # an input error anywhere in the chain decides before a transport word in a wrapper's message
    found = next((e for e in ev.errors if _INPUT_TYPES.intersection(e.types) or "UserError" in e.types), None)
    if found is not None:
        return Failure(USER_ERROR, found.line)
    found = _has(ev.errors, _COMM_TYPES, _COMM_TEXT)
    if found is not None:
        return Failure(COMM, found.line)
    if ev.errors:
        first = ev.errors[0].line
        if not ev.progressed:
            return Failure(USER_ERROR, f"{first} (before the first optimizer step)")
        return Failure(CRASH, first)
    if ev.signal in ("SIGTERM", "SIGINT"):
        return Failure(CANCELLED, said or f"{ev.signal}: stopped by someone else")
    if ev.signal or ev.exit_code:
        how = f"killed by {ev.signal}" if ev.signal else f"exit code {ev.exit_code}"
        return Failure(CRASH, said or how)
    return Failure(CRASH, said or "ended without a record")


def _of_end(cause: RankEnd) -> Failure:
    """The attempt's failure when ``cause`` ended first (:func:`first_end`): a rank's own exception keeps the class
    the rank gave it; a rank that returned while the others trained is the recipe's doing, which a restart repeats
    (:data:`USER_ERROR`); a hang is a :data:`HANG`; a rank gone without a record a :data:`CRASH`."""
    if cause.how == RAISED:
        return Failure(cause.failure.kind if cause.failure else CRASH, cause.describe())
    if cause.how == RETURNED:
        return Failure(USER_ERROR, cause.describe())
    if cause.how == HUNG:
        return Failure(HANG, cause.describe())
    return Failure(CRASH, cause.describe())


def _first_line(error: BaseException) -> str:
    text = next((line.strip() for line in str(error).splitlines() if line.strip()), "")
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def chain(error: BaseException) -> tuple[Error, ...]:
    """``error`` and its causes (``__cause__``, else ``__context__``), outermost first, as :class:`Error`s. Our
    :class:`~automodel_hydra.schema.UserError` is named ``UserError`` whatever its subclass."""
    seen: set[int] = set()
    out: list[Error] = []
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        types = tuple(c.__name__ for c in type(current).__mro__)
        if isinstance(current, UserError):
            types += ("UserError",)
        out.append(Error(types, _first_line(current)))
        current = current.__cause__ or current.__context__
    return tuple(out)


def of_exception(error: BaseException, progressed: bool = True) -> Failure:
    """The failure a rank saw when ``error`` ended it (:func:`classify` of its chain); ``progressed``: whether the
    job had completed an optimizer step before."""
    return classify(Evidence(errors=chain(error), progressed=progressed))


def restart_repeats(failure: Failure) -> bool:
    """Whether restarting the job would only repeat ``failure`` (its class is in :data:`REPEATS`)."""
    return failure.kind in REPEATS


# ----------------------------------------------------------------------------------------------- budgets


@dataclasses.dataclass
class FailureBudget:
    """Retries per failure class (``failure_budget:``), for in-job restarts (``ft_launcher``) and Slurm requeues
    alike: an attempt that ended in class C is tried again while fewer than ``C`` attempts before it ended so.
    preempted and time_limit spend none (``slurm.max_requeues`` bounds them); cancelled is never retried.
    docs/failures.md has why each default."""

    # a node died or never booted (Slurm NODE_FAIL/BOOT_FAIL): another node, or the same one rebooted, may work
    node_failure: int = 3
    # NCCL/gloo errors, a peer gone: links flap, switches reboot
    comm: int = 3
    # a rank without a heartbeat (fault_tolerance): often a flaky node or a stuck collective
    hang: int = 3
    # out of memory: the same batch on the same GPUs runs out again
    oom: int = 0
    # config, import or interpolation errors, or any exception before the first optimizer step
    user_error: int = 0
    # any other exception after progress: once, in case it was transient
    crash: int = 1

    def __post_init__(self) -> None:
        for name in BUDGETED:
            value = getattr(self, name)
            require(isinstance(value, int) and not isinstance(value, bool) and value >= 0,
                    f"failure_budget.{name}", value, "a number of retries, an integer >= 0")

    def retries(self, kind: str) -> int | None:
        """The retries of class ``kind``; None for a class bounded by nothing here (:data:`NOT_SPENT`); 0 for
        cancelled."""
        if kind in NOT_SPENT:
            return None
        return int(getattr(self, kind)) if kind in BUDGETED else 0

    @classmethod
    def of(cls, section: tp.Mapping[str, tp.Any] | None) -> FailureBudget:
        """From a plain mapping (``launch/job.yaml``'s ``failure_budget``); missing keys keep their defaults."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in (section or {}).items() if k in known})

    @classmethod
    def of_job(cls, launch: Path) -> FailureBudget:
        """The job's budget: ``failure_budget`` of its rank-side spec (``launch/job.yaml``); the defaults when the
        spec cannot be read. What both deciders read: a rank under ``ft_launcher`` and the Slurm requeue hook."""
        import yaml

        from automodel_hydra.plan import JOB_FILE

        try:
            spec = yaml.safe_load((Path(launch) / JOB_FILE).read_text())
        except (OSError, yaml.YAMLError):
            spec = None
        return cls.of(spec.get("failure_budget") if isinstance(spec, dict) else None)


@dataclasses.dataclass(frozen=True)
class Decision:
    """Whether an attempt is tried again, and the one line that says why."""

    retry: bool
    why: str


def decide(failure: Failure, before: tp.Sequence[str], budget: FailureBudget) -> Decision:
    """Whether the attempt that ended in ``failure`` is tried again (an in-job restart or a requeue): ``before``
    holds the classes of the job's earlier failed attempts of this launch (every level: restarts and requeues).
    Pure; the overall bound (``fault_tolerance.max_restarts``, ``slurm.max_requeues``) is the caller's."""
    kind = failure.kind
    if kind == CANCELLED:
        return Decision(False, "not retried: cancelled")
    allowed = budget.retries(kind)
    if allowed is None:
        return Decision(True, f"retried: {kind} spends no failure budget (slurm.max_requeues bounds it)")
    spent = collections.Counter(before)[kind]
    if allowed == 0 and kind in REPEATS:
        return Decision(False, f"not retried: a restart repeats it ({kind}; failure_budget.{kind}=0)")
    if spent >= allowed:
        return Decision(False, f"not retried: failure_budget.{kind}={allowed} spent ({spent} {kind} attempt"
                               f"{'s' if spent != 1 else ''} before)")
    return Decision(True, f"retried: {kind} {spent + 1} of failure_budget.{kind}={allowed}")
