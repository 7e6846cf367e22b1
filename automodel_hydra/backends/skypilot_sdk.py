"""The SkyPilot SDK side of :mod:`automodel_hydra.backends.skypilot`: everything that imports ``sky`` (checking a
planned task with SkyPilot's own schema, launching, polling, cancelling), so planning never imports it.

SkyPilot's client talks to an API server; with none configured it starts one on this machine on first use
(``python -m sky.server.server``, ~1 GB in 8 processes) and leaves it running. :func:`launch` asks SkyPilot in
this process whether the cloud has credentials before that (what ``sky check`` asks), and stops a server it
started when the launch fails (``sky.api_stop``). docs/skypilot.md has the facts of SkyPilot 0.14.1 used here.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import logging
import os
import re
import time
import typing as tp

from automodel_hydra import outcome
from automodel_hydra.backends.skypilot_config import SKYPILOT_CLOUDS
from automodel_hydra.envvars import expand
from automodel_hydra.plan import JobResult, PreflightError, Submission, SubmitError
from automodel_hydra.schema import UserError
from automodel_hydra.states import JobState

if tp.TYPE_CHECKING:
    from automodel_hydra.backends.skypilot import Request

log = logging.getLogger(__name__)

#: The planned task in the job's ``launch/`` (``sky launch launch/sky_task.yaml`` reruns it by hand).
TASK_FILE = "sky_task.yaml"
#: Node 0 prints ``<RESULT_MARK><result.json on one line>`` after training (read back by :func:`wait`).
RESULT_MARK = "automodel-result: "
#: SkyPilot job states (managed ``ManagedJobStatus`` and cluster ``JobStatus``) -> the product's state names
#: (Slurm's): a recovering managed job is PENDING (it will run again); SkyPilot's failure kinds are FAILED.
STATE = {
    "INIT": "PENDING", "PENDING": "PENDING", "SUBMITTED": "PENDING", "STARTING": "PENDING", "SETTING_UP": "PENDING",
    "RUNNING": "RUNNING", "WINDING_DOWN": "RUNNING", "CANCELLING": "RUNNING", "RECOVERING": "PENDING",
    "SUCCEEDED": "COMPLETED", "CANCELLED": "CANCELLED",
    "FAILED": "FAILED", "FAILED_SETUP": "FAILED", "FAILED_PRECHECKS": "FAILED", "FAILED_NO_RESOURCE": "FAILED",
    "FAILED_CONTROLLER": "FAILED", "FAILED_DRIVER": "FAILED",
}


class SkyPilotPlanError(UserError, ValueError):
    """SkyPilot's own schema or ``sky.Task`` construction rejected the planned task; the message names the field."""


@dataclasses.dataclass(frozen=True)
class SkyRef:
    """A SkyPilot job: a managed job (``cluster`` None) or job ``job_id`` on an on-demand ``cluster``."""

    job_id: str
    cluster: str | None = None

    @property
    def ids(self) -> list[str]:
        return [f"{self.cluster}:{self.job_id}" if self.cluster else self.job_id]

    def cli(self, verb: str) -> str:
        """The SkyPilot command for this job (``sky jobs logs 12``, ``sky logs dev 3``)."""
        return f"sky {verb} {self.cluster} {self.job_id}" if self.cluster else f"sky jobs {verb} {self.job_id}"


def parse_result(log_text: str) -> dict[str, tp.Any] | None:
    """The job's final metrics from its log: the last :data:`RESULT_MARK` line (None when there is none)."""
    for line in reversed(log_text.splitlines()):
        if RESULT_MARK in line:
            with contextlib.suppress(ValueError):
                return json.loads(line.split(RESULT_MARK, 1)[1])
    return None


def sky_module() -> tp.Any:
    """``import sky`` (~2 s, creates ~/.sky), keeping its database migrations' INFO lines out of the job log."""
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger("alembic").level))
    import sky

    return sky


