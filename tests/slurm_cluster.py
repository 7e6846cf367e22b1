"""pytest plugin: the project's real Slurm 22.05 test cluster on loopback.

Loaded from ``tests/conftest.py`` (``pytest_plugins = ["tests.slurm_cluster"]``). It provides the session-scoped
fixture ``slurm_cluster``, which runs ``scripts/slurm-cluster up --accounting`` (munged, slurmctld, two slurmd
``node1``/``node2`` with 2 CPUs each, partition ``debug``, MariaDB + slurmdbd so that ``sacct`` works), exports
``SLURM_CONF`` into ``os.environ`` for the whole session (so ``sbatch``, ``squeue``, ``sacct`` and submitit that
run in subprocesses talk to this cluster), and tears the cluster down at the end of the session.

Tests that use it carry ``@pytest.mark.slurm``. Without the Slurm packages the fixture skips, naming the install
command, except when ``CI`` is set: CI must have a cluster, so there it fails.

Environment:

- ``SLURM_CLUSTER_DIR``: state dir (default ``<repo>/.slurm-cluster``), passed on to the script.
- ``SLURM_CLUSTER_KEEP=1``: leave the cluster running after the session (the next session reuses it in ~0.3 s).

Several pytest sessions (xdist workers, or two checkouts' test runs sharing one state dir) may use one cluster:
each holds a shared ``flock`` on ``<dir>/.users`` while it runs, and only the last one to leave runs ``down``.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import shutil
import subprocess
import time
import typing as tp
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPT = REPO_ROOT / "scripts" / "slurm-cluster"
INSTALL_COMMAND = (
    "scripts/install-slurm-deps (apt-get install --no-install-recommends munge slurmctld slurmd slurm-client"
    " slurmdbd mariadb-server)"
)
# what `scripts/slurm-cluster up --accounting` runs; /usr/sbin may be missing from a non-login PATH
REQUIRED_TOOLS = (
    "munged", "slurmctld", "slurmd", "slurmdbd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sacct",
    "sacctmgr", "mariadbd", "mariadb-install-db", "unshare", "flock",
)  # fmt: skip
SBIN_PATH = "/usr/sbin:/sbin"
# `sacct` states after which a job never runs again (sacct(1), JOB STATE CODES)
TERMINAL_STATES = frozenset(
    {"BOOT_FAIL", "CANCELLED", "COMPLETED", "DEADLINE", "FAILED", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
     "TIMEOUT"}
)  # fmt: skip
POLL_S = 0.1


@dataclasses.dataclass
class SlurmCluster:
    """A running loopback cluster; every command it runs uses this cluster's ``SLURM_CONF``."""

    dir: Path  # state dir: etc/, log/ (one log per daemon), pid/, ...
    conf: Path  # slurm.conf; also exported as SLURM_CONF for the session
    nodes: list[str] = dataclasses.field(default_factory=lambda: ["node1", "node2"])
    partition: str = "debug"
    submitted: list[str] = dataclasses.field(default_factory=list)  # every job id sbatch() returned, in order

    def run(self, *argv: str, check: bool = True, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command (``sinfo``, ``sbatch`` ...) against this cluster and capture its output."""
        env = {**os.environ, "SLURM_CONF": str(self.conf)}
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout, check=False)
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(argv)} exited with {proc.returncode}\nstdout: {proc.stdout}\nstderr: {proc.stderr}"
            )
        return proc

    def sbatch(self, *args: str) -> str:
        """Submit with ``sbatch --parsable ARGS`` and return the job id (also kept in ``submitted``)."""
        job_id = self.run("sbatch", "--parsable", *args).stdout.strip().split(";")[0]
        self.submitted.append(job_id)
        return job_id

    def cancel_left(self, job_ids: tp.Iterable[str]) -> list[str]:
        """Cancel those of ``job_ids`` still queued (what a failed test leaves), requeue turned off first so that
        nothing brings them back; wait until they are gone. Returns the ids it cancelled."""
        queued = self.squeue_ids()
        left = [j for j in job_ids if any(i == j or i.startswith(f"{j}_") for i in queued)]
        for job_id in left:
            self.run("scontrol", "update", f"JobId={job_id}", "Requeue=0", check=False)
        if left:
            self.run("scancel", *left, check=False)
        for job_id in left:
            self.wait_gone(job_id, timeout=60)
        return left

    def squeue_ids(self) -> list[str]:
        """Ids of the jobs in the queue (pending, running, completing...), as squeue's ``%i`` prints them:
        ``12`` for a job, ``12_3`` / ``12_[4-7]`` for array tasks."""
        return self.run("squeue", "-h", "-o", "%i").stdout.split()

    def job_info(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (``JobState``, ``Restarts``, ``NodeList``...); empty once purged."""
        proc = self.run("scontrol", "show", "job", "-o", job_id, check=False)
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout)) if proc.returncode == 0 else {}

    def wait_gone(self, job_id: str, timeout: float = 60.0) -> float:
        """Wait until the job (and all its array tasks) left the queue; return the seconds waited.

        Raises
        ------
        TimeoutError
            still queued after ``timeout`` seconds; the message holds ``scontrol show job``.
        """
        start = time.monotonic()
        while True:
            ids = self.squeue_ids()
            if not any(i == job_id or i.startswith(f"{job_id}_") for i in ids):
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                info = self.run("scontrol", "show", "job", job_id, check=False).stdout
                raise TimeoutError(f"job {job_id} still in the queue after {timeout} s:\n{info}")
            time.sleep(POLL_S)

    def sacct_state(self, job_id: str, timeout: float = 0.0) -> str:
        """The job's state in accounting (``COMPLETED``, ``CANCELLED``, ``FAILED``, ``RUNNING``...), ``""`` when
        sacct has no record yet.

        The record reaches slurmdbd a moment after the job leaves the queue, so with ``timeout > 0`` this polls
        until the state is terminal (or the time is up, returning the last state seen). ``CANCELLED by 0`` is
        returned as ``CANCELLED``.
        """
        start = time.monotonic()
        while True:
            out = self.run("sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobID,State").stdout
            rows = [line.split("|", 1) for line in out.splitlines() if "|" in line]
            exact = [state for jid, state in rows if jid == job_id]
            state = (exact or [state for _, state in rows] or [""])[0].split(" ")[0]
            if state in TERMINAL_STATES or time.monotonic() - start >= timeout:
                return state
            time.sleep(POLL_S)


