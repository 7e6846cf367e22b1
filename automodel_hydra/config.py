"""The job's config: the recipe's typed sections, the launcher sections, and the one pipeline that loads them.

Sections and where their schema lives:

* the bundled recipe's sections (``model``, ``data``, ``step_scheduler``, ``optim``, ``checkpoint``,
  ``restore_from``, ``profile``): here;
* each launcher's section beside its backend: ``interactive`` in :mod:`automodel_hydra.backends.interactive`,
  ``slurm`` in :mod:`automodel_hydra.backends.slurm`, ``skypilot`` in :mod:`automodel_hydra.backends.skypilot`.

Defaults live once, in these dataclasses (the YAML files under ``conf/`` only select). Bad input is caught twice
before anything is submitted or started:

* compose time: the schema is registered in Hydra's ConfigStore (:func:`register`), so an unknown key
  (``slurm.nodez``) or a value of the wrong type (``slurm.nodes=two``) fails while Hydra composes, naming the key;
* :func:`load` normalises AutoModel's alias names once (:data:`ALIASES`), builds these dataclasses (each
  ``__post_init__`` checks its own values) and :func:`check_world` checks the rules that need the job's world
  size; each raises :class:`~automodel_hydra.schema.ConfigError` naming the key, the bad value and what is valid.

Ranks never re-run the launcher checks: they read the rank-side spec (:func:`rank_spec`, :func:`load_rank`), the
recipe's sections without any launcher section, so nothing of the submitting host is checked where they run.
"""

from __future__ import annotations

import dataclasses
import functools
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from automodel_hydra.backends.interactive import InteractiveConfig
from automodel_hydra.backends.skypilot import SkyPilotConfig
from automodel_hydra.backends.slurm import SlurmConfig
from automodel_hydra.schema import ConfigError, at_least, require

#: The launcher sections: which one is present decides where the job runs (none = interactive).
LAUNCHER_SECTIONS = ("slurm", "skypilot")

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
            at_least(f"model.{name}", getattr(self, name))
        require(self.hidden_size % self.num_heads == 0, "model.hidden_size", self.hidden_size,
                 f"must be divisible by model.num_heads={self.num_heads}")