def validate(task: tp.Mapping[str, tp.Any]) -> None:
    """Check a task dict offline with SkyPilot's own schema (``common_utils.validate_schema``) and construction
    (``sky.Task.from_yaml_config``: resources, storage). Catches unknown fields, bad infra, accelerator format,
    ``disk_size``/``num_nodes`` <= 0, non-bool ``use_spot``, env names; not regions or accelerators a cloud lacks
    (that needs SkyPilot's catalog). Raises SkyPilotPlanError quoting SkyPilot's message, which names the field."""
    sky = sky_module()
    from sky.utils import common_utils, schemas

    try:
        common_utils.validate_schema(copy.deepcopy(dict(task)), schemas.get_task_schema(), "Invalid task YAML: ")
        # it pops keys from its argument; envs planned as null get their values at launch ("" here)
        later = [(k, "") for k, v in (task.get("envs") or {}).items() if v is None]
        sky.Task.from_yaml_config(copy.deepcopy(dict(task)), env_overrides=later or None)
    except Exception as e:  # ValueError, InvalidSkyPilotConfigError, StorageSpecError, ...
        raise SkyPilotPlanError(f"SkyPilot rejects the planned task ({TASK_FILE}): {e}") from e


def validate_all(tasks: tp.Sequence[tp.Mapping[str, tp.Any]]) -> None:
    """:func:`validate` for each task, in order (one bridge call for a sweep)."""
    for task in tasks:
        validate(task)


def launch_values(request: Request, environ: tp.Mapping[str, str]) -> tuple[list[tuple[str, str]],
                                                                             list[tuple[str, str]]]:
    """``(envs, secrets)``: the value of every variable planned as ``null``, expanded in ``environ`` (in memory
    only). Raises PreflightError naming the field whose reference is unset without a default."""
    envs: list[tuple[str, str]] = []
    secrets: list[tuple[str, str]] = []
    for e in request.env:
        (secrets if e.secret else envs).append((e.name, expand(e.parts, environ, e.key)))
    return envs, secrets


def build_task(request: Request, environ: tp.Mapping[str, str]) -> tp.Any:
    """The ``sky.Task`` to launch, with the values of ``null`` envs and secrets taken from ``environ``, as
    ``sky launch --env/--secret`` gives them. Raises PreflightError naming the field of an unset reference."""
    sky = sky_module()
    envs, secrets = launch_values(request, environ)
    return sky.Task.from_yaml_config(copy.deepcopy(request.task), env_overrides=envs or None,
                                     secrets_overrides=secrets or None)


def _one_line(error: tp.Any, limit: int = 300) -> str:
    """An error message on one line (lines joined, terminal colour codes dropped), at most ``limit`` characters."""
    text = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(error)).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def _api_server_is_local(sky: tp.Any) -> bool:
    """Whether SkyPilot's SDK talks to an API server on this machine (which it starts by itself when it is down):
    no endpoint set (``SKYPILOT_API_SERVER_ENDPOINT`` or ``api_server.endpoint`` of SkyPilot's config) or a
    loopback one."""
    from urllib.parse import urlparse

    from sky import skypilot_config

    endpoint = os.environ.get("SKYPILOT_API_SERVER_ENDPOINT") or skypilot_config.get_nested(
        ("api_server", "endpoint"), None)
    return not endpoint or urlparse(str(endpoint)).hostname in ("127.0.0.1", "localhost", "::1", "0.0.0.0")


def _api_server_up(sky: tp.Any) -> bool:
    """Whether the API server answers now (``sky.api_info`` does not start one)."""
    try:
        sky.api_info()
    except Exception:
        return False
    return True


def local_server_down(sky: tp.Any) -> bool:
    """Whether the SDK would start a local API server on its next request: the server is local and does not answer
    (neither check starts one)."""
    return _api_server_is_local(sky) and not _api_server_up(sky)


