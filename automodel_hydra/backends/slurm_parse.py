"""Job states of the Slurm backend: submitit's ``SlurmJob`` with a watcher that also works without accounting.

submitit asks ``sacct`` for the state of every registered job in one call (``SlurmInfoWatcher``). On a cluster
without accounting ``sacct`` fails ("Slurm accounting storage is disabled") and submitit would report UNKNOWN for
ever; :class:`Watcher` then asks ``squeue --states=all``, which lists finished jobs too for MinJobAge seconds
(slurm.conf(5)), and is honest (UNKNOWN) after that. Both outputs are read by submitit's own ``read_info``, which
understands array ids (``123_4``, ``123_[0-9%2]``).
"""

from __future__ import annotations

import subprocess
import time
import typing as tp

from submitit.slurm.slurm import SlurmInfoWatcher, SlurmJob

#: Slurm job states (squeue(1)/sacct(1) "JOB STATE CODES") -> the backend-neutral names of ``plan.STATES``.
_STATE_MAP = {
    "COMPLETING": "RUNNING", "CONFIGURING": "PENDING", "REQUEUED": "PENDING", "REQUEUE_HOLD": "PENDING",
    "REQUEUE_FED": "PENDING", "RESV_DEL_HOLD": "PENDING", "RESIZING": "RUNNING", "SUSPENDED": "RUNNING",
    "STOPPED": "RUNNING", "SIGNALING": "RUNNING", "STAGE_OUT": "RUNNING", "OUT_OF_MEMORY": "FAILED",
    "NODE_FAIL": "FAILED", "BOOT_FAIL": "FAILED", "DEADLINE": "TIMEOUT", "SPECIAL_EXIT": "FAILED",
    "REVOKED": "CANCELLED",
}
_NAMES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "UNKNOWN")


def normalize_state(state: str) -> str:
    """``"CANCELLED by 0"`` -> ``CANCELLED``, ``OUT_OF_MEMORY`` -> ``FAILED``, ``""`` -> ``UNKNOWN``: one of
    ``plan.STATES``."""
    word = (state or "UNKNOWN").split()[0].rstrip("+").upper()
    word = _STATE_MAP.get(word, word)
    return word if word in _NAMES else "UNKNOWN"


def squeue_states(main_ids: tp.Iterable[str]) -> str:
    """``squeue`` output for these job ids in ``sacct --parsable2`` form (``JobID|State`` header); "" on error."""
    ids = ",".join(sorted(set(main_ids)))
    if not ids:
        return ""
    try:
        out = subprocess.run(["squeue", "--noheader", "--states=all", "--format=%i|%T", f"--jobs={ids}"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return "JobID|State\n" + out.stdout if out.returncode == 0 else ""


class Watcher(SlurmInfoWatcher):
    """submitit's sacct watcher (one call for all registered jobs); jobs sacct does not know, or all jobs when
    sacct fails, are looked up with squeue."""

    def update(self) -> None:
        command = self._make_command()
        if command is None:
            return
        self._num_calls += 1
        try:
            out = subprocess.run(command, capture_output=True, text=True, timeout=60)
            info = self.read_info(out.stdout) if out.returncode == 0 else {}
        except (OSError, subprocess.SubprocessError):
            info = {}
        # issue 6: per registered id, not per main id: right after sbatch, sacct may list only the array's main
        # record ("21|PENDING") while squeue already shows "21_0|RUNNING"
        missing = {x.split("_")[0] for x in self._registered - self._finished if x not in info}
        if missing:
            info.update({k: v for k, v in self.read_info(squeue_states(missing)).items() if k not in info})
        self._info_dict.update(info)
        self._last_status_check = time.time()
        for job_id in self._registered - self._finished:
            if self.is_done(job_id, mode="cache"):
                self._finished.add(job_id)


class AutomodelSlurmJob(SlurmJob[tp.Any]):
    """A submitit SlurmJob whose state comes from :class:`Watcher` (sacct, else squeue). ``cancel()`` is
    submitit's (``scancel``). There is no result pickle: results are ``<job dir>/result.json``."""

    watcher = Watcher(delay_s=60)
