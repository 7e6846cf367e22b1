"""The AutoModel kind: every answer an AutoModel recipe class's job gives the config pipeline, the driver and the
backends (:class:`automodel_hydra.recipe_kind.RecipeKind`), with the facts of AutoModel's own launchers it keeps;
and :class:`OwnSections`, what it shares with a user's function: a recipe whose sections are its own, written in
AutoModel's file format and handed to it as written.

AutoModel's launcher facts, each kept for an AutoModel recipe and changeable by the file (docs/slurm.md,
"AutoModel's template"; docs/skypilot.md):

* :data:`SLURM_DEFAULTS`: its ``SlurmConfig`` and sbatch template's defaults for what the ``slurm:`` section leaves
  out (the config pipeline applies them);
* :data:`SBATCH_OPTIONS` and :data:`TASK_ENV`: what its sbatch template fixed for every job;
* :data:`NODE_EXTRA` / :data:`NODE_CPU_EXTRA`: the extra of this project the SkyPilot nodes install (AutoModel's
  launcher installs its package in the task's setup).

Pure: nothing here imports torch or AutoModel at import time; the rank side (:meth:`AutoModel.run`) does.
"""

from __future__ import annotations

import copy
import os
import typing as tp
import warnings
from pathlib import Path

from automodel_hydra.automodel import files, resume
from automodel_hydra.paths import POINTER, local_reads, outermost, written_keys
from automodel_hydra.schema import ConfigError, require
from automodel_hydra.sections import FOR_EVERY_RANK

if tp.TYPE_CHECKING:
    from automodel_hydra.bootstrap import Distributed
    from automodel_hydra.config import TrainConfig
    from automodel_hydra.recipe_names import KindName
    from automodel_hydra.recipes import Recipe

#: NeMo AutoModel's Slurm defaults (its SlurmConfig and sbatch template) for the keys that set the hardware or the
#: bill, applied to an AutoModel recipe's ``slurm:`` section where the file leaves the key out, so the file asks for
#: what it asked for under AutoModel: a 5-minute limit, the ``batch`` partition and whole nodes (``--exclusive``);
#: like AutoModel, no ``--gpus-per-node`` unless ``gpus_per_node`` is given (every recipe). The bundled recipe's and
#: a user's function's defaults stay those of :class:`automodel_hydra.backends.slurm_config.SlurmConfig`.
SLURM_DEFAULTS: dict[str, tp.Any] = {"time": "00:05:00", "partition": "batch", "sbatch_args": {"exclusive": None}}
#: What NeMo AutoModel's sbatch template fixed for every job, kept for an AutoModel recipe (an AutoModel file
#: runs with the settings its recipes were developed under); each can be changed (docs/slurm.md,
#: "AutoModel's template"). Environment: task defaults (the submitting shell's value or an ``env_vars`` entry
#: wins): one CUDA work queue per device (``CUDA_DEVICE_MAX_CONNECTIONS=1``, which tensor- and sequence-parallel
#: communication overlap relies on to order its kernels), no ``recordStream`` on NCCL collectives' tensors
#: (``TORCH_NCCL_AVOID_RECORD_STREAMS=1``: their memory is freed when the collective ends, not when the caching
#: allocator next syncs) and NVLink SHARP off (``NCCL_NVLS_ENABLE=0``: NVLS needs CUDA multicast/IMEX, which
#: containers often lack, and reserves extra GPU memory).
TASK_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1", "NCCL_NVLS_ENABLE": "0"}
#: AutoModel's ``#SBATCH --mail-type=FAIL`` (mail to the submitting user when the job fails), kept likewise;
#: ``slurm.sbatch_args: {mail-type: false}`` leaves it out, ``{mail-user: ...}`` sets the address.
SBATCH_OPTIONS = {"mail-type": "FAIL"}
#: The extra with NeMo AutoModel for a GPU node (pyproject.toml says why it is not the ``automodel`` extra), and the
#: CPU one (with its triton pin) for nodes without ``skypilot.accelerators``.
NODE_EXTRA, NODE_CPU_EXTRA = "automodel-gpu", "automodel"


