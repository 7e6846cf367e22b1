"""One job-state vocabulary for the whole product: Slurm's documented job state codes.

Every backend reports its jobs in these names (``automodel-hydra status``, sweep progress, ``slurm.wait``): Slurm
states as Slurm reports them, SkyPilot's and the local runner's mapped onto the nearest Slurm state by their own
backend. The names and meanings are those of squeue(1) and sacct(1), section "JOB STATE CODES".
"""

from __future__ import annotations

import dataclasses
import enum


class JobState(str, enum.Enum):
    """A job's state, named as Slurm names it (squeue(1), "JOB STATE CODES").

    Transient Slurm states fold into the state a user waits on: CONFIGURING and the requeue states
    (REQUEUED, REQUEUE_HOLD, REQUEUE_FED) are PENDING (the job will run again); COMPLETING, SIGNALING,
    STAGE_OUT, RESIZING, SUSPENDED and STOPPED are RUNNING (it holds its nodes). Everything else keeps its
    Slurm name; a state no tool could tell is UNKNOWN, never a guess.
    """

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    TIMEOUT = "TIMEOUT"
    PREEMPTED = "PREEMPTED"
    NODE_FAIL = "NODE_FAIL"
    BOOT_FAIL = "BOOT_FAIL"
    DEADLINE = "DEADLINE"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    UNKNOWN = "UNKNOWN"

    @property
    def final(self) -> bool:
        """Whether the job will never run again: every state but PENDING, RUNNING and UNKNOWN.

        PREEMPTED is final: Slurm reports it only for a job it did not requeue (PreemptMode=CANCEL); a job
        preempted under PreemptMode=REQUEUE is reported REQUEUED, then PENDING (slurm.conf(5), PreemptMode)."""
        return self not in (JobState.PENDING, JobState.RUNNING, JobState.UNKNOWN)

    @property
    def ok(self) -> bool:
        return self is JobState.COMPLETED

    @classmethod
    def from_slurm(cls, text: str | None) -> JobState:
        """A state as ``sacct``/``squeue`` print it: ``"CANCELLED by 0"`` -> CANCELLED, ``"REQUEUED"`` ->
        PENDING, ``"COMPLETING"`` -> RUNNING, ``""`` or an unknown word -> UNKNOWN."""
        word = (text or "").split()[0].rstrip("+").upper() if (text or "").strip() else ""
        word = _SLURM_ALIASES.get(word, word)
        try:
            return cls(word)
        except ValueError:
            return cls.UNKNOWN


#: Slurm's transient or site-specific codes -> the state a user waits on (squeue(1), "JOB STATE CODES").
_SLURM_ALIASES = {
    "CONFIGURING": "PENDING", "REQUEUED": "PENDING", "REQUEUE_HOLD": "PENDING", "REQUEUE_FED": "PENDING",
    "RESV_DEL_HOLD": "PENDING", "SPECIAL_EXIT": "PENDING",
    "COMPLETING": "RUNNING", "SIGNALING": "RUNNING", "STAGE_OUT": "RUNNING", "RESIZING": "RUNNING",
    "SUSPENDED": "RUNNING", "STOPPED": "RUNNING",
    "REVOKED": "CANCELLED",
    # two-letter compact codes (squeue %t)
    "PD": "PENDING", "R": "RUNNING", "CG": "RUNNING", "CD": "COMPLETED", "F": "FAILED", "CA": "CANCELLED",
    "TO": "TIMEOUT", "PR": "PREEMPTED", "NF": "NODE_FAIL", "BF": "BOOT_FAIL", "DL": "DEADLINE",
    "OOM": "OUT_OF_MEMORY", "CF": "PENDING", "RQ": "PENDING", "RH": "PENDING", "S": "RUNNING", "ST": "RUNNING",
}


@dataclasses.dataclass(frozen=True)
class StateInfo:
    """A job's state and, where the scheduler gives one, why it is in it (squeue's REASON for a pending job)."""

    state: JobState
    reason: str = ""
    #: False: the scheduler could not be asked (``reason`` says why); the state is what the job's records know
    answered: bool = True
