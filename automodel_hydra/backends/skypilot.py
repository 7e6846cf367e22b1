"""SkyPilot backend: one task per job; a managed job (``sky.jobs.launch``) when ``use_spot``, so preemptions are
recovered, else ``sky.launch`` on a named cluster. SPEC section 3; SkyPilot 0.14.1 facts: ../shared/notes/.

:func:`make_plan` is pure (no ``import sky``): ``launch/sky_task.yaml`` (the task) and ``launch/job.sky.yaml`` (the
job config with node paths, mounted at ``~/automodel/<key>/launch/job.yaml``). :func:`plan` adds :func:`validate`
(SkyPilot's own schema and ``sky.Task`` construction), so a bad field fails before anything is written or launched.

Node paths hang off the run key (:func:`run_key`), which a managed job keeps across recoveries. With a bucket
(required for spot) the output dir and checkpoints live in ``<checkpoint_mount>/<key>``, mounted ``MOUNT_CACHED``
(SkyPilot's training guide: appends and renames work, uploads flushed at job end); a recovered job runs the same
command on fresh nodes, finds ``checkpoints/latest`` there and resumes. Without: ``~/automodel/<key>`` per node.

Secrets (``env_vars`` ``"${VAR}"``) are listed under ``secrets:`` by name only (null = supplied at launch, as
``sky launch --secret NAME``); :func:`submit` puts the values from this shell into the in-memory ``sky.Task``. A
failing ``setup`` fails the launch: SkyPilot raises ``Failed to setup with return code N``
(``sky/backends/cloud_vm_ray_backend.py``) or marks a managed job ``FAILED_SETUP`` (``sky/jobs/controller.py``);
run never starts. Setup runs under ``set -eo pipefail``, so every line counts, not only the last.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import getpass
import hashlib
import io
import json
import logging
import os
import re
import shlex
import socket
import time
import typing as tp
import warnings
from pathlib import Path

import yaml

from automodel_hydra.config import ConfigError, SkyPilotConfig, TrainConfig, parse_env_vars, to_dict
from automodel_hydra.plan import FINISHED, JobResult, JobSpec, Plan, Submission
from automodel_hydra.profile import nsys_prefix

log = logging.getLogger(__name__)

NAME = "skypilot"
TASK_FILE = "sky_task.yaml"
NODE_JOB_FILE = "job.sky.yaml"
#: Node 0 prints ``<RESULT_MARK><result.json on one line>`` after training (read back by :func:`wait`).
RESULT_MARK = "automodel-result: "
#: Seconds between status polls in :func:`wait`.
POLL_S = 15.0
#: SkyPilot job states (managed ``ManagedJobStatus`` and cluster ``JobStatus``) -> Slurm state names (plan.STATES).
STATE = {
    "INIT": "PENDING", "PENDING": "PENDING", "SUBMITTED": "PENDING", "STARTING": "PENDING", "SETTING_UP": "PENDING",
    "RUNNING": "RUNNING", "WINDING_DOWN": "RUNNING", "CANCELLING": "RUNNING", "RECOVERING": "PREEMPTED",
    "SUCCEEDED": "COMPLETED", "CANCELLED": "CANCELLED",
    "FAILED": "FAILED", "FAILED_SETUP": "FAILED", "FAILED_PRECHECKS": "FAILED", "FAILED_NO_RESOURCE": "FAILED",
    "FAILED_CONTROLLER": "FAILED", "FAILED_DRIVER": "FAILED",
}


class SkyPilotPlanError(ValueError):
    """SkyPilot's own schema or ``sky.Task`` construction rejected the planned task; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Payload:
    """What :func:`submit` needs. ``task`` is the planned dict (secret names only, never values)."""

    task: dict[str, tp.Any]
    secrets: tuple[tuple[str, str], ...]  # (secret name in the task, variable of the submitting shell)
    managed: bool  # sky.jobs.launch (use_spot) vs sky.launch
    name: str  # run key: task name, managed job name
    cluster_name: str | None
    idle_minutes_to_autostop: int | None
    down: bool
    wait: bool


# ----------------------------------------------------------------------------------------------- names and paths


