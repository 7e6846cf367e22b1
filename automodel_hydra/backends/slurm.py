"""Slurm backend: one sbatch job per run, one job array per sweep group, on this machine's cluster or, through
``slurm.tunnel``, a login node's.

Planning is pure (:mod:`~automodel_hydra.backends.slurm_plan`: what the scripts run and the runtime contract they
set up); :meth:`Slurm.preflight` reads the cluster's MaxArraySize (``scontrol show config``). The side effects go
through the job's transport (:mod:`~automodel_hydra.backends.slurm_transport`: this machine, or the login node over
SSH), so each operation has one body whatever the cluster: ``submit`` puts the planned files and the code snapshot
where the cluster reads them and runs ``sbatch``; ``states`` runs ``sacct``/``squeue``, ``cancel`` ``scancel``;
``wait`` follows rank 0's log and copies back what the jobs wrote (``fetch_results``), and reads rank 0's
``<job dir>/result.json`` once the job's state is COMPLETED; ``read_log`` reads a log from an offset.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
import typing as tp
from pathlib import Path, PurePosixPath

from automodel_hydra import fault_tolerance, outcome, records, snapshot
from automodel_hydra.backends import slurm_script
from automodel_hydra.backends.slurm_config import CALL_DEFAULTS as CALL_DEFAULTS
from automodel_hydra.backends.slurm_config import SlurmConfig as SlurmConfig
from automodel_hydra.backends.slurm_config import parse_slurm_time as parse_slurm_time
from automodel_hydra.backends.slurm_limits import parse_sinfo, pending_note, refuse_unfit
from automodel_hydra.backends.slurm_plan import (
    SCRIPT,
    TOKEN_FIELDS,
    TUNNEL_JOB_FILE,
    Cluster,
    Request,
    arrays,
    log_root,
    plan_request,
    read_mounts,
    render,
    tunnel_spec,
)
from automodel_hydra.backends.slurm_script import parse_job_id, sbatch_export_args, sbatch_hint
from automodel_hydra.backends.slurm_states import NotAnswered, job_of_script, query, runner
from automodel_hydra.backends.slurm_transport import HERE, NOT_FOUND, ConnectionLost, Follower, Probe, Transport, probe
from automodel_hydra.backends.slurm_tunnel import Endpoint, TunnelError, connect, reconnect, said, transport
from automodel_hydra.envvars import UnsetReference, missing_refs, parse_env_vars
from automodel_hydra.plan import (
    TORCHRUN_LOG_DIR,
    Backend,
    Batch,
    JobResult,
    JobSpec,
    Plan,
    PreflightError,
    SchedulerUnreachable,
    Submission,
    SubmitError,
    error_stamps,
    launch_dir,
    read_from,
    read_result,
    written_by_this_launch,
)
from automodel_hydra.schema import ConfigError
from automodel_hydra.snapshot import Source
from automodel_hydra.states import JobState, StateInfo

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

log = logging.getLogger(__name__)

#: Slurm's default MaxArraySize (slurm.conf(5)): array indices 0..MaxArraySize-1.
DEFAULT_MAX_ARRAY_SIZE = 1001
#: What a job writes that this machine reads, copied back when it ran elsewhere (``slurm.tunnel``): its result and
#: metrics, its logs, the rank error files and fault-tolerance records, a call job's JobReturn and Hydra's
#: ``.hydra/``. Never a checkpoint, never the code snapshot.
FETCHED = ("result.json", "metrics.jsonl", "*.log", ".hydra", "launch/error.rank*.json", "launch/call_result.pkl",
           "launch/call_error.pkl", f"launch/{TORCHRUN_LOG_DIR}", "launch/ft", f"launch/{outcome.RANKS_DIR}")
#: The state's note of a job that sbatch queued without saying its id (and that squeue did not list).
NO_ID = "sbatch queued the job without saying its id: find it with squeue --me where it was submitted"


@dataclasses.dataclass(frozen=True)
class Facts:
    """What :meth:`Slurm.preflight` read: MaxArraySize (``scontrol show config``), this machine's partitions (sinfo)."""

    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE
    #: (slurm.snapshot, slurm.snapshot_max_mb) -> what a submission snapshots (:func:`snapshot.find_each`)
    snapshots: tp.Mapping[tuple[str, float], Source | None] = dataclasses.field(default_factory=dict)
    #: ``slurm.tunnel``: what each login node answered (:func:`slurm_transport.probe`)
    remote: tp.Mapping[Endpoint, Probe] = dataclasses.field(default_factory=dict)
    partitions: str = ""


