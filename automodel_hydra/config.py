"""The job's config: the recipe's typed sections, the launcher sections, and the one pipeline that loads them.

Sections and where their schema lives:

* the bundled recipe's sections (``model``, ``data``, ``step_scheduler``, ``optim``, ``checkpoint``,
  ``restore_from``, ``profile``): here;
* each launcher's section in a schema module beside its backend, which imports no backend (so neither this module
  nor a rank loads one): ``interactive`` in :mod:`automodel_hydra.backends.interactive_config`, ``slurm`` in
  :mod:`automodel_hydra.backends.slurm_config`, ``skypilot`` in :mod:`automodel_hydra.backends.skypilot_config`;
* ``fault_tolerance`` (every launcher) in :mod:`automodel_hydra.fault_tolerance`.
* ``failure_budget`` (every launcher, read by the ranks) in :mod:`automodel_hydra.failures`.

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
import os
import typing as tp
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from automodel_hydra import errors
from automodel_hydra import sections as table  # the one table of sections: which plays which part
from automodel_hydra.backends.interactive_config import InteractiveConfig
from automodel_hydra.backends.skypilot_config import SkyPilotConfig
from automodel_hydra.backends.slurm_config import HOME_ELSEWHERE, SlurmConfig
from automodel_hydra.envvars import Interp, expand, home_elsewhere, parse, render
from automodel_hydra.failures import FailureBudget
from automodel_hydra.fault_tolerance import FaultToleranceConfig
from automodel_hydra.interpolations import escape, omega_text
from automodel_hydra.paths import DEFAULT_CHECKPOINT_DIR, POINTER
from automodel_hydra.schema import ConfigError, at_least, require

if tp.TYPE_CHECKING:
    from automodel_hydra.recipe_kind import RecipeKind

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
        require(self.source in ("pydoc", "file", "jsonl"), "data.source", self.source, "one of pydoc, file, jsonl")
        if self.source in ("file", "jsonl"):
            require(bool(self.path), "data.path", self.path, f"a UTF-8 file when data.source={self.source}")
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
    # validation loss (held-out data) every N steps and at the last step; null = at the last step only
    val_every_steps: tp.Optional[int] = None

    def __post_init__(self) -> None:
        at_least("step_scheduler.max_steps", self.max_steps)
        at_least("step_scheduler.checkpoint_interval", self.checkpoint_interval)
        at_least("step_scheduler.log_interval", self.log_interval)
        at_least("step_scheduler.val_every_steps", self.val_every_steps)
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
    # where step-N checkpoints go; null = <output_dir>/checkpoints; a relative dir is under output_dir (the job's own)
    dir: tp.Optional[str] = None
    # torch.distributed.checkpoint.async_save: training continues while the checkpoint is written
    async_save: bool = False
    # keep only the newest K complete checkpoints (0 = keep all); the newest and the one resumed from always stay
    keep_latest_k: int = 3
    # AutoModel's name for restore_from.path (see config.ALIASES)
    restore_from: tp.Optional[str] = None

    def __post_init__(self) -> None:
        require(self.keep_latest_k >= 0, "checkpoint.keep_latest_k", self.keep_latest_k, "must be >= 0")

    def under(self, job_dir: str | os.PathLike[str]) -> Path:
        """The checkpoint dir of a job whose output dir is ``job_dir``: ``dir`` (a relative one under it), or
        :data:`automodel_hydra.paths.DEFAULT_CHECKPOINT_DIR` under it."""
        return Path(job_dir) / (self.dir or DEFAULT_CHECKPOINT_DIR)


@dataclass
class RestoreFromConfig:
    # "latest" = newest complete checkpoint in checkpoint.dir (fresh start when none); D/latest = the newest complete
    # one in checkpoint dir D (checkpoint.dir's own first: automodel_hydra/checkpoint.py); a checkpoint path; or null
    path: tp.Optional[str] = POINTER


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


@dataclass
class HealthCheckConfig:
    """The health check before training (:mod:`automodel_hydra.health`, docs/failures.md)."""

    # null: on for a Slurm job on more than one node, off otherwise; true/false: always/never
    enabled: tp.Optional[bool] = None
    # seconds the whole check may take (device check and one all-reduce) before the node fails it
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        require(self.timeout_s > 0, "health_check.timeout_s", self.timeout_s, "must be > 0")


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
    # ft_launcher: heartbeats, hang detection, in-job restarts, on every launcher (docs/fault-tolerance.md)
    fault_tolerance: FaultToleranceConfig = field(default_factory=FaultToleranceConfig)
    # retries per failure class, for in-job restarts and Slurm requeues alike (docs/failures.md)
    failure_budget: FailureBudget = field(default_factory=FailureBudget)
    # every rank checks its devices and one all-reduce before training; a node that fails is a node_failure
    health_check: HealthCheckConfig = field(default_factory=HealthCheckConfig)
    slurm: tp.Optional[SlurmConfig] = None
    skypilot: tp.Optional[SkyPilotConfig] = None
    # the code every rank runs: null = this bundled recipe; an AutoModel recipe class (a bare name such as
    # TrainFinetuneRecipeForNextTokenPrediction, a dotted path, or {_target_: ...}) or a function module:attr
    # (docs/recipes.md). With one set, the config's other sections go to that recipe untouched (recipe_sections).
    recipe: tp.Any = None
    # filled by load() for a recipe other than the bundled one: its sections, as the file has them (unresolved)
    recipe_sections: tp.Dict[str, tp.Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.slurm is not None and self.skypilot is not None:
            raise ConfigError("slurm/skypilot", "both set", "a config routes to one launcher: keep either the "
                              "slurm: or the skypilot: section (on the command line: slurm=null or skypilot=null)")
        if self.slurm is not None and self.slurm.nsys_enabled:
            self.profile.nsys.enabled = True
        if self.fault_tolerance.enabled and self.interactive.max_restarts not in (0, self.fault_tolerance.max_restarts):
            raise ConfigError("interactive.max_restarts", self.interactive.max_restarts,
                              "with fault_tolerance.enabled=true the worker group restarts "
                              f"fault_tolerance.max_restarts={self.fault_tolerance.max_restarts} times: set that one")

    @property
    def backend(self) -> str:
        """``"slurm"``, ``"skypilot"`` or ``"interactive"``, from which section is present."""
        return "slurm" if self.slurm is not None else "skypilot" if self.skypilot is not None else "interactive"

    @property
    def checkpoint_dir(self) -> str:
        """``checkpoint.dir``, a relative one under ``output_dir`` (automodel_hydra.paths has the rule)."""
        return str(self.checkpoint.under(self.output_dir))

    @property
    def kind(self) -> RecipeKind:
        """What the recipe's kind answers (the bundled recipe, an AutoModel recipe class, a user's function:
        :mod:`automodel_hydra.recipe_kind`): the backends and the driver ask it, never which kind it is."""
        from automodel_hydra import recipe_kind

        return recipe_kind.for_recipe(self.recipe)


# ----------------------------------------------------------------------------------------------- loading

#: Every alias, AutoModel's key names -> ours: ``(section, alias, canonical section, canonical key)``. Normalised
#: once, in :func:`load` (the launcher sections' also for another recipe's file, where AutoModel's names are
#: usual); a config that sets both names to different values is refused, naming both. The alias keys stay in the
#: schemas (so Hydra accepts them at compose time) and are None once normalised.
ALIASES = (
    ("step_scheduler", "ckpt_every_steps", "step_scheduler", "checkpoint_interval"),
    ("checkpoint", "restore_from", "restore_from", "path"),
    ("skypilot", "gpus_per_node", "skypilot", "nproc_per_node"),
)


def _normalise_aliases(data: dict[str, tp.Any], sections: tp.Container[str] | None = None) -> None:
    """Move each alias's value to its canonical key (``data`` in place, its sections copied before a change); both
    set to different values is an error. ``sections``: only the aliases of these sections (None: all)."""
    for section, alias, target_section, target in ALIASES:
        if sections is not None and section not in sections:
            continue
        node = data.get(section)
        if not isinstance(node, dict) or node.get(alias) is None:
            continue
        node = data[section] = dict(node)
        value = node.pop(alias)
        target_node = data[target_section] = dict(data.get(target_section) or {})
        default = getattr(_DEFAULTS[target_section], target)
        current = target_node.get(target, default)
        if current not in (default, value):
            raise ConfigError(f"{section}.{alias}", value, f"{section}.{alias} is AutoModel's name for "
                              f"{target_section}.{target}, which is set to {current!r}: set one of the two")
        target_node[target] = value


_DEFAULTS: dict[str, tp.Any] = {"step_scheduler": StepSchedulerConfig(), "restore_from": RestoreFromConfig(),
                                 "skypilot": SkyPilotConfig()}


def _omegaconf_value(cfg: DictConfig, text: str) -> str:
    """``text`` with OmegaConf's interpolations resolved against ``cfg`` (``${output_dir}``, ``${oc.env:X}``)."""
    if "${" not in text:
        return text
    probe = cfg.copy()
    with open_dict(probe):
        probe["__automodel_probe__"] = text
        try:
            return str(probe["__automodel_probe__"])
        except OmegaConfBaseException:  # not OmegaConf's either: the merge names the key
            return text


