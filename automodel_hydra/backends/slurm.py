"""Slurm backend: one sbatch job per run, one job array per sweep, built on submitit.

Planning is pure: :func:`plan` maps ``cfg.slurm`` (SPEC section 2) onto the parameters of submitit's own script
generator, ``submitit.slurm.slurm._make_sbatch_string``, whose signature is the list of sbatch options it knows
(sbatch(1) for each). :func:`submit` is the side effect: ``sbatch launch/sbatch.sh`` (the exact file the job dir
keeps), and each job becomes a real submitit ``SlurmJob``, which :func:`wait`, :func:`status` and :func:`cancel`
use (state from ``sacct``, or ``squeue`` when accounting is off; ``scancel``).

What each srun task runs: the plain worker command, ``python -u -m automodel_hydra.worker
"$AUTOMODEL_JOB_DIR"/launch/job.yaml --log-file ...``, not submitit's pickle runner (``python -m
submitit.core._submit``). Why:

* the script reads as what it does and can be resubmitted by hand (``sbatch launch/sbatch.sh``); the config is
  ``launch/job.yaml``, not a pickle;
* a requeued job must resume from its checkpoint, not report the pickled result of its first attempt;
  submitit's runner writes a result pickle whenever the function returns, including after a requeue;
* the coordinated checkpoint on USR2/SIGTERM is the worker's (every rank, one step); submitit's handler
  checkpoints rank 0 only;
* a job array needs no per-task pickle in place before it starts: task i reads ``job_dirs[i]``.

So ``job.result()`` is not used: rank 0 writes ``<job dir>/result.json`` (atomic) and :func:`wait` reads it once
the job's state is COMPLETED.

Files: ``launch/sbatch.sh`` in a job dir is the script that was submitted. A sweep job's plan is first its own
one-job script (what a dry run leaves; ``sbatch`` it to rerun that point alone); on submission it is replaced by
the array script, which is also ``<sweep dir>/launch/sbatch.sh``. Logs: ``slurm/<id>_<rank>_log.out`` in the job
dir (arrays: ``slurm/<array id>_<task>_<rank>_log.out`` in the sweep dir).

Runtime contract (set in the script, read by :mod:`automodel_hydra.bootstrap`): MASTER_ADDR = first host of
``scontrol show hostnames "$SLURM_JOB_NODELIST"``; MASTER_PORT = ``slurm.master_port + SLURM_JOB_ID % 1000``,
computed once in the batch step so every task of a job agrees, different for jobs (array tasks included) that
share a node, moved up by 1000 while a port is already in use on the master node, and logged.
"""

from __future__ import annotations

import codecs
import dataclasses
import functools
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

from automodel_hydra.bootstrap import PORT_SPAN
from automodel_hydra.config import SlurmConfig, TrainConfig, parse_env_vars
from automodel_hydra.envvars import export_lines
from automodel_hydra.plan import FINISHED, JobResult, JobSpec, Plan, Submission, worker_argv
from automodel_hydra.profile import nsys_check_lines, nsys_prefix

log = logging.getLogger(__name__)

NAME = "slurm"
SCRIPT = "sbatch.sh"
#: The variable holding the job's output dir inside the script (array task i: ``job_dirs[i]``).
JOB_DIR_VAR = "AUTOMODEL_JOB_DIR"
_JOB_DIR = "/@AUTOMODEL_JOB_DIR@"  # stands for "$AUTOMODEL_JOB_DIR" while argv is built
#: Slurm's default MaxArraySize (slurm.conf(5)): array indices 0..MaxArraySize-1.
DEFAULT_MAX_ARRAY_SIZE = 1001
#: Defaults every task gets; the submitting shell's value or an ``env_vars`` entry wins.
TASK_DEFAULTS = {
    "NCCL_DEBUG": "WARN",  # NCCL prints warnings and errors, not its INFO chatter
    "OMP_NUM_THREADS": "${SLURM_CPUS_PER_TASK:-1}",  # srun (unlike torchrun) sets no thread count
}