class OwnSections:
    """A recipe whose sections are its own (``cfg.recipe_sections``, as the file wrote them): read with AutoModel's
    key names (its file format), handed to the ranks as written, its relative written dirs anchored under the job
    dir there (:func:`automodel_hydra.paths.anchored_sections`). The answers an AutoModel recipe and a user's
    function share; each subclass gives the rest."""

    name: KindName
    #: sbatch options and task environment defaults this kind adds (AutoModel's template's)
    sbatch_options: tp.Mapping[str, object] = {}
    task_env: tp.Mapping[str, str] = {}
    settable_keys: tuple[str, ...] = ()

    # ------------------------------------------------------------------------------------ config pipeline

    def slurm_defaults(self, recipe: tp.Any) -> dict[str, tp.Any]:
        return {}

    def rank_sections(self, sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
        from automodel_hydra.interpolations import resolve_plan_time

        return resolve_plan_time(sections)

    def check_world(self, cfg: TrainConfig, world_size: int) -> None:
        """AutoModel's ``StepScheduler`` rule for a ``step_scheduler`` section: the global batch is a whole number
        of micro-batches of the data-parallel ranks (:func:`automodel_hydra.automodel.files.data_parallel_size`)."""
        steps = cfg.recipe_sections.get("step_scheduler")
        if isinstance(steps, dict):
            gbs, lbs = steps.get("global_batch_size"), steps.get("local_batch_size")
            dp = files.data_parallel_size(cfg.recipe_sections, world_size)
            if isinstance(gbs, int) and isinstance(lbs, int) and lbs > 0:
                what = "world size" if dp == world_size else f"data-parallel size (of world size {world_size})"
                require(gbs % (lbs * dp) == 0, "step_scheduler.global_batch_size", gbs,
                        f"a multiple of step_scheduler.local_batch_size * {what} = {lbs} * {dp} = {lbs * dp}")

    def host_problems(self, cfg: TrainConfig) -> list[ConfigError]:
        return []

    def rank_spec(self, cfg: TrainConfig, ours: dict[str, tp.Any]) -> dict[str, tp.Any]:
        """The recipe's sections as written (its ``recipe:`` and ``seed`` included), then ours that every rank
        reads whatever the recipe (:data:`automodel_hydra.sections.FOR_EVERY_RANK`), nothing of the bundled
        recipe's added."""
        return {**cfg.recipe_sections, **{k: ours[k] for k in FOR_EVERY_RANK}}

    # ------------------------------------------------------------------------------------ paths

    def written_dirs(self, cfg: TrainConfig, job_dir: Path) -> list[tuple[str, Path]]:
        """Every :data:`automodel_hydra.paths.WRITTEN_DIR_KEYS` value of the sections the submitting side can
        resolve, under ``job_dir`` when relative."""
        sections = {k: v for k, v in cfg.recipe_sections.items() if k != "output_dir"}
        return [(key, Path(job_dir) / os.path.expanduser(value)) for key, value in written_keys(sections)
                if value.strip() and "$" not in value]

    def read_paths(self, cfg: TrainConfig) -> list[tuple[str, str]]:
        return files.read_path_values(cfg.recipe_sections)

    def checkpoint_dir(self, cfg: TrainConfig, job_dir: Path) -> Path | None:
        return None  # where its checkpoint section puts them, in its own layout

    def max_steps(self, cfg: TrainConfig) -> int | None:
        return None  # its steps are its own: the ranks keep an earlier result (worker.write_result)

    # ------------------------------------------------------------------------------------ the driver

    def check_recipe(self, cfg: TrainConfig, recipe: Recipe | None, seen: set[str], here: bool, ranks_here: bool,
                     note: tp.Callable[[str], None]) -> None:
        """What the ranks will run, checked here before anything starts, once the recipe resolved (``recipe``;
        None: it imports only where the ranks run): its sections load (:meth:`_check_sections`; what is left to
        the ranks is a ``note``), and every model it names can be fetched when the ranks read this machine's files
        (``here``: :func:`check_models`). Raises ValueError subclasses with one line."""
        if recipe is not None:
            self._check_sections(cfg, recipe, here, ranks_here, note)
        check_models([name for _, name in files.model_names(cfg.recipe_sections)], seen, here)

    def _check_sections(self, cfg: TrainConfig, recipe: Recipe, here: bool, ranks_here: bool,
                        note: tp.Callable[[str], None]) -> None:
        return None

    def local_problem(self, cfg: TrainConfig, resolve: tp.Callable[[tp.Any], Recipe]) -> str | None:
        return None

    # ------------------------------------------------------------------------------------ SkyPilot

    def node_extras(self, accelerators: str | None) -> tuple[str, ...]:
        return ()

    def upload_sources(self, cfg: TrainConfig, where: str, how: str) -> dict[str, str]:
        """Its local model and dataset paths (:func:`automodel_hydra.paths.local_reads`: absolute and existing here,
        else ConfigError), each uploaded to the same path on the nodes: path -> its real path here."""
        return {path: source for _, path, source in local_reads(cfg, where, how)}

    def on_nodes(self, cfg: TrainConfig, *, root: str, out: str, mount: str, uploaded: tp.Mapping[str, str],
                 inside: tp.Sequence[str], where: str, how: str) -> tuple[dict[str, str], dict[str, str]]:
        """Its sections reach the nodes as written: no key changes but the resume key (:meth:`_node_resume`);
        its local reads are file mounts at the same paths (node path -> source here)."""
        reads = local_reads(cfg, where, how, check_here=False, inside=inside)
        return self._node_resume(cfg, mount), {p: uploaded.get(p, p) for p in outermost(p for _, p, _ in reads)}

    def _node_resume(self, cfg: TrainConfig, mount: str) -> dict[str, str]:
        return {}

    def skypilot_problems(self, cfg: TrainConfig, mount: str, use_spot: bool) -> list[ConfigError]:
        return []  # its sections are its own: it resumes as it does

    # ------------------------------------------------------------------------------------ the ranks

    def rank_config(self, cfg: TrainConfig) -> dict[str, tp.Any]:
        """What :func:`automodel_hydra.recipes.run_recipe` gets on a rank: the recipe's sections."""
        return cfg.recipe_sections

    def own_capture_range(self, cfg: TrainConfig) -> str | None:
        """Under ``profile=nsys``: why the recipe's own capture range is used (one line), else None: AutoModel's
        benchmark recipe calls the profiler API itself (:func:`automodel_hydra.profile.recipe_controls_range`)."""
        from automodel_hydra import profile

        if profile.recipe_controls_range(cfg.recipe_sections):
            return ("nsys capture range: the recipe's own (benchmark.nsys_start/nsys_end); profile.nsys.start_step "
                    "and stop_step are not used")
        return None

    def with_written_defaults(self, sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
        """``sections`` with the written dirs the recipe uses by default written out, to be anchored like a
        written one (a copy when changed)."""
        return sections

    def run(self, recipe: Recipe, sections: dict[str, tp.Any], dist: Distributed,
            should_stop: tp.Callable[[], bool], output_dir: str | None) -> dict[str, tp.Any]:
        """Run ``recipe`` on this rank with its ``sections`` (written dirs anchored under ``output_dir``); returns
        the final metrics, ``stopped_early`` included."""
        raise NotImplementedError


class AutoModel(OwnSections):
    """An AutoModel recipe class (``recipe: TrainFinetuneRecipeForNextTokenPrediction``, a dotted class path)."""

    name: KindName = "automodel"
    sbatch_options: tp.Mapping[str, object] = SBATCH_OPTIONS
    task_env: tp.Mapping[str, str] = TASK_ENV
    #: its resume key (:mod:`automodel_hydra.automodel.resume`), which its files seldom have
    settable_keys: tuple[str, ...] = (resume.KEY,)

    def slurm_defaults(self, recipe: tp.Any) -> dict[str, tp.Any]:
        return copy.deepcopy(SLURM_DEFAULTS)

    def rank_sections(self, sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
        """Its resume keys' meaning, checked as written (:func:`automodel_hydra.automodel.resume.problems`), then
        Hydra's runtime values resolved."""
        for problem in resume.problems(sections):
            raise problem
        return super().rank_sections(sections)

    def host_problems(self, cfg: TrainConfig) -> list[ConfigError]:
        """Its dataset paths (:func:`missing_here`) and its resume keys, in AutoModel's layout
        (:func:`automodel_hydra.automodel.resume.host_problems`)."""
        written = resume.checkpoint_dir(cfg.recipe_sections)  # relative: under the job dir (paths.py)
        own = None if "$" in written else os.path.normpath(Path(cfg.output_dir) / os.path.expanduser(written))
        return [*missing_here(cfg), *resume.host_problems(cfg.recipe_sections, own)]

    def _check_sections(self, cfg: TrainConfig, recipe: Recipe, here: bool, ranks_here: bool,
                        note: tp.Callable[[str], None]) -> None:
        """AutoModel's own loader accepts the sections (when AutoModel is installed here); a ``_target_`` that does
        not import here is left to ranks that run elsewhere (a note)."""
        if recipe.kind != "automodel":  # a function under nemo_automodel.: the resolver's answer holds
            return
        sections = files.split_sections(cfg.recipe_sections)[1]
        for key, name in files.validate_recipe_sections(sections, allow_unset_env=not here, ranks_here=ranks_here):
            note(f"{key}={name} does not import on this machine: the ranks import it first thing, where they run "
                 f"({cfg.backend})")

    def local_problem(self, cfg: TrainConfig, resolve: tp.Callable[[tp.Any], Recipe]) -> str | None:
        """Why its CUDA calls cannot run on this host, where its ranks would be this host's processes
        (:func:`automodel_hydra.automodel.recipe.cuda_problem`), with the recipe as ``resolve`` (the resolver of
        :mod:`automodel_hydra.recipes`) finds it; else None. A recipe that does not resolve is the driver's
        ``check_recipe`` line, not this one's."""
        from automodel_hydra.automodel.recipe import cuda_problem
        from automodel_hydra.recipe_names import RecipeError

        try:
            recipe = resolve(cfg.recipe)
        except RecipeError:
            return None
        return cuda_problem(recipe.obj, recipe.target.rpartition(".")[2])

    def node_extras(self, accelerators: str | None) -> tuple[str, ...]:
        return (NODE_EXTRA if accelerators else NODE_CPU_EXTRA,)

    def _node_resume(self, cfg: TrainConfig, mount: str) -> dict[str, str]:
        """``restore_from.path: <mount>/latest`` means ``latest`` on the nodes (its ranks:
        :mod:`automodel_hydra.automodel.resume`)."""
        path = (cfg.recipe_sections.get("restore_from") or {}).get("path")
        return {resume.KEY: POINTER} if resume.is_mount_pointer(str(path), mount) else {}

    def skypilot_problems(self, cfg: TrainConfig, mount: str, use_spot: bool) -> list[ConfigError]:
        """Its resume keys: only the job's own checkpoints are on the nodes
        (:func:`automodel_hydra.automodel.resume.skypilot_problems`). On spot, a checkpoint its recovered nodes
        cannot read is a warning: AutoModel's own launcher runs these files on spot (a preemption ends its job); a
        managed job is recovered, and with no checkpoint its fresh nodes can read, the recovery trains from step 0
        again: the work is redone, not lost or reported, so the plan goes ahead and says so (docs/skypilot.md)."""
        problems = resume.skypilot_problems(cfg.recipe_sections, mount, use_spot)
        node = cfg.recipe_sections.get("checkpoint")
        if problems or not use_spot or not isinstance(node, dict):
            return problems
        where = node.get("checkpoint_dir")
        lost = None
        if node.get("enabled") is False:
            lost = "checkpoint.enabled=false", "checkpoint.enabled=true"
        elif isinstance(where, str) and where.startswith(("/", "~")) and not where.startswith(mount.rstrip("/") + "/"):
            lost = (f"checkpoint.checkpoint_dir={where} (the node's disk)",
                    f"a relative checkpoint.checkpoint_dir (the job's own, in its bucket) or one under "
                    f"{mount.rstrip('/')}/")
        if lost is not None:
            warnings.warn(f"{lost[0]} with skypilot.use_spot=true: a preempted job is recovered on fresh nodes "
                          f"that have no checkpoint of it and trains from step 0 again; {lost[1]} makes it "
                          "resume (or skypilot.use_spot=false)", stacklevel=3)
        return []

    def with_written_defaults(self, sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
        """AutoModel's default ``checkpoint.checkpoint_dir`` written out when the file leaves it out
        (:func:`automodel_hydra.automodel.recipe.with_checkpoint_dir`)."""
        from automodel_hydra.automodel.recipe import with_checkpoint_dir

        return with_checkpoint_dir(sections)

    def run(self, recipe: Recipe, sections: dict[str, tp.Any], dist: Distributed,
            should_stop: tp.Callable[[], bool], output_dir: str | None) -> dict[str, tp.Any]:
        """The recipe class on this rank (:func:`automodel_hydra.automodel.recipe.run`)."""
        from automodel_hydra.automodel.recipe import run

        return run(recipe.obj, sections, dist, should_stop)


AUTOMODEL = AutoModel()


def missing_here(cfg: TrainConfig) -> list[ConfigError]:
    """The dataset files and dirs among an AutoModel recipe's read paths that do not exist on this machine, for
    ranks that read this machine's files (torchrun here, bare-metal Slurm; where they do not,
    :func:`automodel_hydra.paths.local_reads` refuses them): one ConfigError each, naming the key and the value.

    Only values that are a path by their form are looked up (:func:`automodel_hydra.paths.path_form`: absolute or
    ``~``, the ranks' user being this one); a Hub dataset id (``name``, ``org/name``) or a URL is left to
    AutoModel's loader, and a relative path to the ranks' working dir (``hydra.job.chdir``, ``slurm.chdir`` may
    make it another one). Model keys are :func:`automodel_hydra.automodel.files.check_model_fetchable`'s (a model
    dir must also hold ``config.json``)."""
    from automodel_hydra.paths import path_form

    problems = []
    for key, value in files.read_path_values(cfg.recipe_sections):
        if key.rpartition(".")[2] == files.MODEL_KEY or path_form(value) not in ("absolute", "home"):
            continue
        here = os.path.expanduser(value)
        if not os.path.exists(here):
            problems.append(ConfigError(key, value, f"{here} does not exist on this machine, where the ranks read "
                                        "it; valid: an existing file or dir, or a Hugging Face Hub dataset id"))
    return problems


def check_models(models: tp.Iterable[str], seen: set[str], here: bool) -> None:
    """Every model the ranks load can be fetched where they run, when that is this machine's filesystem
    (``here``); each once (``seen``), none with a ``${...}`` only the ranks resolve
    (:func:`automodel_hydra.automodel.files.check_model_fetchable`, whose error is raised)."""
    for name in models:
        if here and name not in seen and "${" not in name:
            seen.add(name)
            files.check_model_fetchable(name)


def metrics_dir(spec: tp.Mapping[str, tp.Any], job_dir: Path) -> Path | None:
    """Where an AutoModel recipe writes ``training.jsonl`` and ``validation*.jsonl``: its
    ``checkpoint.checkpoint_dir`` as AutoModel reads it (:func:`automodel_hydra.automodel.resume.checkpoint_dir`),
    a relative one under the job dir as the ranks anchor it (:mod:`automodel_hydra.paths`), from a rank spec
    (``launch/job.yaml``) of a recipe that is not the bundled one; None for a dir only the ranks can resolve
    (``${VAR}``)."""
    value = resume.checkpoint_dir(spec)
    if "$" in value:
        return None
    return Path(job_dir) / os.path.expanduser(value)