#: Launcher fields ``config.load`` does not expand from the submitting shell (a schema's ``SHELL_FIELDS``):
#: ``SCRIPT_FIELDS`` are bash text for the job, kept as they are; the others keep their references for the
#: backend, which gives them their shell meaning where the job runs (a secret never becomes a value in a file).
SHELL_FIELDS: dict[str, tuple[str, ...]] = {name: tuple(getattr(schema, "SHELL_FIELDS", ("env_vars",)))
                                            for name, schema in (("slurm", SlurmConfig), ("skypilot", SkyPilotConfig))}
SCRIPT_FIELDS: dict[str, tuple[str, ...]] = {name: tuple(getattr(schema, "SCRIPT_FIELDS", ()))
                                             for name, schema in (("slurm", SlurmConfig), ("skypilot", SkyPilotConfig))}


def _launcher_fields(cfg: DictConfig, data: dict[str, tp.Any], environ: tp.Mapping[str, str]) -> None:
    """Shell references in the launcher sections (``data`` in place, each section copied before it is changed),
    read with the one grammar of :mod:`automodel_hydra.envvars`: script fields are kept for bash; the other
    :data:`SHELL_FIELDS` keep their references for the backend (their OmegaConf interpolations resolved here);
    every other field is expanded from ``environ`` now."""
    is_key = data.__contains__
    for section in ("interactive", *table.LAUNCHER_SECTIONS):
        node = data.get(section)
        if not isinstance(node, dict):
            continue
        node = data[section] = dict(node)
        for name, value in list(node.items()):
            key = f"{section}.{name}"
            if name in SCRIPT_FIELDS.get(section, ()):
                node[name] = escape(value)
            elif name in SHELL_FIELDS.get(section, ()):
                if name == "env_vars" and isinstance(value, dict):
                    for k, v in value.items():  # str() would export a list's repr
                        require(not isinstance(v, (list, dict)), f"{key}.{k}", v,
                                "expected a string (an environment variable's value)")
                    value = {str(k): "" if v is None else str(v) for k, v in value.items()}
                node[name] = _walk(value, key, lambda text, k: omega_text(
                    render([_omegaconf_value(cfg, p.text) if isinstance(p, Interp) else p])
                    for p in parse(text, k, is_key)))
            else:
                node[name] = _walk(value, key, lambda text, k: omega_text(
                    p if isinstance(p, Interp) else expand((p,), environ, k)  # another machine's $HOME: as ~
                    for p in home_elsewhere(parse(text, k, is_key), k, HOME_ELSEWHERE.get(k))))