@dataclasses.dataclass(frozen=True)
class Payload:
    """Everything a job's script needs except its output dir; equal payloads share one job array."""

    sbatch: tuple[tuple[str, tp.Any], ...]  # _make_sbatch_string parameters
    setup: tuple[str, ...]  # script lines before srun, after the job-dir line
    container_image: str | None
    mounts: tuple[str, ...]  # "src:dst" for --container-mounts, besides the output dirs
    srun_args: tuple[str, ...]
    command: str  # what each task runs; refers to "$AUTOMODEL_JOB_DIR"
    env_refs: tuple[str, ...]  # submitting-shell variables env_vars refers to ("${HF_TOKEN}" -> HF_TOKEN)
    ntasks: int
    wait: bool  # single run: slurm.wait; sweep: not slurm.detach


# ----------------------------------------------------------------------------------------------- planning (pure)


def _sh(arg: str) -> str:
    """Quote one argument for bash, turning the job-dir stand-in into ``"$AUTOMODEL_JOB_DIR"``."""
    parts = str(arg).split(_JOB_DIR)
    return f'"${JOB_DIR_VAR}"'.join(shlex.quote(p) if p or len(parts) == 1 else "" for p in parts)


def _sbatch_params(sc: SlurmConfig) -> dict[str, tp.Any]:
    """``cfg.slurm`` as ``_make_sbatch_string`` keyword arguments; unset options are left out (never ``None``)."""
    gpus = sc.ntasks_per_node if sc.gpus_per_node is None else sc.gpus_per_node
    extra: dict[str, tp.Any] = {"requeue": True} if sc.max_requeues > 0 else {}
    for key, value in sc.sbatch_args.items():
        if value is not False:  # null = a flag (#SBATCH --key), false = leave it out
            extra[str(key).lstrip("-")] = True if value is None else value
    params = dict(job_name=sc.job_name, time=sc.time_minutes, nodes=sc.nodes, ntasks_per_node=sc.ntasks_per_node,
                  gpus_per_node=gpus or None, cpus_per_task=sc.cpus_per_task, mem=sc.mem, account=sc.account,
                  partition=sc.partition, qos=sc.qos, constraint=sc.constraint, exclude=sc.exclude,
                  signal_delay_s=sc.signal_delay_s, array_parallelism=sc.array_parallelism,
                  stderr_to_stdout=True, additional_parameters=extra)
    # wckey=None: no `--wckey=submitit` (submitit's default), which clusters enforcing wckeys would reject
    return {**{k: v for k, v in params.items() if v is not None and v != ""}, "wckey": None}


def _mount(source: str, dest: str, key: str) -> str:
    for path in (source, dest):
        if "," in path or ":" in path:
            raise ValueError(f"{key}: {path!r} contains ',' or ':', which srun --container-mounts cannot express")
    return f"{source}:{dest}"