def _slug(text: str) -> str:
    """Lowercase letters, digits and single dashes, starting with a letter (SkyPilot cluster/task names)."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug if slug[:1].isalpha() else f"j-{slug}".rstrip("-")


def run_key(sc: SkyPilotConfig, job: JobSpec) -> str:
    """The run's name on the cloud: ``skypilot.run_name`` or ``<job name>-<6 hex of the run/sweep dir>``; sweep
    points add ``-<job num>``. Same job dir, same key: a relaunch resumes from the same bucket dir."""
    sweep = job.job_num is not None
    base = sc.run_name
    if base is None:
        digest = hashlib.sha1(str(job.job_dir.parent if sweep else job.job_dir).encode()).hexdigest()[:6]
        base = f"{_slug(job.job_name)[:24].rstrip('-')}-{digest}"
    return f"{base}-{job.job_num}" if sweep else base


def default_bucket(user: str | None = None, host: str | None = None) -> str:
    """``checkpoint_bucket: auto``: ``automodel-<user>-<8 hex of user@host>``, one bucket per user and submitting
    host (bucket names are global, so the hash keeps them apart); SkyPilot creates it on first use."""
    with contextlib.suppress(KeyError, OSError):
        user = user or getpass.getuser()
    user, host = user or os.environ.get("USER", "user"), host or socket.gethostname()
    digest = hashlib.sha1(f"{user}@{host}".encode()).hexdigest()[:8]
    return f"automodel-{_slug(user)[:30].rstrip('-')}-{digest}"


def _bucket(sc: SkyPilotConfig) -> str | None:
    if sc.checkpoint_bucket == "auto":
        return default_bucket() if sc.use_spot or sc.num_nodes > 1 else None
    return sc.checkpoint_bucket


def _storage(bucket: str, store: str | None) -> dict[str, tp.Any]:
    """A SkyPilot storage mount (YAML ``file_mounts`` form): a URI is a ``source``, a plain name a ``name``."""
    where = {"source": bucket} if "://" in bucket else {"name": bucket}
    return {**where, **({"store": store} if store else {}), "mode": "MOUNT_CACHED"}


def _yaml_path(node_path: str) -> str:
    """A node path for the job config: ``~`` -> ``${oc.env:HOME}``, resolved by the worker on the node."""
    return "${oc.env:HOME}" + node_path[1:] if node_path.startswith("~/") else node_path


def _sh(arg: str) -> str:
    """Quote one word for bash, keeping a node path's leading ``~/`` (also after ``--opt=``) as ``"$HOME"/``."""
    head, sep, tail = arg.partition("=~/") if not arg.startswith("~/") else ("", "~/", arg[2:])
    if not sep:
        return shlex.quote(arg)
    return (shlex.quote(head + "=") if head else "") + '"$HOME"/' + shlex.quote(tail)


# ----------------------------------------------------------------------------------------------- planning (pure)


def render_setup(setup: str | None) -> str | None:
    """The task's ``setup``: the user's lines under ``set -eo pipefail``, so any failing line fails the launch.
    (``-u`` is left out: conda's and many rc files' activation scripts read unset variables.)"""
    return f"set -eo pipefail\n{setup.rstrip()}\n" if setup else None


def render_run(key: str, nproc: int, master_port: int, worker: list[str], prefix: list[str], out_dir: str) -> str:
    """The task's ``run``, identical on every node: torchrun over ``$SKYPILOT_NUM_NODES`` nodes, this node's rank
    ``$SKYPILOT_NODE_RANK``, master = first line of the newline-separated ``"$SKYPILOT_NODE_IPS"`` (quoted: an
    unquoted ``echo`` would join the lines). Node 0 then prints ``result.json`` on one line after
    :data:`RESULT_MARK`, which :func:`wait` reads back from the job's log (the final loss for Hydra's sweeper)."""
    tail = ["--no-python", *prefix, "python", "-u", *worker] if prefix else worker
    result = _sh(f"{out_dir}/result.json")
    return "\n".join([
        "set -euo pipefail",
        f"# {key}: torchrun on each of $SKYPILOT_NUM_NODES nodes, {nproc} worker(s) per node (automodel-hydra)",
        'export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"',
        "export PYTHONUNBUFFERED=1",
        "MASTER_ADDR=$(printf '%s\\n' \"$SKYPILOT_NODE_IPS\" | head -n1)",
        'echo "node $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES: master $MASTER_ADDR:' + str(master_port) + '"',
        f"mkdir -p {_sh(out_dir)}",
        'torchrun --nnodes="$SKYPILOT_NUM_NODES" --node_rank="$SKYPILOT_NODE_RANK" '
        f'--nproc_per_node={nproc} --master_addr="$MASTER_ADDR" --master_port={master_port} '
        + " ".join(_sh(a) for a in tail),
        f'if [ "$SKYPILOT_NODE_RANK" = 0 ]; then echo "{RESULT_MARK}$(tr -d \'\\n\' < {result})"; fi',
        "",
    ])