def cloud_problem(sky: tp.Any, cloud: str | None) -> str | None:
    """None when SkyPilot has credentials for ``cloud`` on this machine (for any cloud it knows, when None), else
    one line naming the cause and ``sky check``. Asks each cloud what ``sky check`` asks it
    (``Cloud.check_credentials``), in this process: seconds, and no API server is started."""
    from sky import clouds

    reasons = []
    names = [cloud] if cloud else sorted(sky.CLOUD_REGISTRY, key=lambda n: (n not in SKYPILOT_CLOUDS, n))
    for name in names:
        try:
            ok, reason = sky.CLOUD_REGISTRY.from_str(name).check_credentials(clouds.CloudCapability.COMPUTE)
        except Exception as e:
            ok, reason = False, e
        if ok:
            return None
        if isinstance(reason, dict):
            reason = "; ".join(f"{k}: {v}" for k, v in reason.items())
        reasons.append(f"{name}: {_one_line(reason, 160)}")
    if cloud:
        return (f"SkyPilot cannot launch on {cloud} from this machine: no usable credentials ({reasons[0]}); "
                f"run `sky check {cloud}` and fix what it reports")
    return (f"SkyPilot cannot launch from this machine: no cloud has usable credentials ({'; '.join(reasons[:2])}; "
            "...); run `sky check` and fix what it reports, or set skypilot.cloud")


def launch_error(sky: tp.Any, error: Exception) -> Exception:
    """A launch failure the user fixes on this machine as one line naming the cause and ``sky check``: no cloud
    access (``NoCloudAccessError``), no network (SkyPilot fetches its catalogs and calls the cloud's API). Any
    other error of SkyPilot's is a SubmitError with SkyPilot's own message (e.g. ``Failed to setup with return
    code 1``)."""
    if isinstance(error, sky.exceptions.NoCloudAccessError):
        return PreflightError(f"SkyPilot has no cloud access from this machine ({_one_line(error)}); run `sky check`"
                              " and fix what it reports")
    text = str(error)
    network = ("ConnectionError", "NameResolutionError", "Failed to resolve", "Max retries exceeded",
               "Temporary failure in name resolution", "Network is unreachable")
    if any(word in text for word in network):
        host = re.search(r"host='([^']+)'", text)
        where = host.group(1) if host else "the network"
        return PreflightError(f"SkyPilot cannot reach {where} from this machine ({type(error).__name__}: no network?);"
                              " check the connection, then run `sky check`")
    return SubmitError(f"SkyPilot: {type(error).__name__}: {_one_line(error)}")


def raw_states(refs: tp.Sequence[SkyRef]) -> list[str]:
    """SkyPilot's status name for each job (managed jobs in one queue call; cluster jobs per cluster)."""
    sky = sky_module()
    out = {r: "UNKNOWN" for r in refs}
    managed = [int(r.job_id) for r in refs if r.cluster is None]
    if managed:
        records = sky.get(sky.jobs.queue_v2(refresh=False, job_ids=managed))
        records = records[0] if isinstance(records, tuple) else records
        by_id = {str(r.get("job_id")): getattr(r.get("status"), "value", str(r.get("status"))) for r in records}
        out.update({r: by_id.get(r.job_id, "UNKNOWN") for r in refs if r.cluster is None})
    by_cluster: dict[str, list[SkyRef]] = {}
    for r in refs:
        if r.cluster is not None:
            by_cluster.setdefault(r.cluster, []).append(r)
    for cluster, crefs in by_cluster.items():
        statuses = sky.get(sky.job_status(cluster, job_ids=[int(r.job_id) for r in crefs]))
        for r in crefs:
            status = statuses.get(int(r.job_id))
            out[r] = getattr(status, "value", str(status)) if status is not None else "UNKNOWN"
    return [out[r] for r in refs]


def states_here(refs: tp.Sequence[SkyRef]) -> list[str] | None:
    """:func:`raw_states`, or None when the local API server is down (asking would start one)."""
    return None if local_server_down(sky_module()) else raw_states(refs)


def cancel(refs: tp.Sequence[SkyRef]) -> None:
    """``sky.jobs.cancel`` (managed) or ``sky.cancel`` on the job's cluster, for each job."""
    sky = sky_module()
    for ref in refs:
        sky.get(sky.cancel(ref.cluster, job_ids=[int(ref.job_id)]) if ref.cluster
                else sky.jobs.cancel(job_ids=[int(ref.job_id)]))


def fetch_result(ref: SkyRef) -> dict[str, tp.Any] | None:
    """Node 0's result line from the finished job's log (``sky.jobs.tail_logs`` / ``sky.tail_logs``, not followed)."""
    sky, buf = sky_module(), io.StringIO()
    try:
        if ref.cluster:
            sky.tail_logs(ref.cluster, int(ref.job_id), follow=False, output_stream=buf)
        else:
            sky.jobs.tail_logs(job_id=int(ref.job_id), follow=False, output_stream=buf)
    except Exception as e:  # the result is a convenience: the job's state is what counts
        log.warning("could not read the log of SkyPilot job %s: %s", ref.ids[0], e)
    return parse_result(buf.getvalue())