def plan(cfg: TrainConfig, job: JobSpec) -> Plan:
    """Plan one Slurm job (pure): ``launch/sbatch.sh`` for ``cfg.slurm`` and the job dir ``job.job_dir``.

    Raises
    ------
    ValueError
        A value cannot be written into the script: a newline in an ``#SBATCH`` option (sbatch reads one option
        per line), or ``,``/``:`` in a container mount path (Pyxis' ``--container-mounts`` syntax).
    """
    sc = cfg.slurm
    assert sc is not None, "plan() needs a config with a slurm: section"
    hf_home = os.path.expanduser(sc.hf_home) if sc.hf_home else None
    in_container = sc.container_image is not None
    python = "python" if in_container else sys.executable
    if in_container and sc.nemo_mount:
        pythonpath = f"export PYTHONPATH={shlex.quote(sc.nemo_mount)}"  # the host's PYTHONPATH means nothing there
    elif in_container:
        pythonpath = "# PYTHONPATH: automodel_hydra is expected to be installed in the image"
    else:
        pythonpath = f"export PYTHONPATH={shlex.quote(str(job.project_root))}${{PYTHONPATH:+:$PYTHONPATH}}"
    setup = [
        f"# {sc.job_name}: {sc.nodes} node(s) x {sc.ntasks_per_node} task(s) = world size {sc.world_size}; "
        "planned by automodel-hydra",
        pythonpath,
        "export PYTHONUNBUFFERED=1",
        f"export AUTOMODEL_MAX_REQUEUES={sc.max_requeues}  # requeues after a time-limit/preemption signal",
        "# rendezvous: the first host of the allocation, and a port per job, the same for all its tasks:",
        f"# slurm.master_port + job id % {PORT_SPAN}, moved up by {PORT_SPAN} while taken on the master",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"export MASTER_PORT=$(({sc.master_port} + SLURM_JOB_ID % {PORT_SPAN}))",
        'if [ "${SLURMD_NODENAME:-}" = "$MASTER_ADDR" ]; then',
        f'  while [ "$MASTER_PORT" -le {65535 - PORT_SPAN} ] && (: <"/dev/tcp/127.0.0.1/$MASTER_PORT") 2>/dev/null; '
        f"do MASTER_PORT=$((MASTER_PORT + {PORT_SPAN})); done",
        "fi",
        'echo "automodel-hydra: job ${SLURM_JOB_ID} rendezvous at ${MASTER_ADDR}:${MASTER_PORT}" >&2',
        "# task defaults (the submitting shell's value or slurm.env_vars wins)",
        *[f'export {k}="${{{k}:-{v}}}"' for k, v in TASK_DEFAULTS.items()],
    ]
    if hf_home:
        setup.append(f"export HF_HOME={shlex.quote(hf_home)}")
    env = parse_env_vars(sc.env_vars, "slurm.env_vars")
    if env:
        setup += ["# slurm.env_vars (\"${VAR}\" = the submitting shell's variable, expanded here)", *export_lines(env)]
    mounts = []
    if in_container:
        if hf_home:
            mounts.append(_mount(hf_home, hf_home, "slurm.hf_home"))
        if sc.nemo_mount:
            mounts.append(_mount(str(job.project_root), sc.nemo_mount, "slurm.nemo_mount"))
        mounts += [_mount(m.source, m.dest, f"slurm.extra_mounts[{i}]") for i, m in enumerate(sc.extra_mounts)]
    if sc.extra_mounts:
        sources = " ".join(shlex.quote(m.source) for m in sc.extra_mounts)
        setup += [f"for src in {sources}; do  # slurm.extra_mounts, checked again on the node",
                  '  [ -e "$src" ] || { echo "automodel-hydra: mount source $src (slurm.extra_mounts) does not exist '
                  'on $(hostname)" >&2; exit 1; }', "done"]
    setup += nsys_check_lines(cfg.profile.nsys)
    if sc.setup:
        setup += ["# slurm.setup", *sc.setup]
    spec = JobSpec(Path(_JOB_DIR), job.job_name)
    prefix = nsys_prefix(cfg.profile.nsys, _JOB_DIR, job.job_name, rank_var="SLURM_PROCID")
    command = " ".join(_sh(a) for a in [*prefix, *worker_argv(spec, python=python)])
    params = _sbatch_params(sc)
    params["additional_parameters"] = tuple(sorted(params["additional_parameters"].items()))
    payload = Payload(sbatch=tuple(sorted(params.items())), setup=tuple(setup), container_image=sc.container_image,
                      mounts=tuple(mounts), srun_args=tuple(sc.srun_args), command=command,
                      env_refs=tuple(e.ref for e in env if e.ref), ntasks=sc.world_size,
                      wait=sc.wait if job.job_num is None else not sc.detach)
    return Plan(NAME, job, {SCRIPT: render(payload, [job.job_dir])}, payload, group_key=payload)