@dataclasses.dataclass(frozen=True)
class RemoteRef:
    """A job submitted through ``slurm.tunnel``: the login node, the job's dir and rank-0 log there, and where
    copies of that log land here (``local_log``)."""

    endpoint: Endpoint
    job_dir: str
    log: str
    local_log: str


@dataclasses.dataclass(frozen=True)
class SlurmRef:
    """A Slurm job: ``job_id`` is ``123``, or ``123_4`` for array task 4; ``submitted_at`` in epoch seconds;
    ``remote``: submitted through ``slurm.tunnel`` (None: from this machine, where its paths are the record's)."""

    job_id: str
    submitted_at: float = 0.0
    remote: RemoteRef | None = None

    @property
    def ids(self) -> list[str]:
        return [self.job_id] if self.job_id else []

    @property
    def endpoint(self) -> Endpoint | None:
        """The login node that knows the job (None: this machine's Slurm)."""
        return self.remote.endpoint if self.remote is not None else None

    def paths(self, job_dir: Path, log_path: str | None) -> tuple[PurePosixPath, str | None, str | None]:
        """``(job dir there, rank-0 log there, its copy here)`` for the record's job dir and ``log_path``."""
        if self.remote is None:
            return PurePosixPath(job_dir), log_path, log_path
        return PurePosixPath(self.remote.job_dir), self.remote.log or None, self.remote.local_log or None


# ----------------------------------------------------------------------------------------------- the backend