def parse_result(log_text: str) -> dict[str, tp.Any] | None:
    """The job's final metrics from its log: the last :data:`RESULT_MARK` line (None when there is none)."""
    for line in reversed(log_text.splitlines()):
        if RESULT_MARK in line:
            with contextlib.suppress(ValueError):
                return json.loads(line.split(RESULT_MARK, 1)[1])
    return None


def make_plan(cfg: TrainConfig, job: JobSpec) -> Plan:
    """Plan ``cfg``'s SkyPilot task: files ``sky_task.yaml`` and ``job.sky.yaml``, payload :class:`Payload`.
    Pure: no ``import sky``, writes nothing (reads only the user and host name, for ``checkpoint_bucket: auto``).

    Raises
    ------
    ConfigError
        A rule that spans sections: spot needs ``checkpoint.enabled`` and ``restore_from.path: latest`` (a recovered
        job must resume); ``restore_from.path`` must be ``latest`` or null (a local path is not on the nodes).
    """
    sc = cfg.skypilot
    assert sc is not None, "the skypilot backend plans configs with a skypilot: section"
    _check(cfg)
    key = run_key(sc, job)
    bucket = _bucket(sc)
    root = f"~/automodel/{key}"
    out = f"{sc.checkpoint_mount}/{key}" if bucket else root
    job_file = f"{root}/launch/job.yaml"
    file_mounts: dict[str, tp.Any] = {job_file: str(job.launch_dir / NODE_JOB_FILE)}
    node = to_dict(cfg)
    node.update(output_dir=_yaml_path(out), dry_run=False, skypilot=None)
    node["checkpoint"]["dir"] = _yaml_path(f"{out}/checkpoints")
    if cfg.data.source == "file" and cfg.data.path:  # the local text file travels with the job
        file_mounts[f"{root}/launch/data/{Path(cfg.data.path).name}"] = str(Path(cfg.data.path).resolve())
        node["data"]["path"] = _yaml_path(f"{root}/launch/data/{Path(cfg.data.path).name}")
    if cfg.model.name_or_path and Path(cfg.model.name_or_path).exists():  # a local model dir, not a hub id
        file_mounts[f"{root}/launch/model"] = str(Path(cfg.model.name_or_path).resolve())
        node["model"]["name_or_path"] = _yaml_path(f"{root}/launch/model")
    if bucket:
        file_mounts[sc.checkpoint_mount] = _storage(bucket, sc.checkpoint_store)
    elif sc.num_nodes > 1:
        warnings.warn(f"skypilot.checkpoint_bucket=null with skypilot.num_nodes={sc.num_nodes}: each node keeps its "
                      "own checkpoint files; resuming needs a bucket shared by all nodes", stacklevel=2)

    env = parse_env_vars(sc.env_vars, "skypilot.env_vars")
    nproc = sc.nproc_per_node or sc.gpus_per_node or 1
    worker = ["-m", "automodel_hydra.worker", job_file, "--log-file", f"{out}/{job.job_name}.log"]
    prefix = nsys_prefix(cfg.profile.nsys, out, job.job_name, rank_var="RANK")
    # job_recovery (managed jobs): preemptions are always recovered, user-code failures max_restarts_on_errors times
    resources = {"infra": sc.cloud + (f"/{sc.region}" if sc.region else ""), "accelerators": sc.accelerators,
                 "use_spot": sc.use_spot, "disk_size": sc.disk_size,
                 "job_recovery": {"max_restarts_on_errors": sc.max_restarts_on_errors} if sc.use_spot else None}
    secrets = tuple((e.name, e.ref) for e in env if e.ref is not None)
    task = {"name": key, "resources": {k: v for k, v in resources.items() if v is not None}, "num_nodes": sc.num_nodes,
            "workdir": str(sc.workdir or job.project_root), "file_mounts": file_mounts,
            "envs": {e.name: e.literal or "" for e in env if e.ref is None} or None,
            "secrets": {name: None for name, _ in secrets} or None, "setup": render_setup(sc.setup)}
    task = {k: v for k, v in task.items() if v is not None}
    task["run"] = render_run(key, nproc, sc.master_port, worker, prefix, out)

    # on-demand: skypilot.cluster_name (a sweep point adds -<num>: one cluster each) or the key
    cluster = sc.cluster_name and (sc.cluster_name if job.job_num is None else f"{sc.cluster_name}-{job.job_num}")
    cluster = None if sc.use_spot else cluster or key
    payload = Payload(task, secrets, sc.use_spot, key, cluster, sc.idle_minutes_to_autostop, sc.down, sc.wait)
    files = {TASK_FILE: _header(payload) + yaml.dump(task, Dumper=_Dumper, sort_keys=False, width=1000),
             # issue 7: !r, so a newline in the job name cannot end the comment and add YAML keys
             NODE_JOB_FILE: f"# {job.job_name!r} on the SkyPilot nodes: launch/job.yaml with node paths, mounted at "
                            f"{job_file}\n" + yaml.safe_dump(node, sort_keys=False)}
    return Plan(NAME, job, files, payload, group_key=None)