def render(payload: Payload, job_dirs: tp.Sequence[Path], array: bool = False) -> str:
    """The sbatch script for one job (``array=False``) or for a job array whose task i runs ``job_dirs[i]``.

    Logs go to ``<root>/slurm/%j_%t_log.out`` (arrays: ``%A_%a_%t``), root = the job dir, or for an array the
    common parent of its job dirs. Raises ValueError on a newline in an ``#SBATCH`` value."""
    from submitit.slurm.slurm import _make_sbatch_string

    root = log_root(job_dirs, array)
    params = dict(payload.sbatch)
    params["additional_parameters"] = dict(params["additional_parameters"])
    directives = {**params, **params["additional_parameters"], "output": str(root)}
    for key, value in directives.items():
        if isinstance(value, str) and ("\n" in value or "\r" in value):
            raise ValueError(f"#SBATCH --{key.replace('_', '-')}={value!r}: sbatch reads one option per line, "
                             "so the value cannot contain a newline")
    if array:
        select = ["# array task i runs the job in job_dirs[i]", "job_dirs=(", *[f"  {shlex.quote(str(d))}"
                  for d in job_dirs], ")", f'export {JOB_DIR_VAR}="${{job_dirs[$SLURM_ARRAY_TASK_ID]}}"']
    else:
        select = [f"export {JOB_DIR_VAR}={shlex.quote(str(job_dirs[0]))}"]
    srun = ["--kill-on-bad-exit=1"]
    if payload.container_image:
        mounts = [*payload.mounts, _mount(str(root), str(root), "output dir")]
        srun += [f"--container-image={payload.container_image}", f"--container-mounts={','.join(mounts)}",
                 f"--container-workdir={root}"]
    srun += payload.srun_args
    setup = [payload.setup[0], *select, *payload.setup[1:]]
    folder = str(root / "slurm").replace("%", "%%")  # sbatch(1) "filename pattern": %% is a literal %
    text = _make_sbatch_string(command=payload.command, folder=folder, setup=setup, srun_args=srun,
                               map_count=len(job_dirs) if array else None, **params)
    # issue 7: sbatch's #SBATCH parser reads a backslash as an escape even inside quotes (src/sbatch/opt.c,
    # _get_argument), so a run dir "a\ b" came out as "a  b" for --output; bash never reads these lines
    return "\n".join(line.replace("\\", "\\\\") if line.startswith("#SBATCH") else line for line in text.split("\n"))


def log_root(job_dirs: tp.Sequence[Path], array: bool) -> Path:
    """Where the ``slurm/`` log folder lives: the job dir, or for an array the common parent of its job dirs."""
    if not array:
        return Path(job_dirs[0])
    return Path(os.path.commonpath([str(Path(d).parent) for d in job_dirs]))