class Slurm(Backend[Request, SlurmRef, Facts]):
    """Slurm: a job per run, a job array per sweep group."""

    name = "slurm"
    wait_setting = ("slurm.detach", False)

    def preflight(self, cfgs: tp.Sequence[TrainConfig]) -> Facts:
        """sbatch's cluster answers (MaxArraySize read from it; a login node of ``slurm.tunnel`` logged in to and
        asked once); container mount sources and ``${VAR}`` references of ``env_vars`` exist here. Raises
        PreflightError / ConfigError naming what is missing."""
        from automodel_hydra.config import host_problems
        from automodel_hydra.paths import write_problems

        conf = os.environ.get("SLURM_CONF")
        tunnels = {Endpoint.of(c.slurm.ssh) for c in cfgs if c.slurm is not None and c.slurm.ssh is not None}
        here = any(c.slurm is not None and c.slurm.ssh is None for c in cfgs)  # some jobs are submitted here
        if conf and not Path(conf).is_file() and here:
            raise PreflightError(f"SLURM_CONF={conf} is not a file: point it at the cluster's slurm.conf, or unset it "
                                 "on a login node")
        snapshots = snapshot.find_each(cfgs)
        for cfg in cfgs:
            sc = cfg.slurm
            assert sc is not None
            if self.ranks_see_local_files(cfg):
                for problem in host_problems(cfg):
                    raise problem
            # the job dir is shared with the nodes (launch/ is written, result.json read back there); a dir outside
            # it may be node-local (/scratch, /tmp) and is not knowable from here
            for problem in write_problems(cfg, everywhere=False):
                raise problem
            if sc.container_image is not None and sc.ssh is None:  # (through a tunnel: the cluster's paths)
                _check_mount_sources(sc, snapshots.get((sc.snapshot, sc.snapshot_max_mb)) is None)
                read_mounts(cfg, Path(cfg.output_dir))  # the ranks' local models and data exist here
            tokens = {n: getattr(sc, k) for k, n in TOKEN_FIELDS.items() if getattr(sc, k)}
            fields = {n: k for k, n in TOKEN_FIELDS.items() if getattr(sc, k)}  # HF_TOKEN -> hf_token: the key written
            for entry, var in missing_refs(parse_env_vars({**sc.env_vars, **tokens}, "slurm.env_vars"), os.environ):
                raise UnsetReference(f"slurm.{fields[entry]}" if entry in fields else f"slurm.env_vars.{entry}", var)
        remote = {endpoint: _login(endpoint) for endpoint in sorted(tunnels, key=repr)}
        sizes = [p.max_array_size or DEFAULT_MAX_ARRAY_SIZE for p in remote.values()]
        answer = probe(HERE) if here or not sizes else Probe(None, None, "")
        sizes += [answer.max_array_size or DEFAULT_MAX_ARRAY_SIZE] if here or not sizes else []
        return Facts(min(sizes), snapshots, remote, answer.partitions)

    def world_size(self, cfg: TrainConfig, facts: Facts | None = None) -> int:
        assert cfg.slurm is not None
        return cfg.slurm.world_size

    def time_limit_minutes(self, cfg: TrainConfig) -> int | None:
        return cfg.slurm.time_minutes if cfg.slurm is not None else None

    def env_vars(self, cfg: TrainConfig) -> tp.Mapping[str, str]:
        return cfg.slurm.env_vars if cfg.slurm is not None else {}

    pending_note = staticmethod(pending_note)  # squeue(1)'s JOB REASON CODES, with the keys at fault

    def ranks_see_local_files(self, cfg: TrainConfig) -> bool:
        assert cfg.slurm is not None
        # bare metal: the nodes share this host's filesystem; through a tunnel they see the cluster's
        return cfg.slurm.container_image is None and cfg.slurm.ssh is None

    def plan(self, cfg: TrainConfig, job: JobSpec, facts: Facts | None = None) -> Plan[Request]:
        """Plan one Slurm job (pure): ``launch/sbatch.sh`` for ``cfg.slurm`` and the job dir ``job.job_dir``, and
        through ``slurm.tunnel`` the ranks' ``launch/job.tunnel.yaml`` (:func:`slurm_plan.tunnel_spec`).

        Raises
        ------
        Unfit
            (a ConfigError) no node of the job's partition (``facts``) can ever run it (:func:`slurm_limits.refusal`).
        ValueError
            A value cannot be written into the script: a newline in an ``#SBATCH`` option (sbatch reads one option
            per line), or ``,``/``:`` in a container mount path (Pyxis' ``--container-mounts`` syntax).
        """
        sc = cfg.slurm
        assert sc is not None
        facts = facts or Facts()
        tunnel = sc.ssh
        cluster = Cluster.of(tunnel, sys.executable, facts.remote.get(Endpoint.of(tunnel)) if tunnel else None)
        ranks_job = cluster.job(job)
        request = plan_request(cfg, ranks_job, facts.snapshots.get((sc.snapshot, sc.snapshot_max_mb)), cluster)
        answer = facts.remote.get(Endpoint.of(tunnel)) if tunnel is not None else None  # (its Probe.partitions)
        refuse_unfit(dict(request.sbatch), sc, parse_sinfo(answer.partitions if answer else facts.partitions))
        files = {SCRIPT: render(request, [ranks_job.job_dir])}
        if cluster.spec_file == TUNNEL_JOB_FILE and job.call is None:
            files[TUNNEL_JOB_FILE] = tunnel_spec(cfg, job, cluster)
        wait = sc.wait if job.job_num is None else not sc.detach
        return Plan(self.name, job, files, request, wait=wait, group_key=request,
                    # slurm.job_name or sbatch_args' job-name; none: sbatch names the job after its script
                    name=str(dict(request.sbatch).get("job-name", SCRIPT)))

    def batches(self, plans: tp.Sequence[Plan[Request]], sweep_dir: Path | None,
                facts: Facts | None = None) -> list[Batch[Request]]:
        """A single run is its own batch; a sweep group is one job array per MaxArraySize tasks, its script in
        ``<sweep dir>/launch/`` (``sbatch.sh``, then ``sbatch_<first job num>.sh`` past MaxArraySize)."""
        if sweep_dir is None:
            return super().batches(plans, sweep_dir)
        groups: dict[tp.Hashable, list[Plan[Request]]] = {}
        for p in plans:
            groups.setdefault(p.group_key, []).append(p)
        out = []
        for group in groups.values():
            for name, chunk in arrays(group, size := (facts or Facts()).max_array_size):
                script = launch_dir(sweep_dir) / name
                files = {p.job.launch_dir / n: t for p in chunk for n, t in p.files.items()}
                files[script] = render(chunk[0].request, [p.request.cluster.path(p.job.job_dir) for p in chunk],
                                       array=True, ids=slurm_script.task_ids([p.job.job_num for p in chunk], size))
                out.append(Batch(tuple(chunk), files))
        return out

    def submit(self, batch: Batch[Request]) -> list[Submission[SlurmRef]]:
        """Put the batch's launch files and code snapshot where the cluster reads them (through a tunnel: one
        ``tar`` stream, the snapshot once per sweep), then ``sbatch`` its script (a job's ``launch/sbatch.sh`` or
        the sweep's array script); returns at once. Raises SubmitError with sbatch's own message when sbatch
        fails; PreflightError (one line) when there is no sbatch or the login node cannot be reached."""
        first = batch.plans[0]
        cluster = first.request.cluster
        link = transport(cluster.endpoint)
        dirs = [p.job.job_dir for p in batch.plans]
        own = set(dirs)
        array = [path for path in batch.files if path.parent.parent not in own]
        script = array[0] if array else first.job.launch_dir / SCRIPT
        root = log_root(dirs, bool(array))  # once: it compares every job dir
        code, snapshot_files, renames = _snapshot(first, cluster)
        link.put({**_launch_files(batch, cluster), **snapshot_files},
                 dirs=[_there(cluster, root / "slurm"), *(tmp / "src" for tmp, _ in renames)], renames=renames)
        stamps = [error_stamps(p.job) for p in batch.plans]  # what an earlier launch left (rank_error)
        started = time.time()
        job_id = _sbatch(link, _there(cluster, script), first.request, batch.files[script])
        tasks = slurm_script.script_task_ids(batch.files[script]) if array else [0] * len(batch.plans)
        subs = []
        for i, p, stamp in zip(tasks, batch.plans, stamps):
            jid = (f"{job_id}_{i}" if array else job_id) if job_id else ""  # "": queued, its id not said
            name = f"{job_id}_{i}_0_log.out" if array else f"{job_id}_0_log.out"
            ref, shown = _ref(cluster, jid, started, p.job.job_dir, root / "slurm" / name if jid else None)
            subs.append(Submission(p, ref, log_path=shown, code=code, error_stamps=stamp))
        return subs

    def wait(self, subs: tp.Sequence[Submission[SlurmRef]], max_poll_s: float = 30.0,
             lost_after_s: float = 300.0) -> list[JobResult]:
        """Block until every job has a final state (requeues included); a single waited-for job has its rank-0 log
        followed on stdout. One result per submission, with ``<job dir>/result.json`` as the value.

        Slurm is asked (one query for all jobs) after 2 s, then less and less often up to every ``max_poll_s``,
        and at once when a job's result.json appears. A job no tool has known for ``lost_after_s`` ends UNKNOWN.
        A cluster that cannot be asked (a dropped connection to the login node) is asked again with backoff for
        ``slurm.tunnel.reconnect_timeout_s`` (:func:`_wait_out`), during which nothing counts for or against a
        job; past it, raises SchedulerUnreachable, the jobs still submitted and their records unchanged."""
        single = len(subs) == 1 and subs[0].plan.job.job_num is None
        follow = Follower(lambda pos: self.read_log(subs[0].ref, Path(str(subs[0].log_path)), pos)) if single else None
        results = {i: JobResult(JobState.UNKNOWN, error=f"{s.plan.job.job_dir}: {NO_ID}")
                   for i, s in enumerate(subs) if not s.ref.job_id}
        seen = {i: time.time() for i in range(len(subs))}
        fresh: set[int] = set()
        delay, next_check = 2.0, time.time() + 2.0
        while len(results) < len(subs):
            pending = [i for i in range(len(subs)) if i not in results]
            try:
                new = {i for i in pending if i not in fresh and _fresh_result(subs[i])}
                if new or time.time() >= next_check:
                    infos = self._query([subs[i].ref for i in pending])
                    _get([(subs[i].ref, subs[i].plan.job.job_dir, subs[i].log_path)
                          for i, info in zip(pending, infos) if info.state.final])
                    fresh |= new
                    for i, info in zip(pending, infos):
                        if info.state is JobState.UNKNOWN and records.cancel_note(subs[i].plan.job.job_dir,
                                                                                  subs[i].ref.ids):
                            info = StateInfo(JobState.CANCELLED)  # ours, of a pending task Slurm keeps no record of
                        if info.state is not JobState.UNKNOWN:
                            seen[i] = time.time()
                        elif time.time() - seen[i] > lost_after_s:
                            results[i] = JobResult(JobState.UNKNOWN,
                                                   error=f"job {subs[i].ref.job_id}: neither sacct nor squeue knows it")
                        if info.state.final:
                            results[i] = _result(subs[i], info.state)
                    delay = 2.0 if new else min(delay * 1.5, max_poll_s)
                    next_check = time.time() + delay
                if follow is not None:
                    follow.poll()
            except (ConnectionLost, TunnelError) as e:
                _wait_out(e, [subs[i] for i in pending])
                seen.update({i: time.time() for i in pending})  # what was not asked counts for nothing
                continue
            if len(results) < len(subs):
                time.sleep(1.0)
        if follow is not None:
            try:
                follow.poll()
            except (ConnectionLost, TunnelError):
                pass  # (the log's last lines are in its copy here, fetched with the result)
        return [results[i] for i in range(len(subs))]

    def states(self, refs: tp.Sequence[SlurmRef]) -> list[StateInfo]:
        """One ``sacct`` call for all jobs of a cluster (``squeue`` for those it does not know, or when accounting
        is off), on this machine or on the login node of ``slurm.tunnel``. A cluster that cannot be asked (a login
        node out of reach, no slurm.conf, no controller) gives UNKNOWN with the reason and ``answered=False``."""
        found: dict[int, StateInfo] = {}
        for idx in _by_endpoint(refs).values():
            try:
                infos = self._query([refs[i] for i in idx], strict=True)
            except (ConnectionLost, TunnelError, NotAnswered) as e:
                infos = [StateInfo(JobState.UNKNOWN, str(e), answered=False)] * len(idx)
            found.update(zip(idx, infos))
        return [found[i] for i in range(len(refs))]

    def cancel(self, refs: tp.Sequence[SlurmRef], pending_only: bool = False) -> None:
        """``scancel`` the jobs, one command per cluster (a login node's through ``slurm.tunnel``): each job
        checkpoints on SIGTERM, ends CANCELLED and is not requeued. ``pending_only``: ``scancel --state=PENDING``
        (scancel(1): the controller cancels only those still pending, so a task that just started runs on)."""
        for endpoint, idx in _by_endpoint(refs).items():
            ids = [*(["--state=PENDING"] if pending_only else []), *(refs[i].job_id for i in idx if refs[i].job_id)]
            out = transport(endpoint).run(["scancel", *ids], timeout=60) if ids[pending_only:] else None
            if out is not None and out.returncode != 0:
                log.warning("scancel %s: %s", " ".join(ids), out.said())

    def read_log(self, ref: SlurmRef, log: Path, pos: int) -> tuple[int, bytes] | None:
        """The job's rank-0 log from byte ``pos`` on, where the cluster writes it (a login node's: over SSH; one out
        of reach: the copy here, :meth:`fetch_results`'s)."""
        _, there, copy = ref.paths(Path("."), str(log))
        try:
            return transport(ref.endpoint).read_from(there, pos) if there else None
        except (ConnectionLost, TunnelError):
            return read_from(copy, pos) if copy else None

    def ranks_path(self, plan: Plan[Request], path: Path) -> str | None:
        """:meth:`Cluster.ranks_path` (None on this machine's cluster, or for a plan without a request)."""
        return plan.request.cluster.ranks_path(plan.job, path) if plan.request is not None else None

    def fetch_results(self, jobs: tp.Sequence[tuple[SlurmRef, Path, str | None]]) -> None:
        """Copy back :data:`FETCHED` and the rank-0 log of jobs that ran where this machine cannot read (through
        ``slurm.tunnel``), one ``tar`` per login node. A login node that cannot be reached leaves the local copies
        as they are (a warning)."""
        try:
            _get(jobs)
        except (ConnectionLost, TunnelError) as e:
            log.warning("the results were not copied back: %s", e)

    def ref_from_record(self, record: tp.Mapping[str, tp.Any]) -> SlurmRef:
        ref = record.get("ref") or {}
        job_id = ref.get("job_id") or (record.get("job_ids") or [""])[0]
        remote = ref.get("remote")
        return SlurmRef(str(job_id), float(ref.get("submitted_at", 0.0)),
                        RemoteRef(Endpoint.from_record(remote["endpoint"]), str(remote["job_dir"]),
                                  str(remote["log"]), str(remote["local_log"])) if remote else None)

    def _query(self, refs: tp.Sequence[SlurmRef], strict: bool = False) -> list[StateInfo]:
        """:meth:`states`, raising ConnectionLost / TunnelError (``strict``: NotAnswered) when it cannot ask."""
        found: dict[int, StateInfo] = {}
        for endpoint, idx in _by_endpoint(refs).items():
            ids = [refs[i].job_id for i in idx if refs[i].job_id]
            answer = query(ids, run=runner(transport(endpoint), strict)) if ids else {}
            found.update({i: answer.get(refs[i].job_id, StateInfo(JobState.UNKNOWN, "" if refs[i].job_id else NO_ID))
                          for i in idx})
        return [found[i] for i in range(len(refs))]