def _walk(value: tp.Any, key: str, text: tp.Callable[[str, str], str]) -> tp.Any:
    """``value`` with ``text(string, its key)`` applied to every string in it (lists and dicts walked)."""
    if isinstance(value, str):
        return text(value, key) if "$" in value or "\\" in value else value
    if isinstance(value, list):
        return [_walk(v, f"{key}[{i}]", text) for i, v in enumerate(value)]
    if isinstance(value, dict):
        return {k: _walk(v, f"{key}.{k}", text) for k, v in value.items()}
    return value


def load(cfg: DictConfig | dict[str, tp.Any], environ: tp.Mapping[str, str] | None = None) -> TrainConfig:
    """Validate a composed config and return it as :class:`TrainConfig`.

    Launcher fields refer to the submitting shell as a shell does (``hf_home: ${HF_HOME}``, expanded from
    ``environ``, default ``os.environ``); ``env_vars`` references stay references for the job (never a value in a
    file); every other value is resolved by OmegaConf (``${hydra:...}`` through Hydra's global HydraConfig, set
    inside every Hydra job).

    Raises
    ------
    ConfigError
        A value is out of range, a shell reference is malformed, or an alias and its canonical key disagree; the
        message names the key.
    automodel_hydra.envvars.UnsetReference
        A variable a launcher field refers to is unset and has no default; the message names the field.
    omegaconf.errors.OmegaConfBaseException
        An unknown key or a value of the wrong type (also caught at compose time by Hydra).
    """
    return _build(load_data(cfg, environ))