@functools.lru_cache(maxsize=None)
def max_array_size() -> int:
    """The cluster's MaxArraySize (``scontrol show config``); Slurm's default 1001 when it cannot be read."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_MAX_ARRAY_SIZE
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
    return int(m.group(1)) if m else DEFAULT_MAX_ARRAY_SIZE


def _arrays(plans: tp.Sequence[Plan], size: int) -> list[tuple[str, list[Plan]]]:
    """Split one group into arrays of at most ``size`` tasks, each named after its first job."""
    out = []
    for i in range(0, len(plans), size):
        chunk = list(plans[i:i + size])
        num = chunk[0].job.job_num
        out.append((SCRIPT if not num else f"sbatch_{num}.sh", chunk))
    return out


def sweep_files(plans: tp.Sequence[Plan], sweep_dir: Path) -> dict[str, str]:
    """The sweep-level plan of one group: the array script(s), ``{"sbatch.sh": text}`` (more than one when the
    group exceeds MaxArraySize: ``sbatch_<first job num>.sh``). The driver writes them to ``<sweep_dir>/launch/``."""
    size = max_array_size()
    return {name: render(chunk[0].payload, [p.job.job_dir for p in chunk], array=True)
            for name, chunk in _arrays(plans, size)}


# ----------------------------------------------------------------------------------------------- side effects


def _check_can_submit(plans: tp.Sequence[Plan]) -> None:
    """sbatch on PATH, container mount sources present, referenced env vars set (a warning)."""
    if shutil.which("sbatch") is None:
        raise RuntimeError("sbatch is not on PATH: run on a Slurm login node, or make the Slurm client available "
                           "(HPC: `module load slurm`; Debian/Ubuntu: `apt-get install slurm-client`)")
    for p in plans:
        for mount in p.payload.mounts:
            source = mount.split(":", 1)[0]
            if not Path(source).exists():
                raise FileNotFoundError(f"container mount source {source} (slurm.hf_home / nemo_mount / "
                                        f"extra_mounts) does not exist; create it or fix the path")
    for ref in sorted({r for p in plans for r in p.payload.env_refs if r not in os.environ}):
        log.warning("slurm.env_vars refers to ${%s}, which is not set in this shell: the job sees it empty", ref)


def _submit_env() -> dict[str, str]:
    """This environment without the variables of an enclosing Slurm job (submitit's ``clean_env``), keeping
    SLURM_CONF, which names the cluster."""
    drop = ("SLURM_", "SLURMD_", "SRUN_", "SUBMITIT_")
    dist = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    return {k: v for k, v in os.environ.items() if k == "SLURM_CONF" or not (k.startswith(drop) or k in dist)}


def _sbatch(script: Path) -> str:
    """Submit ``script``; returns the job id. Raises RuntimeError with sbatch's own message on failure."""
    from submitit.slurm.slurm import SlurmExecutor

    proc = subprocess.run(["sbatch", str(script)], capture_output=True, text=True, env=_submit_env())
    if proc.returncode != 0:
        raise RuntimeError(f"sbatch {script} failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout}")
    return SlurmExecutor._get_job_id_from_submission_command(proc.stdout)


def submit(plans: tp.Sequence[Plan]) -> list[Submission]:
    """Submit one job (a single run) or one job array per MaxArraySize tasks (a sweep group).

    Each job dir's ``launch/sbatch.sh`` is the exact script submitted (for an array: the array script). Returns at
    once; ``Submission.ids`` are Slurm ids (``123``, or ``123_4`` for array task 4)."""
    from automodel_hydra.backends.slurm_parse import AutomodelSlurmJob

    _check_can_submit(plans)
    single = len(plans) == 1 and plans[0].job.job_num is None
    batches = [(SCRIPT, list(plans))] if single else _arrays(plans, max_array_size())
    subs = []
    for _, chunk in batches:
        dirs = [p.job.job_dir for p in chunk]
        text = render(chunk[0].payload, dirs, array=not single)
        root = log_root(dirs, array=not single)
        (root / "slurm").mkdir(parents=True, exist_ok=True)  # sbatch does not create the log folder
        for p in chunk:
            p.job.launch_dir.mkdir(parents=True, exist_ok=True)
            (p.job.launch_dir / SCRIPT).write_text(text)
        started = time.time()
        job_id = _sbatch(chunk[0].job.launch_dir / SCRIPT)
        for i, p in enumerate(chunk):
            jid = job_id if single else f"{job_id}_{i}"
            job = AutomodelSlurmJob(folder=root / "slurm", job_id=jid, tasks=list(range(p.payload.ntasks)))
            subs.append(Submission(p, ids=[jid], log_path=str(job.paths.stdout), handle=(job, started)))
    return subs


def wait(subs: tp.Sequence[Submission], max_poll_s: float = 30.0, lost_after_s: float = 300.0) -> list[JobResult]:
    """Block until every job has finished (requeues included); a single waited-for job has its rank-0 log
    followed on stdout. Returns one JobResult per submission, with ``<job dir>/result.json`` as the value.

    Slurm is asked (one sacct call for all jobs) after 2 s, then less and less often up to every ``max_poll_s``,
    and at once when a job's result.json appears. A job no tool has known for ``lost_after_s`` ends UNKNOWN."""
    from automodel_hydra.backends.slurm_parse import AutomodelSlurmJob, normalize_state

    single = len(subs) == 1 and subs[0].plan.job.job_num is None
    follow = _Follower(Path(str(subs[0].log_path))) if single else None
    results: dict[int, JobResult] = {}
    seen = {i: time.time() for i in range(len(subs))}
    fresh: set[int] = set()
    delay, next_check = 2.0, time.time() + 2.0
    while len(results) < len(subs):
        pending = [i for i in range(len(subs)) if i not in results]
        new = {i for i in pending if i not in fresh and _fresh_result(subs[i])}
        fresh |= new
        if new or time.time() >= next_check:
            AutomodelSlurmJob.watcher.update()
            for i in pending:
                job = subs[i].handle[0]
                state = normalize_state(job.watcher.get_state(job.job_id, mode="cache"))
                if state != "UNKNOWN":
                    seen[i] = time.time()
                elif time.time() - seen[i] > lost_after_s:
                    results[i] = JobResult("UNKNOWN", error=f"job {job.job_id}: neither sacct nor squeue knows it")
                if state in FINISHED:
                    results[i] = _result(subs[i], state)
            delay = 2.0 if new else min(delay * 1.5, max_poll_s)
            next_check = time.time() + delay
        if follow is not None:
            follow.poll()
        if len(results) < len(subs):
            time.sleep(1.0)
    if follow is not None:
        follow.poll()
    return [results[i] for i in range(len(subs))]


def _fresh_result(sub: Submission) -> bool:
    """Whether the job wrote ``result.json`` since it was submitted (not a leftover of an earlier run)."""
    path = sub.plan.job.job_dir / "result.json"
    return path.exists() and path.stat().st_mtime >= sub.handle[1] - 1


def _result(sub: Submission, state: str) -> JobResult:
    if state == "COMPLETED" and _fresh_result(sub):
        return JobResult("COMPLETED", json.loads((sub.plan.job.job_dir / "result.json").read_text()))
    tail = ""
    if sub.log_path and Path(sub.log_path).exists():
        tail = "\n" + "\n".join(Path(sub.log_path).read_text(errors="replace").splitlines()[-30:])
    why = "no result.json was written" if state == "COMPLETED" else f"Slurm state {state}"
    return JobResult("FAILED" if state == "COMPLETED" else state,
                     error=f"job {','.join(sub.ids)}: {why} (log {sub.log_path}){tail}")


class _Follower:
    """Prints what a log file gains (``tail -f``), from its start."""

    def __init__(self, path: Path) -> None:
        self.path, self.pos = path, 0
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a read may end mid-character

    def poll(self) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as f:
            f.seek(self.pos)
            data = f.read()
        self.pos += len(data)
        if data:
            sys.stdout.write(self.decoder.decode(data))
            sys.stdout.flush()


def status(record: dict[str, tp.Any]) -> str:
    """State of a submitted job from its record (``launch/submission.json``): ``sacct``, else ``squeue`` (accounting
    off; finished jobs stay there MinJobAge seconds), else ``UNKNOWN``. Names are Slurm's (:data:`plan.STATES`)."""
    from automodel_hydra.backends.slurm_parse import Watcher, normalize_state

    if not record.get("job_ids"):
        return "UNKNOWN"
    # a watcher of its own: status() may run in another thread (the sweep progress display) than wait()
    return normalize_state(Watcher().get_state(str(record["job_ids"][0]), mode="force"))


def cancel(record: dict[str, tp.Any]) -> None:
    """``scancel`` every id of the record (a requeued job is cancelled too; it checkpoints only on USR2)."""
    from automodel_hydra.backends.slurm_parse import AutomodelSlurmJob

    for jid in record["job_ids"]:
        # issue 6: scancel sends SIGTERM, on which the worker checkpoints and requeues itself (as on a preemption);
        # Requeue=0 first makes that `scontrol requeue` fail, so a cancelled job stays cancelled
        subprocess.run(["scontrol", "update", f"JobId={jid}", "Requeue=0"], capture_output=True, env=_submit_env())
        AutomodelSlurmJob(folder=Path(record["job_dir"]), job_id=str(jid)).cancel(check=False)