# ----------------------------------------------------------------------------------------------- side effects


def _wait_out(lost: Exception, subs: tp.Sequence[Submission[SlurmRef]]) -> None:
    """Reach the login nodes of ``subs`` again (:func:`slurm_tunnel.reconnect`) within their
    ``slurm.tunnel.reconnect_timeout_s``; one line when it starts trying and one when it is back. Raises
    SchedulerUnreachable naming the jobs, which are still submitted, and the commands that follow them."""
    endpoints = sorted({s.ref.endpoint for s in subs if s.ref.endpoint is not None}, key=repr)
    where = ", ".join(e.where for e in endpoints) or "this machine's Slurm"
    budget = max((s.plan.request.cluster.reconnect_timeout_s for s in subs), default=0.0)
    log.warning("lost the connection to %s (%s); trying again for up to %g s (slurm.tunnel.reconnect_timeout_s)",
                where, said(lost), budget)
    began = time.monotonic()
    still = reconnect(endpoints, budget)
    if still is None:
        log.warning("reconnected to %s after %.0f s", where, time.monotonic() - began)
        return
    dirs = [s.plan.job.job_dir for s in subs]
    run = dirs[0] if len(dirs) == 1 else Path(os.path.commonpath([str(d) for d in dirs]))
    ids = ", ".join(i for s in subs for i in s.ids) or "?"
    raise SchedulerUnreachable(
        f"the connection to {where} did not come back within {budget:g} s (slurm.tunnel.reconnect_timeout_s; "
        f"{said(still)}): slurm job {ids} is still submitted; follow it with automodel-hydra status {run} and "
        f"automodel-hydra logs {run}, or stop it with automodel-hydra cancel {run}")