@dataclass
class DataConfig:
    """Training text. ``source: pydoc`` is the Python documentation that ships with every CPython
    (``pydoc_data.topics``): real English and code, no download. ``source: file`` reads ``path``."""

    source: str = "pydoc"
    # a UTF-8 text file, used when source is "file"
    path: tp.Optional[str] = None
    # tokens (bytes) per sample
    seq_len: int = 64

    def __post_init__(self) -> None:
        require(self.source in ("pydoc", "file"), "data.source", self.source, "one of 'pydoc', 'file'")
        if self.source == "file":
            require(bool(self.path), "data.path", self.path, "a UTF-8 text file when data.source=file")
        at_least("data.seq_len", self.seq_len, 2)


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
    # AutoModel's name for checkpoint_interval (see config.ALIASES)
    ckpt_every_steps: tp.Optional[int] = None

    def __post_init__(self) -> None:
        at_least("step_scheduler.max_steps", self.max_steps)
        at_least("step_scheduler.checkpoint_interval", self.checkpoint_interval)
        at_least("step_scheduler.log_interval", self.log_interval)
        at_least("step_scheduler.local_batch_size", self.local_batch_size)
        at_least("step_scheduler.global_batch_size", self.global_batch_size)

    def grad_accumulation(self, world_size: int) -> int:
        """Micro-batches per optimizer step so that ``global_batch_size`` samples are seen per step.

        Raises ConfigError when global_batch_size is not a multiple of local_batch_size * world_size."""
        if self.global_batch_size is None:
            return 1
        per_micro = self.local_batch_size * world_size
        require(self.global_batch_size % per_micro == 0, "step_scheduler.global_batch_size", self.global_batch_size,
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
        require(self.lr > 0, "optim.lr", self.lr, "must be > 0")
        require(self.warmup_steps >= 0, "optim.warmup_steps", self.warmup_steps, "must be >= 0")


@dataclass
class CheckpointConfig:
    enabled: bool = True
    # where step-N checkpoints go; null = <output_dir>/checkpoints
    dir: tp.Optional[str] = None
    # torch.distributed.checkpoint.async_save: training continues while the checkpoint is written
    async_save: bool = False
    # keep only the newest K complete checkpoints (0 = keep all)
    keep_latest_k: int = 0
    # AutoModel's name for restore_from.path (see config.ALIASES)
    restore_from: tp.Optional[str] = None

    def __post_init__(self) -> None:
        require(self.keep_latest_k >= 0, "checkpoint.keep_latest_k", self.keep_latest_k, "must be >= 0")


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
        at_least("profile.nsys.start_step", self.start_step)
        require(self.stop_step >= self.start_step, "profile.nsys.stop_step", self.stop_step,
                 f"must be >= profile.nsys.start_step={self.start_step}")


@dataclass
class ProfileConfig:
    nsys: NsysConfig = field(default_factory=NsysConfig)



@dataclass
class DistEnvConfig:
    """The process group, with AutoModel's key names (``dist_env``)."""

    # minutes a rank waits for its peers at the rendezvous and for each collective before giving up
    timeout_minutes: float = 10.0

    def __post_init__(self) -> None:
        require(self.timeout_minutes > 0, "dist_env.timeout_minutes", self.timeout_minutes, "must be > 0")


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
    dist_env: DistEnvConfig = field(default_factory=DistEnvConfig)
    interactive: InteractiveConfig = field(default_factory=InteractiveConfig)
    slurm: tp.Optional[SlurmConfig] = None
    skypilot: tp.Optional[SkyPilotConfig] = None

    def __post_init__(self) -> None:
        if self.slurm is not None and self.skypilot is not None:
            raise ConfigError("slurm/skypilot", "both set", "a config routes to one launcher: keep either the "
                              "slurm: or the skypilot: section (or choose launcher=slurm|skypilot|interactive)")
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

#: AutoModel's key names -> ours: ``(section, alias, canonical section, canonical key)``. Normalised once, in
#: :func:`load`; a config that sets both names to different values is refused, naming both.
ALIASES = (
    ("step_scheduler", "ckpt_every_steps", "step_scheduler", "checkpoint_interval"),
    ("checkpoint", "restore_from", "restore_from", "path"),
)


def _normalise_aliases(data: dict[str, tp.Any]) -> None:
    """Move each alias's value to its canonical key (in place); both set to different values is an error."""
    for section, alias, target_section, target in ALIASES:
        node = data.get(section)
        if not isinstance(node, dict) or node.get(alias) is None:
            continue
        value = node.pop(alias)
        target_node = data.setdefault(target_section, {})
        default = getattr(_DEFAULTS[target_section], target)
        current = target_node.get(target, default)
        if current not in (default, value):
            raise ConfigError(f"{section}.{alias}", value, f"{section}.{alias} is AutoModel's name for "
                              f"{target_section}.{target}, which is set to {current!r}: set one of the two")
        target_node[target] = value


_DEFAULTS: dict[str, tp.Any] = {"step_scheduler": StepSchedulerConfig(), "restore_from": RestoreFromConfig()}


#: Each launcher section's fields that hold shell text (``$VAR``, ``${VAR}``, ``${VAR:-default}``): taken raw, so
#: OmegaConf never reads them as its own interpolations; the backend gives them their shell meaning. A section's
#: schema may list more than ``env_vars`` in its ``SHELL_FIELDS``.
SHELL_FIELDS = {name: getattr(schema, "SHELL_FIELDS", ("env_vars",))
                for name, schema in (("slurm", SlurmConfig), ("skypilot", SkyPilotConfig))}


def _raw_env_vars(cfg: DictConfig) -> dict[str, dict[str, tp.Any]]:
    """Each launcher section's shell fields (:data:`SHELL_FIELDS`) unresolved: ``"${HF_TOKEN}"`` stays a
    reference, never a value."""
    out: dict[str, dict[str, tp.Any]] = {}
    for section in LAUNCHER_SECTIONS:
        node = cfg.get(section) if section in cfg else None
        raw = OmegaConf.to_container(node, resolve=False) if node is not None else None
        if isinstance(raw, dict):
            out[section] = {key: raw[key] for key in SHELL_FIELDS[section] if raw.get(key) is not None}
    return out


def _escaped(value: tp.Any) -> tp.Any:
    """Shell text as OmegaConf's literal text (``\\${`` is OmegaConf's escape for ``${``); a dict per value."""
    if isinstance(value, dict):
        return {str(k): _escaped("" if v is None else str(v)) for k, v in value.items()}
    return str(value).replace("${", "\\${")


def load(cfg: DictConfig | dict[str, tp.Any]) -> TrainConfig:
    """Validate a composed config and return it as :class:`TrainConfig`.

    Shell fields (:data:`SHELL_FIELDS`: ``env_vars``, SkyPilot's ``hf_token`` ...) are taken raw, so
    ``"${HF_TOKEN}"`` references are not resolved (OmegaConf would otherwise read them as its own interpolations
    and fail); every other value is resolved (``${hydra:...}`` through Hydra's
    global HydraConfig, set inside every Hydra job).

    Raises
    ------
    ConfigError
        A value is out of range, or an alias and its canonical key disagree; the message names the key.
    omegaconf.errors.OmegaConfBaseException
        An unknown key or a value of the wrong type (also caught at compose time by Hydra).
    """
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    raw_env = _raw_env_vars(cfg)
    container = OmegaConf.to_container(cfg, resolve=False)
    assert isinstance(container, dict)
    data = {str(k): v for k, v in container.items() if k != "hydra"}
    for section, fields in raw_env.items():
        data[section].update({key: _escaped(value) for key, value in fields.items()})
    _normalise_aliases(data)
    merged = OmegaConf.merge(_schema(), data)  # merge copies: the cached schema is never modified
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, TrainConfig)
    return obj