def _check(cfg: TrainConfig) -> None:
    sc = cfg.skypilot
    assert sc is not None
    path = cfg.restore_from.path
    if path not in (None, "latest"):
        raise ConfigError("restore_from.path", path, "'latest' or null on SkyPilot (a local checkpoint path does not "
                          "exist on the nodes; put it in the bucket and use skypilot.run_name to resume from it)")
    if sc.use_spot and not cfg.checkpoint.enabled:
        raise ConfigError("checkpoint.enabled", False, "true with skypilot.use_spot=true: a recovered job resumes "
                          "from its newest checkpoint")
    if sc.use_spot and path != "latest":
        raise ConfigError("restore_from.path", path, "'latest' with skypilot.use_spot=true: a recovered job resumes")
    if sc.workdir is not None and not Path(sc.workdir).is_dir():
        raise ConfigError("skypilot.workdir", sc.workdir, "an existing local directory (synced to every node)")


def _header(p: Payload) -> str:
    """How the task is launched, and the equivalent command line (secrets by name: the CLI reads this shell)."""
    by_hand = "".join(f" --secret {n}" if n == ref else f' --secret {n}="${ref}"' for n, ref in p.secrets)
    if p.managed:
        call, cli = f"sky.jobs.launch(task, name={p.name!r}): a managed job", f"sky jobs launch -n {p.name}"
    else:
        call = (f"sky.launch(task, cluster_name={p.cluster_name!r}, "
                f"idle_minutes_to_autostop={p.idle_minutes_to_autostop!r}, down={p.down!r})")
        cli = f"sky launch -c {p.cluster_name}" + (f" -i {p.idle_minutes_to_autostop}"
                                                   if p.idle_minutes_to_autostop is not None else "")
        cli += " --down" if p.down else ""
    return (f"# SkyPilot task planned by automodel-hydra; launched as {call}.\n"
            f"# By hand: {cli} launch/{TASK_FILE}{by_hand}\n")


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (setup, run) as literal blocks."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _sky() -> tp.Any:
    """``import sky`` (~2 s, creates ~/.sky), keeping its database migrations' INFO lines out of the job log."""
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger("alembic").level))
    import sky

    return sky