def _login(endpoint: Endpoint) -> Probe:
    """Log in to the login node and ask it once (:func:`slurm_transport.probe`). Raises TunnelError (one line)
    when it does not answer, refuses the key, or has no sbatch."""
    link = connect(endpoint)
    answer = probe(link)
    if answer.sbatch is None:
        raise TunnelError(link.missing_line("sbatch"))
    return answer


def _check_mount_sources(sc: SlurmConfig, project_mounted: bool) -> None:
    """A container job's mount sources exist here and the job's user can read them (they are mounted into the
    container, where the ranks read them as this user); ``project_mounted``: no snapshot, this project's source
    itself is mounted (nemo_mount, else PROJECT_MOUNT). Raises ConfigError naming the key."""
    sources = [(f"slurm.extra_mounts[{i}].source", m.source) for i, m in enumerate(sc.extra_mounts)]
    if sc.nemo_volume is not None:
        sources.append(("slurm.nemo_mount.source", sc.nemo_volume.source))
    if project_mounted:
        sources.append(("slurm.nemo_mount" if sc.nemo_mount and sc.nemo_volume is None else "slurm.snapshot",
                        str(JobSpec.project_root)))
    for key, source in sources:
        if not Path(source).exists():
            raise ConfigError(key, source, "a path that exists on the submitting host (it is mounted into "
                              "the container)")
        if not os.access(source, os.R_OK | (os.X_OK if Path(source).is_dir() else 0)):
            raise ConfigError(key, source, "a path the job's user can read (it is mounted into the "
                              "container, where the ranks read it as this user)")


