"""Job states from Slurm: one ``sacct`` call for any number of jobs, ``squeue`` for the ones it does not know.

On a cluster without accounting ``sacct`` fails ("Slurm accounting storage is disabled"); ``squeue --states=all``
then answers, and lists finished jobs too for MinJobAge seconds (slurm.conf(5)); after that a job is UNKNOWN.
"""

from __future__ import annotations

import subprocess
import typing as tp

from automodel_hydra.states import JobState, StateInfo


def _run(argv: list[str]) -> str:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout if out.returncode == 0 else ""


def _parse(text: str, found: dict[str, StateInfo]) -> None:
    """``JOBID|STATE|REASON`` lines; array ranges (``123_[0-3%2]``) stand for each of their tasks."""
    for line in text.splitlines():
        parts = line.strip().split("|")
        if len(parts) < 2 or not parts[0]:
            continue
        job_id, state = parts[0], JobState.from_slurm(parts[1])
        reason = parts[2].strip() if len(parts) > 2 and parts[2].strip() not in ("None", "") else ""
        found.setdefault(job_id, StateInfo(state, reason if state is JobState.PENDING else ""))


def query(ids: tp.Sequence[str]) -> dict[str, StateInfo]:
    """State of each job id (``123`` or array task ``123_4``): one ``sacct`` call, then one ``squeue`` call for
    the ids sacct does not know. Ids neither knows are missing from the result."""
    ids = sorted(set(ids))
    if not ids:
        return {}
    found: dict[str, StateInfo] = {}
    _parse(_run(["sacct", "-X", "--noheader", "--parsable2", "--format=JobID,State,Reason", f"--jobs={','.join(ids)}"]),
           found)
    missing = {i.split("_")[0] for i in ids if i not in found}
    if missing:
        _parse(_run(["squeue", "--noheader", "--states=all", "--array", "--format=%i|%T|%r",
                     f"--jobs={','.join(sorted(missing))}"]), found)
    return {i: found[i] for i in ids if i in found}