def load_data(cfg: DictConfig | dict[str, tp.Any], environ: tp.Mapping[str, str] | None,
              container: dict[str, tp.Any] | None = None) -> dict[str, tp.Any]:
    """What :func:`load` merges into the schema: the config's plain data (``container``, when given, is
    ``OmegaConf.to_container(cfg, resolve=False)``, made by the caller; it is not changed) without ``hydra``,
    launcher fields expanded, aliases normalised, another recipe's sections set apart."""
    if not isinstance(cfg, DictConfig):
        cfg = OmegaConf.create(cfg)
    if container is None:
        container = tp.cast(dict, OmegaConf.to_container(cfg, resolve=False))
    assert isinstance(container, dict)
    data = {str(k): v for k, v in container.items() if k != "hydra"}
    if "nemo_run" in data:  # AutoModel's NeMo-Run launcher section: ours where it maps, else one line
        from automodel_hydra.automodel.nemo_run import translate

        given = [k for k in table.LAUNCHER_SECTIONS if data.get(k)]
        for section, values in translate(data.pop("nemo_run"), given).items():
            data[section] = {**values, **(data.get(section) or {})}  # a key set in the config wins
    _launcher_fields(cfg, data, os.environ if environ is None else environ)
    if data.get("recipe") is not None:  # another recipe: its sections are its own, passed on untouched
        _normalise_aliases(data, table.LAUNCH_KEYS)
        from automodel_hydra import recipe_kind

        kind = recipe_kind.for_recipe(data["recipe"])
        if isinstance(data.get("slurm"), dict):  # the kind's meaning for what the file leaves out
            data["slurm"] = dict(data["slurm"])
            for key, value in kind.slurm_defaults(data["recipe"]).items():
                mine = data["slurm"].get(key)
                if isinstance(value, dict) and isinstance(mine, dict):  # sbatch_args: the file's options on top
                    data["slurm"][key] = {**value, **mine}
                else:
                    data["slurm"].setdefault(key, value)
        sections = {k: v for k, v in data.items() if k not in table.LAUNCH_KEYS or k in table.RECIPE_KEEPS}
        data = {k: v for k, v in data.items() if k in table.LAUNCH_KEYS and k not in table.BUNDLED_KEYS}
        data["recipe_sections"] = escape(kind.rank_sections(sections))
    else:
        _normalise_aliases(data)
    # OmegaConf's merge names no key for a list given to a section or a mapping ("Cannot merge DictConfig with
    # ListConfig"), and keeps a list or a mapping given as an entry of a List[str] or Dict[str, str] as it is
    found = errors.misshapen(TrainConfig, data)
    if found is not None:
        raise errors.invalid(*found)
    return data