def check_world(cfg: TrainConfig, world_size: int) -> None:
    """Rules that need the job's world size (ranks), checked at plan time so that a job never waits in a queue
    only to fail at its first step. Raises ConfigError naming the key."""
    cfg.step_scheduler.grad_accumulation(world_size)


def host_problems(cfg: TrainConfig) -> list[ConfigError]:
    """Paths the ranks will read, checked on the submitting host (the same filesystem for local and bare-metal
    Slurm jobs): ``data.path``, ``restore_from.path``."""
    problems = []
    if cfg.data.source != "pydoc" and cfg.data.path and not Path(cfg.data.path).is_file():
        problems.append(ConfigError("data.path", cfg.data.path, "an existing file"))
    path = cfg.restore_from.path
    if path not in (None, "latest") and not Path(path).is_dir():
        problems.append(ConfigError("restore_from.path", path,
                                    "'latest', null, or an existing checkpoint directory (a step-N dir)"))
    return problems


@functools.lru_cache(maxsize=1)
def _schema() -> DictConfig:
    """The structured TrainConfig node, built once per process (a sweep loads one config per job)."""
    return OmegaConf.structured(TrainConfig)


def rank_spec(cfg: TrainConfig) -> dict[str, tp.Any]:
    """What every rank reads (``launch/job.yaml``): the recipe's sections, resolved, without launcher sections."""
    spec = dataclasses.asdict(cfg)
    for section in ("interactive", *LAUNCHER_SECTIONS):
        spec.pop(section, None)
    spec.pop("dry_run", None)
    return spec


def load_rank(spec: DictConfig | dict[str, tp.Any]) -> TrainConfig:
    """The rank-side spec (:func:`rank_spec`) as :class:`TrainConfig`, with no launcher section and no check of
    the submitting host. Raises ConfigError / OmegaConf errors for a malformed spec."""
    merged = OmegaConf.merge(_schema(), spec)
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, TrainConfig)
    return obj


def register() -> None:
    """Register the schema in Hydra's ConfigStore as ``llm_finetune_schema`` (the recipe's base config), and the
    ``${automodel_uid:}`` resolver of the default output dirs (a random 4-hex tag, the same for every use in one
    process, so two commands started in the same second get different dirs). Called by the Hydra plugin package
    when Hydra scans it, and by ``train.py``; calling it again changes nothing."""
    import secrets

    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="llm_finetune_schema", node=TrainConfig)
    if not OmegaConf.has_resolver("automodel_uid"):
        OmegaConf.register_new_resolver("automodel_uid", lambda: secrets.token_hex(2), use_cache=True)
