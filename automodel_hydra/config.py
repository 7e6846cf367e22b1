"""Typed schemas for every config section (Hydra ConfigStore) and their validation.

The field names follow NeMo AutoModel's launcher (``SlurmConfig``, ``VolumeMapping``, ``SkyPilotConfig``,
``step_scheduler``, ``restore_from``); ``../shared/SPEC.md`` sections 2, 3 and 6 hold the reference.

Two layers catch bad input before anything is submitted or started:

* compose time: the schemas are registered in Hydra's ConfigStore, so an unknown key (``slurm.nodez``) or a value
  of the wrong type (``slurm.nodes=two``, ``skypilot.use_spot=maybe``) fails while Hydra composes the config,
  naming the key;
* :func:`load` turns the composed config into these dataclasses; each ``__post_init__`` checks value ranges and
  cross-field rules and raises :class:`ConfigError` naming the full key, the bad value and what is valid.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing as tp
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from automodel_hydra.bootstrap import DEFAULT_PORT, PORT_SPAN

#: Default rendezvous port, as in NeMo AutoModel's launcher (one value, owned by the bootstrap that uses it).
DEFAULT_MASTER_PORT = DEFAULT_PORT
#: Slurm's section and SkyPilot's section: the launcher a config routes to (SPEC section 1).
BACKEND_SECTIONS = ("slurm", "skypilot")


class ConfigError(ValueError):
    """A config value is invalid. The message names the full key, the bad value and what is valid."""

    def __init__(self, key: str, value: tp.Any, valid: str) -> None:
        self.key, self.value, self.valid = key, value, valid
        super().__init__(f"{key}={value!r} is invalid: {valid}")


def _require(ok: bool, key: str, value: tp.Any, valid: str) -> None:
    if not ok:
        raise ConfigError(key, value, valid)


def _positive(key: str, value: int | None, minimum: int = 1) -> None:
    if value is not None:
        _require(value >= minimum, key, value, f"must be an integer >= {minimum}")


# ----------------------------------------------------------------------------------------------- time limits

# sbatch(1), option --time: "Acceptable time formats include "minutes", "minutes:seconds", "hours:minutes:seconds",
# "days-hours", "days-hours:minutes" and "days-hours:minutes:seconds"."
_SLURM_TIME = re.compile(r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")


def parse_slurm_time(value: str | int, key: str = "slurm.time") -> int:
    """Parse a Slurm wall-time limit into whole minutes, rounding seconds up.

    Accepts every form sbatch(1) ``--time`` documents: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``, and an integer number of minutes. ``UNLIMITED``/``INFINITE`` and ``0`` (which Slurm reads as
    "no limit") are rejected: a launcher that checkpoints before the limit needs a finite one.

    Returns
    -------
    int
        Minutes, >= 1 (``"00:30:30"`` -> 31, ``"1-00:00:00"`` -> 1440, ``90`` -> 90).

    Raises
    ------
    ConfigError
        The value matches none of the forms, or is zero.
    """
    text = str(value).strip()
    m = _SLURM_TIME.match(text)
    valid = "a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or integer minutes, > 0"
    if not m:
        raise ConfigError(key, value, valid)
    g = {k: int(v) if v is not None else None for k, v in m.groupdict().items()}
    if g["days"] is not None:
        seconds = g["days"] * 86400 + g["dh"] * 3600 + (g["dm"] or 0) * 60 + (g["ds"] or 0)
    elif g["c"] is not None:  # HH:MM:SS
        seconds = g["a"] * 3600 + g["b"] * 60 + g["c"]
    elif g["b"] is not None:  # MM:SS
        seconds = g["a"] * 60 + g["b"]
    else:  # MM
        seconds = g["a"] * 60
    _require(seconds > 0, key, value, valid)
    return math.ceil(seconds / 60)


# ----------------------------------------------------------------------------------------------- env vars

_SHELL_REF = re.compile(r"^\$\{(?:oc\.env:)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOOKS_LIKE_VAR = re.compile(r"^[A-Z][A-Z0-9_]*_[A-Z0-9_]*$|^[A-Z]{2,}$")


@dataclass(frozen=True)
class EnvValue:
    """One ``env_vars`` entry. ``ref`` names a variable of the submitting shell (``"${HF_TOKEN}"``), expanded
    where the job runs and never written anywhere; otherwise ``literal`` is the value itself."""

    name: str
    literal: str | None = None
    ref: str | None = None

    def resolve(self, environ: tp.Mapping[str, str]) -> str:
        """The value for the job: the literal, or the referenced variable of ``environ`` ("" when unset)."""
        return self.literal if self.ref is None else environ.get(self.ref, "")


def parse_env_vars(raw: tp.Mapping[str, tp.Any], key: str) -> list[EnvValue]:
    """Split raw (unresolved) ``env_vars`` into literals and references to the submitting shell (SPEC section 4).

    ``"${VAR}"`` and ``"${oc.env:VAR}"`` are references; any other string is a literal. A literal that looks like
    a variable name (``HF_TOKEN: HF_TOKEN``) is kept, with a warning that it is not expanded.
    """
    out = []
    for name, value in raw.items():
        _require(bool(_ENV_NAME.match(str(name))), f"{key}.{name}", value, "variable names are [A-Za-z_][A-Za-z0-9_]*")
        text = "" if value is None else str(value)
        m = _SHELL_REF.match(text)
        if m:
            out.append(EnvValue(str(name), ref=m.group("name")))
            continue
        if _LOOKS_LIKE_VAR.match(text):
            warnings.warn(
                f"{key}.{name}={text!r} is passed as the literal string {text!r}; write '${{{text}}}' to pass the "
                f"submitting shell's ${text} instead",
                stacklevel=2,
            )
        out.append(EnvValue(str(name), literal=text))
    return out


# ----------------------------------------------------------------------------------------------- recipe


@dataclass
class ModelConfig:
    """The causal LM. With ``name_or_path`` unset, a small Llama is built from the sizes below (no download)."""

    # Hugging Face model id or local directory; null = build from the sizes below
    name_or_path: tp.Optional[str] = None
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 128

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size"):
            _positive(f"model.{name}", getattr(self, name))
        _require(self.hidden_size % self.num_heads == 0, "model.hidden_size", self.hidden_size,
                 f"must be divisible by model.num_heads={self.num_heads}")


@dataclass
class DataConfig:
    """Training text. ``source: pydoc`` is the Python documentation that ships with every CPython
    (``pydoc_data.topics``): real English and code, no download. ``source: file`` reads ``path``; ``source: jsonl``
    reads prompt/answer rows from ``path`` (loss on the answer only)."""

    source: str = "pydoc"
    # a UTF-8 file, used when source is "file" (text) or "jsonl" (one JSON object per line)
    path: tp.Optional[str] = None
    # tokens (bytes) per sample
    seq_len: int = 64
    # source "jsonl": the fields of each row holding the prompt (no loss) and the answer (the loss)
    prompt_field: str = "prompt"
    answer_field: str = "answer"

    def __post_init__(self) -> None:
        _require(self.source in ("pydoc", "file", "jsonl"), "data.source", self.source, "one of pydoc, file, jsonl")
        if self.source in ("file", "jsonl"):
            _require(bool(self.path) and Path(str(self.path)).is_file(), "data.path", self.path,
                     f"an existing UTF-8 file when data.source={self.source}")
        _positive("data.seq_len", self.seq_len, 2)


@dataclass
class StepSchedulerConfig:
    """Steps are optimizer steps, counted from 1."""

    max_steps: int = 100
    # save a checkpoint every N steps (AutoModel's ckpt_every_steps is accepted as an alias)
    checkpoint_interval: int = 50
    # write metrics.jsonl and the progress line every N steps
    log_interval: int = 10
    # samples per rank per micro-batch
    local_batch_size: int = 4
    # samples per optimizer step over all ranks; null = local_batch_size * world_size (no accumulation)
    global_batch_size: tp.Optional[int] = None
    # AutoModel alias of checkpoint_interval
    ckpt_every_steps: tp.Optional[int] = None
    # validation loss (held-out data) every N steps and at the last step; null = at the last step only
    val_every_steps: tp.Optional[int] = None

    def __post_init__(self) -> None:
        if self.ckpt_every_steps is not None:
            _positive("step_scheduler.ckpt_every_steps", self.ckpt_every_steps)
            self.checkpoint_interval = self.ckpt_every_steps
        _positive("step_scheduler.max_steps", self.max_steps)
        _positive("step_scheduler.checkpoint_interval", self.checkpoint_interval)
        _positive("step_scheduler.log_interval", self.log_interval)
        _positive("step_scheduler.val_every_steps", self.val_every_steps)
        _positive("step_scheduler.local_batch_size", self.local_batch_size)
        _positive("step_scheduler.global_batch_size", self.global_batch_size)

    def grad_accumulation(self, world_size: int) -> int:
        """Micro-batches per optimizer step so that ``global_batch_size`` samples are seen per step.

        Raises ConfigError when global_batch_size is not a multiple of local_batch_size * world_size."""
        if self.global_batch_size is None:
            return 1
        per_micro = self.local_batch_size * world_size
        _require(self.global_batch_size % per_micro == 0, "step_scheduler.global_batch_size", self.global_batch_size,
                 f"must be a multiple of local_batch_size * world_size = {per_micro}")
        return self.global_batch_size // per_micro


@dataclass
class OptimConfig:
    lr: float = 3e-3
    weight_decay: float = 0.0
    # linear warm-up steps, then cosine decay to min_lr_ratio * lr at max_steps
    warmup_steps: int = 5
    min_lr_ratio: float = 0.1

    def __post_init__(self) -> None:
        _require(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        _require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")


@dataclass
class CheckpointConfig:
    enabled: bool = True
    # where step-N checkpoints go; null = <output_dir>/checkpoints
    dir: tp.Optional[str] = None
    # torch.distributed.checkpoint.async_save: training continues while the checkpoint is written
    async_save: bool = False
    # keep only the newest K complete checkpoints (0 = keep all); the newest and the one resumed from always stay
    keep_latest_k: int = 3
    # AutoModel alias of restore_from.path
    restore_from: tp.Optional[str] = None

    def __post_init__(self) -> None:
        _require(self.keep_latest_k >= 0, "checkpoint.keep_latest_k", self.keep_latest_k, "must be >= 0")


@dataclass
class RestoreFromConfig:
    # "latest" = newest complete checkpoint in checkpoint.dir (fresh start when none); a checkpoint path; or null
    path: tp.Optional[str] = "latest"


# ----------------------------------------------------------------------------------------------- profiling


@dataclass
class NsysConfig:
    """Nsight Systems (``nsys profile``) around every rank. Profiling is diagnostic: keep runs short."""

    enabled: bool = False
    # nsys --trace
    trace: str = "cuda,nvtx,osrt"
    # where the .nsys-rep files go; null = the job's output dir
    output_dir: tp.Optional[str] = None
    # capture range in training steps: cudaProfilerStart before start_step, stop after stop_step
    start_step: int = 2
    stop_step: int = 4
    # nsys --delay / --duration in seconds (null = unset)
    delay_s: tp.Optional[int] = None
    duration_s: tp.Optional[int] = None
    # more nsys profile arguments, one list item per argument
    extra_args: tp.List[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        _positive("profile.nsys.start_step", self.start_step)
        _require(self.stop_step >= self.start_step, "profile.nsys.stop_step", self.stop_step,
                 f"must be >= profile.nsys.start_step={self.start_step}")


@dataclass
class ProfileConfig:
    nsys: NsysConfig = field(default_factory=NsysConfig)


# ----------------------------------------------------------------------------------------------- launchers


@dataclass
class InteractiveConfig:
    """torchrun on this node (SPEC section 1)."""

    # workers on this node: "auto" = one per visible GPU, else one per CPU core; or an integer >= 1
    nproc_per_node: str = "auto"
    # rendezvous port; null = one the OS picks, so jobs sharing the host never collide (rank 0 logs it); a port
    # given here moves to the next free one when taken (logged)
    master_port: tp.Optional[int] = None
    # torchrun --max-restarts: restart the whole worker group this often after a worker fails
    max_restarts: int = 0
    # sweeps (-m): jobs run side by side on disjoint devices; null = as many as the devices allow
    max_parallel: tp.Optional[int] = None
    # not supported here: requeue is a Slurm feature (slurm.max_requeues); set only to get a clear error
    max_requeues: tp.Optional[int] = None

    def __post_init__(self) -> None:
        if self.nproc_per_node != "auto":
            ok = str(self.nproc_per_node).isdigit() and int(self.nproc_per_node) >= 1
            _require(ok, "interactive.nproc_per_node", self.nproc_per_node, "'auto' or an integer >= 1")
        if self.master_port is not None:
            _check_port("interactive.master_port", self.master_port)
        _require(self.max_restarts >= 0, "interactive.max_restarts", self.max_restarts, "must be >= 0")
        _positive("interactive.max_parallel", self.max_parallel)
        _require(self.max_requeues is None, "interactive.max_requeues", self.max_requeues,
                 "requeue is a Slurm feature (launcher=slurm slurm.max_requeues=N); interactive runs restart "
                 "failed workers with interactive.max_restarts")


def _check_port(key: str, port: int) -> None:
    _require(1024 <= port <= 65535, key, port, "a TCP port in 1024..65535")


@dataclass
class VolumeMapping:
    """A container mount ``source`` (on the host) -> ``dest`` (in the container); both absolute."""

    source: str
    dest: str

    @classmethod
    def parse(cls, item: tp.Any, key: str) -> VolumeMapping:
        """Accept ``{source, dest}`` or ``"src:dst"``; check both are absolute and the source exists.

        Raises ConfigError naming ``key`` otherwise."""
        if isinstance(item, VolumeMapping):
            vm = item
        elif isinstance(item, str) and item.count(":") == 1:
            vm = cls(*item.split(":"))
        elif isinstance(item, tp.Mapping) and set(item) == {"source", "dest"}:
            vm = cls(str(item["source"]), str(item["dest"]))
        else:
            raise ConfigError(key, item, "a mount {source: /abs/host/path, dest: /abs/container/path} or '/src:/dst'")
        _require(vm.source.startswith("/"), f"{key}.source", vm.source, "must be an absolute path")
        _require(vm.dest.startswith("/"), f"{key}.dest", vm.dest, "must be an absolute path")
        _require(Path(vm.source).exists(), f"{key}.source", vm.source, "must exist on the submitting host")
        return vm


@dataclass
class SlurmConfig:
    """One Slurm job (sbatch + srun); SPEC section 2. Times are Slurm time strings, sizes Slurm size strings."""

    job_name: str = "llm_finetune"
    nodes: int = 1
    # tasks (= ranks) per node; one per GPU on GPU clusters
    ntasks_per_node: int = 8
    # wall-time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or integer minutes
    time: str = "04:00:00"
    account: tp.Optional[str] = None
    partition: tp.Optional[str] = None
    # Enroot/Pyxis image (srun --container-image)
    container_image: tp.Optional[str] = None
    # where the project source is mounted inside the container (put on PYTHONPATH there)
    nemo_mount: tp.Optional[str] = None
    # Hugging Face cache: exported as HF_HOME and mounted into the container
    hf_home: tp.Optional[str] = None
    # VolumeMapping {source, dest} or "src:dst"
    extra_mounts: tp.List[tp.Any] = field(default_factory=list)
    # rendezvous port base; the job uses master_port + SLURM_JOB_ID % 1000 so jobs sharing a node never collide
    master_port: int = DEFAULT_MASTER_PORT
    # variables for the job; "${VAR}" = the submitting shell's $VAR, expanded in the job, never written to a file
    env_vars: tp.Dict[str, str] = field(default_factory=dict)
    # wrap each task in nsys profile (same switch as profile=nsys)
    nsys_enabled: bool = False
    # GPUs per node (--gpus-per-node); null = ntasks_per_node; 0 = request none
    gpus_per_node: tp.Optional[int] = None
    cpus_per_task: tp.Optional[int] = None
    # memory per node, Slurm size string (e.g. 64G)
    mem: tp.Optional[str] = None
    qos: tp.Optional[str] = None
    constraint: tp.Optional[str] = None
    exclude: tp.Optional[str] = None
    # shell lines run in the batch script before srun (module load, source venv, ...)
    setup: tp.List[str] = field(default_factory=list)
    # more #SBATCH options, {option: value} without the leading dashes (value null = a flag)
    sbatch_args: tp.Dict[str, tp.Any] = field(default_factory=dict)
    # more srun arguments, one list item per argument
    srun_args: tp.List[str] = field(default_factory=list)
    # requeue the job this many times after a time-limit or preemption signal (0 = never)
    max_requeues: int = 3
    # seconds before the time limit at which USR2 asks every rank to checkpoint (sbatch --signal=USR2@N)
    signal_delay_s: int = 300
    # sweeps: at most this many array tasks run at once (sbatch --array=...%N)
    array_parallelism: int = 256
    # wait for the job to finish and follow its log (single runs; sweeps wait unless detach)
    wait: bool = False
    # sweeps: submit every job and return at once, leaving a manifest in the sweep dir
    detach: bool = False

    def __post_init__(self) -> None:
        _positive("slurm.nodes", self.nodes)
        _positive("slurm.ntasks_per_node", self.ntasks_per_node)
        minutes = parse_slurm_time(self.time)
        _check_port("slurm.master_port", self.master_port)
        _require(self.master_port + PORT_SPAN - 1 <= 65535, "slurm.master_port", self.master_port,
                 f"must leave room for the per-job offset (<= {65536 - PORT_SPAN})")
        _positive("slurm.gpus_per_node", self.gpus_per_node, 0)
        _positive("slurm.cpus_per_task", self.cpus_per_task)
        _require(self.max_requeues >= 0, "slurm.max_requeues", self.max_requeues, "must be >= 0")
        _positive("slurm.signal_delay_s", self.signal_delay_s, 0)
        _positive("slurm.array_parallelism", self.array_parallelism)
        _require(minutes * 60 > self.signal_delay_s, "slurm.time", self.time,
                 f"must be longer than slurm.signal_delay_s={self.signal_delay_s}s, the checkpoint margin before "
                 "the limit (raise slurm.time or lower slurm.signal_delay_s)")
        self.extra_mounts = [VolumeMapping.parse(m, f"slurm.extra_mounts[{i}]") for i, m in enumerate(self.extra_mounts)]
        # issue 7: #SBATCH values are one line each (sbatch reads one option per line); name the field, not the line
        one_line = {k: getattr(self, k) for k in ("job_name", "account", "partition", "qos", "constraint", "exclude",
                                                   "mem")}
        one_line.update({f"sbatch_args.{k}": v for k, v in self.sbatch_args.items()})
        for key, value in one_line.items():
            option = key.rpartition(".")[2].replace("_", "-").lstrip("-")
            _require(not (isinstance(value, str) and ("\n" in value or "\r" in value)), f"slurm.{key}", value,
                     f"a single line: sbatch reads one option per line (#SBATCH --{option})")
        for key in ("nemo_mount",):
            value = getattr(self, key)
            if value is not None:
                _require(str(value).startswith("/"), f"slurm.{key}", value, "must be an absolute path in the container")

    @property
    def time_minutes(self) -> int:
        return parse_slurm_time(self.time)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node


#: Clouds SkyPilot's launcher section accepts (SPEC section 3).
SKYPILOT_CLOUDS = ("aws", "gcp", "azure", "lambda", "kubernetes")


@dataclass
class SkyPilotConfig:
    """One SkyPilot task per job; SPEC section 3. Spot jobs run as SkyPilot managed jobs (preemptions recovered);
    on-demand jobs run on a named cluster (``sky.launch``). See :mod:`automodel_hydra.backends.skypilot`."""

    # aws | gcp | azure | lambda | kubernetes
    cloud: str = "aws"
    # NAME:COUNT, e.g. H100:8 or A100-80GB:4; null = CPU instances
    accelerators: tp.Optional[str] = "H100:8"
    # instances (nodes), >= 1
    num_nodes: int = 1
    # preemptible instances, run as a SkyPilot managed job so preemptions are recovered (needs checkpoint_bucket)
    use_spot: bool = False
    # disk per node in GB, > 0; null = SkyPilot's default
    disk_size: tp.Optional[int] = None
    # cloud region (kubernetes: the context); null = any
    region: tp.Optional[str] = None
    # shell run in the workdir before training on every node, under `set -euo pipefail`: a failing line fails the launch
    setup: tp.Optional[str] = "python -m pip install -e ."
    # variables for the job; "${VAR}" values travel as SkyPilot secrets, resolved from this shell at launch
    env_vars: tp.Dict[str, str] = field(default_factory=dict)
    # rendezvous port on the head node (each job has its own cluster)
    master_port: int = DEFAULT_MASTER_PORT
    # workers per node; null = the accelerator count (1 without accelerators)
    nproc_per_node: tp.Optional[int] = None
    # synced to every node as the working directory; null = this project's root
    workdir: tp.Optional[str] = None
    # bucket holding the job's output dir and checkpoints, mounted at checkpoint_mount (MOUNT_CACHED): a bucket name
    # (created by SkyPilot when missing), a URI (s3://b, gs://b/prefix, ...), "auto" (a per-user bucket when the job
    # needs one: use_spot or num_nodes > 1; else the node's disk) or null (node disk; not allowed with use_spot)
    checkpoint_bucket: tp.Optional[str] = "auto"
    # store for a bucket given by name (s3, gcs, azure, r2, ...); null = the task's cloud
    checkpoint_store: tp.Optional[str] = None
    # where the bucket is mounted on every node (absolute)
    checkpoint_mount: str = "/checkpoints"
    # the run's name on the cloud: task / managed job name, bucket dir (a recovered or relaunched job with the same
    # name resumes there) and default cluster name; null = <job name>-<hash of the output dir>; sweeps add -<num>
    run_name: tp.Optional[str] = None
    # on-demand only: cluster name (null = run_name) and its lifetime after the job
    cluster_name: tp.Optional[str] = None
    # on-demand only: stop the cluster after this many idle minutes (null = never)
    idle_minutes_to_autostop: tp.Optional[int] = None
    # on-demand only: tear the cluster down after the job (after idle_minutes_to_autostop when set)
    down: bool = False
    # managed (spot) jobs: also restart after this many user-code failures (preemptions are always recovered)
    max_restarts_on_errors: int = 0
    # wait for the job(s) and return their final state (single runs and sweeps); false = return right after launch
    wait: bool = True
    # not supported here: requeue is a Slurm feature; spot recovery is use_spot=true
    max_requeues: tp.Optional[int] = None

    def __post_init__(self) -> None:
        _require(self.cloud in SKYPILOT_CLOUDS, "skypilot.cloud", self.cloud, f"one of {list(SKYPILOT_CLOUDS)}")
        if self.accelerators is not None:
            ok = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(:[1-9][0-9]*)?", str(self.accelerators))
            _require(bool(ok), "skypilot.accelerators", self.accelerators, "NAME or NAME:COUNT, e.g. 'H100:8'")
        _positive("skypilot.num_nodes", self.num_nodes)
        _positive("skypilot.disk_size", self.disk_size)
        _positive("skypilot.nproc_per_node", self.nproc_per_node)
        _positive("skypilot.idle_minutes_to_autostop", self.idle_minutes_to_autostop, 0)
        _check_port("skypilot.master_port", self.master_port)
        _require(self.max_restarts_on_errors >= 0, "skypilot.max_restarts_on_errors", self.max_restarts_on_errors,
                 "must be >= 0")
        _require(self.max_requeues is None, "skypilot.max_requeues", self.max_requeues,
                 "requeue is a Slurm feature; on SkyPilot use skypilot.use_spot=true (a managed job recovers "
                 "preemptions) and skypilot.max_restarts_on_errors for failures")
        bucket = self.checkpoint_bucket
        _require(bucket is not None or not self.use_spot, "skypilot.checkpoint_bucket", bucket,
                 "spot jobs need checkpoints on storage that outlives the instance: a bucket name, a URI "
                 "(s3://..., gs://...) or 'auto' (skypilot.use_spot=true)")
        if bucket is not None and bucket != "auto":
            ok = re.fullmatch(_BUCKET_NAME, bucket) or re.fullmatch(r"[a-z0-9]+://[^\s]+", bucket)
            _require(bool(ok), "skypilot.checkpoint_bucket", bucket,
                     "'auto', a bucket name (3-63 of a-z 0-9 . -) or a URI such as s3://bucket or gs://bucket/prefix")
            _require(self.checkpoint_store is None or "://" not in bucket, "skypilot.checkpoint_store",
                     self.checkpoint_store, "null when skypilot.checkpoint_bucket is a URI (its scheme is the store)")
        mount = self.checkpoint_mount
        _require(mount.startswith("/") and mount != "/" and not mount.endswith("/") and " " not in mount,
                 "skypilot.checkpoint_mount", mount, "an absolute path on the nodes, not /, without a trailing /")
        for key in ("run_name", "cluster_name"):
            value = getattr(self, key)
            _require(value is None or bool(re.fullmatch(_SKY_NAME, value)), f"skypilot.{key}", value,
                     "lowercase letters, digits and '-', starting with a letter, at most 40 characters")

    @property
    def gpus_per_node(self) -> int:
        if not self.accelerators:
            return 0
        _, _, count = str(self.accelerators).partition(":")
        return int(count or 1)


#: S3/GCS bucket names; SkyPilot cluster/job names as this launcher makes them (a subset of what SkyPilot accepts).
_BUCKET_NAME = r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]"
_SKY_NAME = r"[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?"


# ----------------------------------------------------------------------------------------------- top level


@dataclass
class TrainConfig:
    """The ``llm_finetune`` recipe and where it runs. ``slurm``/``skypilot`` present = that launcher."""

    seed: int = 1234
    # plan everything, write and print the plan files; submit and start nothing
    dry_run: bool = False
    # the job's output dir; every rank and every node writes here
    output_dir: str = "${hydra:runtime.output_dir}"
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    step_scheduler: StepSchedulerConfig = field(default_factory=StepSchedulerConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    restore_from: RestoreFromConfig = field(default_factory=RestoreFromConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    interactive: InteractiveConfig = field(default_factory=InteractiveConfig)
    slurm: tp.Optional[SlurmConfig] = None
    skypilot: tp.Optional[SkyPilotConfig] = None

    def __post_init__(self) -> None:
        if self.slurm is not None and self.skypilot is not None:
            raise ConfigError("slurm/skypilot", "both set", "a config routes to one launcher: keep either the "
                              "slurm: or the skypilot: section (or choose launcher=slurm|skypilot|interactive)")
        if self.checkpoint.restore_from is not None:
            self.restore_from.path = self.checkpoint.restore_from
        path = self.restore_from.path
        if path not in (None, "latest"):
            _require(Path(path).is_dir(), "restore_from.path", path,
                     "'latest', null, or an existing checkpoint directory (a step-N dir)")
        if self.slurm is not None and self.slurm.nsys_enabled:
            self.profile.nsys.enabled = True

    @property
    def backend(self) -> str:
        """``"slurm"``, ``"skypilot"`` or ``"interactive"``, from which section is present."""
        return "slurm" if self.slurm is not None else "skypilot" if self.skypilot is not None else "interactive"

    @property
    def checkpoint_dir(self) -> str:
        return self.checkpoint.dir or str(Path(self.output_dir) / "checkpoints")


# ----------------------------------------------------------------------------------------------- loading


def _launcher_env_vars(cfg: DictConfig) -> dict[str, dict[str, tp.Any]]:
    """Raw (unresolved) env_vars of each launcher section: ``"${HF_TOKEN}"`` stays a reference, never a value."""
    out = {}
    for section in BACKEND_SECTIONS:
        node = cfg.get(section) if section in cfg else None
        if node is not None and "env_vars" in node and node.env_vars is not None:
            out[section] = {k: node.env_vars._get_node(k)._value() for k in node.env_vars}
    return out


def load(cfg: DictConfig | dict) -> TrainConfig:
    """Validate a composed config and return it as :class:`TrainConfig`.

    ``env_vars`` are taken raw, so ``"${HF_TOKEN}"`` references are not resolved (OmegaConf would otherwise read
    them as its own interpolations and fail); every other value is resolved.

    Raises
    ------
    ConfigError
        A value is out of range; the message names the key.
    omegaconf.errors.OmegaConfBaseException
        An unknown key or a value of the wrong type (also caught at compose time by Hydra).
    """
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    raw_env = _launcher_env_vars(cfg)
    data = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(data, dict)
    data.pop("hydra", None)
    for section, env in raw_env.items():
        data[section]["env_vars"] = {k: str(v).replace("${", "\\${") if v is not None else "" for k, v in env.items()}
    # ${hydra:...} resolves through Hydra's global HydraConfig, set inside every Hydra job
    merged = OmegaConf.merge(_schema(), data)  # merge copies: the cached schema is never modified
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, TrainConfig)
    return obj


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The structured TrainConfig node, built once per process (a sweep loads one config per job)."""
    return OmegaConf.structured(TrainConfig)


def to_dict(cfg: TrainConfig) -> dict[str, tp.Any]:
    """Plain-data form of a validated config (for the job file the ranks read)."""
    return dataclasses.asdict(cfg)


def register_configs() -> None:
    """Register the schemas in Hydra's ConfigStore (``llm_finetune_schema`` is the recipe's base)."""
    cs = ConfigStore.instance()
    cs.store(name="llm_finetune_schema", node=TrainConfig)


register_configs()