def _by_endpoint(refs: tp.Sequence[SlurmRef]) -> dict[Endpoint | None, list[int]]:
    groups: dict[Endpoint | None, list[int]] = {}
    for i, ref in enumerate(refs):
        groups.setdefault(ref.endpoint, []).append(i)
    return groups


def _there(cluster: Cluster, path: Path) -> PurePosixPath:
    return PurePosixPath(cluster.path(path))


def _ref(cluster: Cluster, job_id: str, started: float, job_dir: Path, log: Path | None
         ) -> tuple[SlurmRef, str | None]:
    """A submitted job's reference, and its log as the record shows it (a login node's: ``user@host:/path``),
    for its local job dir and the local path of its rank-0 log (None: not known, the job id is not)."""
    log_there = _there(cluster, log) if log is not None else None
    if cluster.endpoint is None:
        return SlurmRef(job_id, started), str(log_there) if log_there else None
    remote = RemoteRef(cluster.endpoint, str(cluster.path(job_dir)), str(log_there or ""), str(log or ""))
    return SlurmRef(job_id, started, remote), f"{cluster.endpoint.destination}:{log_there}" if log_there else None


def _launch_files(batch: Batch[Request], cluster: Cluster) -> dict[PurePosixPath, Path]:
    """What the cluster reads of the batch's launch dirs (path there -> the file here): the planned files (the
    scripts, a tunnel's ``job.tunnel.yaml``), each job's ``run_id`` and ``tracker_id``, and a call job's
    ``call.pkl``."""
    files = {_there(cluster, path): path for path in batch.files}
    for p in batch.plans:
        for path in (p.job.run_id_file, p.job.tracker_id_file, p.job.call_file):
            if path.is_file():
                files[_there(cluster, path)] = path
    return files