def validate(task: tp.Mapping[str, tp.Any]) -> None:
    """Check a task dict offline with SkyPilot's own schema (``common_utils.validate_schema``) and construction
    (``sky.Task.from_yaml_config``: resources, storage). Catches unknown fields, bad infra, accelerator format,
    ``disk_size``/``num_nodes`` <= 0, non-bool ``use_spot``, env names; not regions or accelerators a cloud lacks
    (that needs SkyPilot's catalog). Raises SkyPilotPlanError quoting SkyPilot's message, which names the field."""
    sky = _sky()
    from sky.utils import common_utils, schemas

    try:
        common_utils.validate_schema(copy.deepcopy(dict(task)), schemas.get_task_schema(), "Invalid task YAML: ")
        sky.Task.from_yaml_config(copy.deepcopy(dict(task)))  # it pops keys from its argument
    except Exception as e:  # ValueError, InvalidSkyPilotConfigError, StorageSpecError, ...
        raise SkyPilotPlanError(f"SkyPilot rejects the planned task ({TASK_FILE}): {e}") from e


def plan(cfg: TrainConfig, job: JobSpec) -> Plan:
    """:func:`make_plan`, then :func:`validate` its task: a bad field fails here, before any file is written."""
    p = make_plan(cfg, job)
    validate(p.payload.task)
    return p


# ----------------------------------------------------------------------------------------------- side effects


def build_task(payload: Payload, environ: tp.Mapping[str, str]) -> tp.Any:
    """The ``sky.Task`` to launch, with secret values taken from ``environ`` (in memory only).

    Raises ValueError naming the ``skypilot.env_vars`` entry whose variable is not set (as ``sky launch --secret``
    does), before anything is launched."""
    sky = _sky()
    missing = [f"skypilot.env_vars.{n} (${{{ref}}})" for n, ref in payload.secrets if ref not in environ]
    if missing:
        raise ValueError(f"{', '.join(missing)}: not set in this shell; export it, or remove the entry")
    overrides = [(name, environ[ref]) for name, ref in payload.secrets]
    return sky.Task.from_yaml_config(copy.deepcopy(payload.task), secrets_overrides=overrides or None)


def submit(plans: tp.Sequence[Plan]) -> list[Submission]:
    """Launch every plan: ``sky.jobs.launch`` (spot) or ``sky.launch`` (on-demand cluster). All requests are sent
    first, then each is followed (``sky.stream_and_get``: provisioning and setup logs) until it returns its id.

    A single job whose launch fails (e.g. setup failed) raises SkyPilot's error; in a sweep, a failed launch
    becomes a submission without ids that :func:`wait` reports FAILED, so the others keep their records."""
    sky = _sky()
    tasks = [(p.payload, build_task(p.payload, os.environ)) for p in plans]  # all secrets checked before launching
    requests = [sky.jobs.launch(task, name=pl.name) if pl.managed else
                sky.launch(task, cluster_name=pl.cluster_name, idle_minutes_to_autostop=pl.idle_minutes_to_autostop,
                           down=pl.down) for pl, task in tasks]
    subs = []
    for p, request in zip(plans, requests):
        pl = p.payload
        try:
            job_ids, _handle = sky.stream_and_get(request)
        except Exception as e:
            if len(plans) == 1:
                raise
            log.error("SkyPilot launch of %s failed: %s", pl.name, e)
            subs.append(Submission(p, ids=[], handle=e))
            continue
        ids = [str(i) for i in job_ids] if pl.managed else [f"{pl.cluster_name}:{job_ids}"]
        subs.append(Submission(p, ids=ids, log_path=_cli(ids[0], "logs") if ids else None))
    return subs


def _cli(job_id: str, verb: str) -> str:
    """The SkyPilot command for a job id (``"12"`` = managed job 12, ``"dev:3"`` = job 3 on cluster dev)."""
    cluster, _, num = job_id.rpartition(":")
    return f"sky {verb} {cluster} {num}" if cluster else f"sky jobs {verb} {job_id}"


def _raw_states(ids: tp.Sequence[str]) -> dict[str, str]:
    """SkyPilot's status name for each id (``"12"`` = managed job, ``"cluster:3"`` = a cluster's job)."""
    sky = _sky()
    out = {i: "UNKNOWN" for i in ids}
    managed = [int(i) for i in ids if ":" not in i]
    if managed:
        records = sky.get(sky.jobs.queue_v2(refresh=False, job_ids=managed))
        records = records[0] if isinstance(records, tuple) else records
        for r in records:  # ManagedJobRecord (dict-like .get) in 0.14.1
            out[str(r.get("job_id"))] = getattr(r.get("status"), "value", str(r.get("status")))
    for i in (i for i in ids if ":" in i):
        cluster, _, num = i.rpartition(":")
        statuses = sky.get(sky.job_status(cluster, job_ids=[int(num)]))
        status = statuses.get(int(num))
        out[i] = getattr(status, "value", str(status)) if status is not None else "UNKNOWN"
    return out