def launch(rq: Request, access: dict[str | None, str | None]) -> SkyRef:
    """Launch one planned task: ``sky.jobs.launch`` (spot) or ``sky.launch`` (on-demand cluster), followed
    (``sky.stream_and_get``: provisioning and setup logs) until it returns its id.

    With the API server on this machine, the task's cloud is first checked for credentials in this process
    (:func:`cloud_problem`, cached in ``access`` per cloud), so a machine without them fails in seconds and starts
    nothing. If the launch fails and this call started SkyPilot's local API server (the SDK starts one, ~1 GB in 8
    processes, on first use), ``sky.api_stop()`` stops it again. Raises PreflightError (one line: no credentials,
    no network; and ``sky check``) or SubmitError (SkyPilot's own message, e.g. ``Failed to setup with return
    code 1``)."""
    sky = sky_module()
    task = build_task(rq, os.environ)
    local = _api_server_is_local(sky)
    if local:
        if rq.cloud not in access:
            access[rq.cloud] = cloud_problem(sky, rq.cloud)
        problem = access[rq.cloud]
        if problem is not None:
            raise PreflightError(problem)
    started_here = local and not _api_server_up(sky)
    try:
        request = (sky.jobs.launch(task, name=rq.name) if rq.managed else
                   sky.launch(task, cluster_name=rq.cluster_name,
                              idle_minutes_to_autostop=rq.idle_minutes_to_autostop, down=rq.down))
        job_id, _handle = sky.stream_and_get(request)
    except Exception as e:
        if started_here:
            log.info("stopping the SkyPilot API server this launch started (sky.api_stop)")
            with contextlib.suppress(Exception):
                sky.api_stop()
        raise launch_error(sky, e) from e
    return SkyRef(str(job_id[0] if isinstance(job_id, (list, tuple)) else job_id),
                  None if rq.managed else rq.cluster_name)


def wait(subs: tp.Sequence[Submission[SkyRef]], poll_s: float, retries: int) -> list[JobResult]:
    """:meth:`SkyPilot.wait <automodel_hydra.backends.skypilot.SkyPilot.wait>`: poll every ``poll_s`` seconds (in
    one process, so through the bridge ``sky`` is imported once per wait, not once per poll)."""
    results: dict[int, JobResult] = {}
    last: dict[int, str] = {}
    failures = 0
    while len(results) < len(subs):
        pending = [i for i in range(len(subs)) if i not in results]
        try:
            raw, failures = raw_states([subs[i].ref for i in pending]), 0
        except Exception as e:  # API server unreachable, cluster already torn down, ...
            raw, failures = [], failures + 1
            log.warning("cannot query SkyPilot (%d/%d): %s", failures, retries, e)
            if failures >= retries:
                results.update({i: JobResult(JobState.UNKNOWN, error=f"cannot query SkyPilot: {e}; logs: "
                                             f"{subs[i].log_path}") for i in pending})
        for i, name in zip(pending, raw):
            s, state = subs[i], JobState(STATE.get(name, "UNKNOWN"))
            if last.get(i) != name:
                log.info("SkyPilot job %s (%s): %s", s.ref.ids[0], s.plan.request.name, name)
                last[i] = name
            if state is JobState.COMPLETED:  # no result printed by node 0: no COMPLETED (automodel_hydra.outcome)
                value = fetch_result(s.ref)
                verdict = outcome.derive(s.plan.job, state, result=value is not None)
                results[i] = JobResult(verdict.state, value or {"sky_status": name},
                                       None if verdict.state is JobState.COMPLETED else
                                       f"SkyPilot {name}, and node 0 printed no result; logs: {s.log_path}")
            elif state.final:
                results[i] = JobResult(state, {"sky_status": name}, f"SkyPilot {name}; logs: {s.log_path}")
        if len(results) < len(subs):
            time.sleep(poll_s)
    return [results[i] for i in range(len(subs))]