def _snapshot(plan: Plan[Request], cluster: Cluster
              ) -> tuple[dict[str, tp.Any] | None, dict[PurePosixPath, Path],
                         list[tuple[PurePosixPath, PurePosixPath]]]:
    """The plan's code snapshot as files to put (``(record, files, [(tmp dir, code dir)])``, made beside the code
    dir and renamed into place). A sweep's code dir is put once per process: every batch of the sweep (its
    arrays, and the launches of a sweeper that submits in several batches) shares it."""
    from automodel_hydra.snapshot import members

    source, code_dir = plan.request.snapshot, plan.job.code_dir
    if source is None or code_dir is None:
        return None, {}, []
    there = _there(cluster, code_dir)
    key = (cluster.endpoint, str(there))
    if plan.job.job_num is not None and key in _SNAPSHOTS:
        return _SNAPSHOTS[key], {}, []
    record = cluster.code_record(source, Path(there))
    if plan.job.job_num is not None:
        _SNAPSHOTS[key] = record
    tmp = there.with_name(f".{there.name}.{os.getpid()}.tmp")
    return record, {tmp / rel: origin for rel, origin in members(source).items()}, [(tmp, there)]


#: The sweep code dirs this process put on a cluster (this machine's: endpoint None), and their records.
_SNAPSHOTS: dict[tuple[Endpoint | None, str], dict[str, tp.Any]] = {}