def _missing_prerequisites() -> str | None:
    """Why this machine cannot run the cluster, or None when it can."""
    path = f"{os.environ.get('PATH', '')}:{SBIN_PATH}"
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool, path=path) is None]
    if missing:
        return f"Slurm test cluster needs {', '.join(missing)}: install with {INSTALL_COMMAND} as root"
    if os.geteuid() != 0:
        return "Slurm test cluster needs root (SlurmUser=root, a private mount namespace per slurmd)"
    return None


def _script(command: str, *args: str, env: dict[str, str], timeout: float) -> None:
    proc = subprocess.run(
        [str(SCRIPT), command, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    if proc.returncode != 0:
        pytest.fail(
            f"scripts/slurm-cluster {command} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}", pytrace=False
        )


@pytest.fixture(scope="session")
def slurm_cluster() -> tp.Iterator[SlurmCluster]:
    """The loopback Slurm cluster with accounting, up for the whole session; ``SLURM_CONF`` set in os.environ."""
    reason = _missing_prerequisites()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI is set, so the cluster is required)", pytrace=False)
        pytest.skip(reason)

    state_dir = Path(os.environ.get("SLURM_CLUSTER_DIR") or REPO_ROOT / ".slurm-cluster").resolve()
    env = {**os.environ, "SLURM_CLUSTER_DIR": str(state_dir)}
    # The first `up` may build the accounting database template (5-10 s); later ones take 2-5 s, or 0.3 s when
    # the cluster is already up.
    _script("up", "--accounting", env=env, timeout=300)
    users = open(state_dir / ".users", "a")  # noqa: SIM115 - held until teardown
    fcntl.flock(users, fcntl.LOCK_SH)
    # Another session may have run `down` between our `up` and the lock; `up` again is a no-op when healthy.
    _script("up", "--accounting", env=env, timeout=300)

    cluster = SlurmCluster(dir=state_dir, conf=state_dir / "etc" / "slurm.conf")
    saved_conf = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    try:
        yield cluster
    finally:
        if saved_conf is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = saved_conf
        # Last one out turns the lights off: release our shared lock, then `down` only if nobody else holds one.
        fcntl.flock(users, fcntl.LOCK_UN)
        try:
            fcntl.flock(users, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another session still uses the cluster
        else:
            if not os.environ.get("SLURM_CLUSTER_KEEP"):
                _script("down", env=env, timeout=120)
        finally:
            users.close()