def wait(subs: tp.Sequence[Submission], poll_s: float | None = None, retries: int = 4) -> list[JobResult]:
    """Poll SkyPilot every ``poll_s`` seconds (default :data:`POLL_S`) until every job is finished, logging each
    change of state (recoveries included). COMPLETED carries node 0's ``result.json`` read back from the job's log
    (:data:`RESULT_MARK`; ``loss`` is what Hydra's sweeper gets). After ``retries`` failed queries in a row the
    jobs are reported UNKNOWN. Ctrl-C stops waiting, not the jobs (the message says how to cancel them)."""
    results = {i: JobResult("FAILED", error=f"launch failed: {s.handle}") for i, s in enumerate(subs) if not s.ids}
    last: dict[int, str] = {}
    failures = 0
    try:
        while len(results) < len(subs):
            pending = {i: s for i, s in enumerate(subs) if i not in results}
            try:
                raw, failures = _raw_states([s.ids[0] for s in pending.values()]), 0
            except Exception as e:  # API server unreachable, cluster already torn down, ...
                raw, failures = {}, failures + 1
                log.warning("cannot query SkyPilot (%d/%d): %s", failures, retries, e)
                if failures >= retries:
                    results.update({i: JobResult("UNKNOWN", error=f"cannot query SkyPilot: {e}; logs: {s.log_path}")
                                    for i, s in pending.items()})
            for i, s in ((i, s) for i, s in pending.items() if s.ids[0] in raw):
                state, slurm_state = raw[s.ids[0]], STATE.get(raw[s.ids[0]], "UNKNOWN")
                if last.get(i) != state:
                    log.info("SkyPilot job %s (%s): %s", s.ids[0], s.plan.payload.name, state)
                    last[i] = state
                if slurm_state == "COMPLETED":
                    results[i] = JobResult(slurm_state, _fetch_result(s.ids[0]) or {"sky_status": state})
                elif slurm_state in FINISHED:
                    results[i] = JobResult(slurm_state, {"sky_status": state}, f"SkyPilot {state}; logs: {s.log_path}")
            if len(results) < len(subs):
                time.sleep(POLL_S if poll_s is None else poll_s)
    except KeyboardInterrupt:
        log.warning("stopped waiting; the jobs go on. Cancel: %s", "; ".join(_cli(i, "cancel") for s in subs
                                                                              for i in s.ids))
        raise
    return [results[i] for i in range(len(subs))]


def _fetch_result(job_id: str) -> dict[str, tp.Any] | None:
    """Node 0's result line from the finished job's log (``sky.jobs.tail_logs`` / ``sky.tail_logs``, not followed)."""
    sky, buf = _sky(), io.StringIO()
    cluster, _, num = job_id.rpartition(":")
    try:
        if cluster:
            sky.tail_logs(cluster, int(num), follow=False, output_stream=buf)
        else:
            sky.jobs.tail_logs(job_id=int(job_id), follow=False, output_stream=buf)
    except Exception as e:  # the result is a convenience: the job's state is what counts
        log.warning("could not read the log of SkyPilot job %s: %s", job_id, e)
    return parse_result(buf.getvalue())


def status(record: dict[str, tp.Any]) -> str:
    """Slurm-style state of a saved submission (``launch/submission.json``), asked of SkyPilot."""
    ids = record.get("job_ids") or []
    return STATE.get(_raw_states(ids[:1]).get(ids[0], "UNKNOWN"), "UNKNOWN") if ids else "FAILED"


def cancel(record: dict[str, tp.Any]) -> None:
    """Cancel a saved submission: ``sky.jobs.cancel`` (managed) or ``sky.cancel`` on its cluster."""
    sky = _sky()
    for job_id in record.get("job_ids", []):
        cluster, _, num = job_id.rpartition(":")
        sky.get(sky.cancel(cluster, job_ids=[int(num)]) if cluster else sky.jobs.cancel(job_ids=[int(job_id)]))