def _build(data: dict[str, tp.Any]) -> TrainConfig:
    merged = OmegaConf.merge(schema(), data)  # merge copies: the cached schema is never modified
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, TrainConfig)
    return obj


def check_world(cfg: TrainConfig, world_size: int) -> None:
    """Rules that need the job's world size (ranks), checked at plan time so that a job never waits in a queue
    only to fail at its first step: the global batch is a whole number of micro-batches of all ranks (the
    bundled recipe's rule, and AutoModel's ``StepScheduler``'s for another recipe's ``step_scheduler`` section,
    whose replicas are the data-parallel ranks: :meth:`automodel_hydra.automodel.kind.OwnSections.check_world`).
    Raises ConfigError naming the key."""
    cfg.kind.check_world(cfg, world_size)


def host_problems(cfg: TrainConfig) -> list[ConfigError]:
    """Paths the ranks will read, checked on the submitting host (the same filesystem for local and bare-metal
    Slurm jobs), as the recipe's kind names them (:meth:`automodel_hydra.recipe_kind.RecipeKind.host_problems`):
    the bundled recipe's ``data.path`` and ``restore_from.path`` (``D/latest``: ``D`` a dir or not there yet); an
    AutoModel recipe's dataset paths and resume keys; nothing for a function recipe (its sections are its own)."""
    return cfg.kind.host_problems(cfg)


@functools.lru_cache(maxsize=1)
def schema() -> DictConfig:
    """The structured TrainConfig node, built once per process (a sweep loads one config per job)."""
    return OmegaConf.structured(TrainConfig)


def rank_spec(cfg: TrainConfig) -> dict[str, tp.Any]:
    """What every rank reads (``launch/job.yaml``): the recipe's sections without launcher sections — the bundled
    recipe's resolved (with ``seed`` and ``dist_env``), another recipe's as written (its ``recipe:`` and ``seed``
    keys included, nothing of the bundled recipe's added) — plus ``output_dir`` and ``profile``."""
    spec = dataclasses.asdict(cfg)
    for section in table.NOT_FOR_RANKS:
        spec.pop(section, None)
    return cfg.kind.rank_spec(cfg, spec)


def load_rank(spec: DictConfig | dict[str, tp.Any]) -> TrainConfig:
    """The rank-side spec (:func:`rank_spec`) as :class:`TrainConfig`, with no launcher section and no check of
    the submitting host. Raises ConfigError / OmegaConf errors for a malformed spec."""
    if not isinstance(spec, DictConfig):
        spec = OmegaConf.create(spec)
    if spec.get("recipe") is not None:
        return load(spec, environ={})
    merged = OmegaConf.merge(schema(), spec)
    obj = OmegaConf.to_object(merged)
    assert isinstance(obj, TrainConfig)
    return obj


def register() -> None:
    """Register the schema in Hydra's ConfigStore as ``llm_finetune_schema`` (the recipe's base config), and the
    ``${automodel_uid:}`` resolver of the default output dirs (a random 4-hex tag, the same for every use in one
    process, so two commands started in the same second get different dirs). Called by the Hydra plugin package
    when Hydra scans it, and by ``train.py``; calling it again changes nothing (and costs nothing: storing builds
    ``OmegaConf.structured(TrainConfig)``, tens of ms: it is stored only when the store lacks it)."""
    import secrets

    from hydra.core.config_store import ConfigStore

    store = ConfigStore.instance()
    if "llm_finetune_schema.yaml" not in store.repo:
        store.store(name="llm_finetune_schema", node=TrainConfig)
    if not OmegaConf.has_resolver("automodel_uid"):
        tag = secrets.token_hex(2)  # one per process: every config composed here (each sweep job's) agrees
        OmegaConf.register_new_resolver("automodel_uid", lambda: tag)