def _sbatch(link: Transport, script: PurePosixPath, request: Request, text: str) -> str:
    """``sbatch --parsable SCRIPT`` through ``link``, with the ``--export`` a site's SBATCH_EXPORT needs so that the
    job sees ``request.env_refs``, whose values of the submitting shell reach sbatch's environment through the
    transport (never on a command line or in a file), and without the ``SBATCH_*`` variables that would override
    the script's (``text``) options (:func:`slurm_script.overridden`, named in one line). Returns the job id:
    what ``--parsable`` printed, else (a
    site's wrapper that prints more, or other words) the job ``squeue`` lists for the script; "" when sbatch
    queued the job (exit 0) and neither says which (the job is recorded all the same). Raises SubmitError with
    sbatch's own message, PreflightError when ``link`` has no sbatch."""
    names = [n for n in dict.fromkeys(request.env_refs) if n in os.environ]
    export = request.cluster.sbatch_export
    site = os.environ if export is None else {"SBATCH_EXPORT": export}
    argv = ["sbatch", "--parsable", *sbatch_export_args(site, request.env_refs), str(script)]
    there = request.cluster.sbatch_vars
    dropped = slurm_script.overridden(text, os.environ if there is None else there)
    if dropped:
        log.warning("%s", slurm_script.dropped_line(dropped, None if there is None else link.where))
    try:
        out = link.run(argv, env={n: os.environ[n] for n in names}, timeout=120,
                       cwd=None if request.cluster.local_paths else str(script.parent),
                       unset=[v for v, _ in dropped])
    except ValueError as e:  # a value that cannot be sent
        raise SubmitError(str(e)) from None
    except ConnectionLost as e:  # sbatch may have queued the job: ask once the login node answers again
        endpoint = request.cluster.endpoint
        lost = reconnect([endpoint], request.cluster.reconnect_timeout_s) if endpoint is not None else e
        job_id = job_of_script(str(script), runner(link)) if lost is None else ""
        if job_id:
            log.warning("the connection to %s was lost while sbatch %s ran (%s); squeue lists job %s for the script",
                        link.where, script, said(e), job_id)
            return job_id
        raise SubmitError(f"sbatch {script} on {link.where}: the connection was lost while it ran ({said(e)}); "
                          f"{'no job of the script is queued' if lost is None else 'the job may be queued'}: check "
                          f"squeue --me there, then submit again") from None
    if out.returncode == NOT_FOUND:
        raise PreflightError(link.missing_line("sbatch"))
    if out.returncode != 0:
        hint = sbatch_hint((out.stderr.decode(errors="replace").strip() or out.text.strip()).splitlines())
        raise SubmitError(f"sbatch {script} on {link.where} failed ({out.returncode}): {out.said()}{hint}")
    try:
        return parse_job_id(out.text)
    except SubmitError as e:
        job_id = job_of_script(str(script), runner(link))
        found = f"squeue lists job {job_id} for the script" if job_id else (
            f"squeue --me lists no job for the script: recorded without a job id; find it with squeue --me on "
            f"{link.where}")
        log.warning("sbatch %s on %s queued the job, but %s; %s", script, link.where, str(e).removeprefix(
            "sbatch --parsable "), found)
        return job_id


def _get(jobs: tp.Sequence[tuple[SlurmRef, Path, str | None]]) -> None:
    """Copy back :data:`FETCHED` and the rank-0 log of each ``(reference, local job dir, log_path)``, one
    transfer per cluster (this machine's jobs wrote here: nothing to copy). Raises ConnectionLost / TunnelError."""
    by: dict[Endpoint | None, list[tuple[PurePosixPath, Path, tp.Sequence[str]]]] = {}
    for ref, job_dir, log_path in jobs:
        job_there, log_there, log_here = ref.paths(job_dir, log_path)
        items = by.setdefault(ref.endpoint, [])
        items.append((job_there, job_dir, FETCHED))
        if log_there and log_here:
            items.append((PurePosixPath(log_there).parent, Path(log_here).parent, (PurePosixPath(log_there).name,)))
    for endpoint, items in by.items():
        transport(endpoint).get(items)


def _fresh_result(sub: Submission[SlurmRef]) -> bool:
    """Whether the job wrote ``result.json`` in this launch (it carries ``launch/run_id``'s id), not a leftover
    of an earlier one. Never from mtimes: the nodes and the file server need not share this host's clock."""
    return written_by_this_launch(sub.plan.job)


def _result(sub: Submission[SlurmRef], state: JobState) -> JobResult:
    """How the job ended: what its ranks did, Slurm's state as the scheduler's word (:func:`automodel_hydra.
    outcome.derive`: ``sacct``'s COMPLETED is no COMPLETED without this launch's result)."""
    verdict = outcome.derive(sub.plan.job, state, sub.error_stamps)
    restarts = fault_tolerance.restart_summary(sub.plan.job.launch_dir)
    if verdict.state is JobState.COMPLETED:
        if restarts:
            log.warning("slurm job %s completed, %s", sub.ref.job_id, restarts)
        return JobResult(JobState.COMPLETED, read_result(sub.plan.job))
    tail = ""
    _, _, copy = sub.ref.paths(sub.plan.job.job_dir, sub.log_path)  # the log's copy here
    if verdict.why is None and copy and Path(copy).exists():  # nothing else says why: the log's last lines
        tail = "\n" + "\n".join(Path(copy).read_text(errors="replace").splitlines()[-30:])
    why = "; ".join(x for x in (verdict.why, f"Slurm state {state.value}", restarts) if x)
    return JobResult(verdict.state, error=f"{why}{tail}",  # (the command's line names the job and its log)
                     traceback=verdict.traceback)
