"""The recipe-kind interface: what the config pipeline, the driver, the backends and the ranks ask of the kind of
recipe a job runs, instead of testing which kind it is.

A job's ``recipe:`` names one of three kinds (:func:`automodel_hydra.recipe_names.kind_of`, docs/recipes.md), each
one implementation of :class:`RecipeKind`, a stateless object:

* :data:`BUNDLED` (:class:`Bundled`, here): this project's recipe, typed sections (:mod:`automodel_hydra.config`),
  its checkpoints in this project's layout (:mod:`automodel_hydra.checkpoint`);
* :data:`automodel_hydra.automodel.kind.AUTOMODEL`: an AutoModel recipe class, with AutoModel's launcher defaults
  and resume keys (the :mod:`automodel_hydra.automodel` package holds everything of AutoModel's);
* :data:`FUNCTION` (:class:`Function`, here): a user's function ``fn(cfg, dist, should_stop)``; its sections, like
  an AutoModel recipe's, are its own (:class:`automodel_hydra.automodel.kind.OwnSections`).

A job's kind is ``cfg.kind`` (:attr:`automodel_hydra.config.TrainConfig.kind`); before a config exists (a file's
raw sections, a rank spec read back) :func:`for_recipe` and :func:`metrics_dir`. Each answer is pure where its
question is (planning stays pure); ``host_problems``, ``check_recipe``, ``local_problem`` and ``upload_sources``
look at this machine, as the backends' preflights that ask them. Outside :mod:`automodel_hydra.automodel`, only
this module imports it (tests/test_house.py pins it, and that no other module tests a kind by name).
"""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

from automodel_hydra.automodel.kind import AUTOMODEL, OwnSections, check_models
from automodel_hydra.paths import DEFAULT_CHECKPOINT_DIR, METADATA, POINTER, pointer_dir, step_of
from automodel_hydra.recipe_names import KindName, RecipeError, kind_of, recipe_target
from automodel_hydra.schema import ConfigError, require

if tp.TYPE_CHECKING:
    from automodel_hydra.bootstrap import Distributed
    from automodel_hydra.config import TrainConfig
    from automodel_hydra.recipes import Recipe


class RecipeKind(tp.Protocol):
    """What a kind of recipe answers. ``cfg`` is always a job of this kind; paths are this machine's unless said."""

    #: the kind's name, as :func:`automodel_hydra.recipe_names.kind_of` gives it
    name: KindName
    #: sbatch options (sbatch(1) long names) it adds before ``slurm.sbatch_args``
    sbatch_options: tp.Mapping[str, object]
    #: task environment defaults (the submitting shell's value or ``slurm.env_vars`` wins)
    task_env: tp.Mapping[str, str]
    #: keys a command line may set on a file of this kind although the file lacks them, besides the sections our
    #: schema types (:func:`automodel_hydra.argv.for_user_config`)
    settable_keys: tuple[str, ...]

    # the config pipeline (automodel_hydra.config)
    def slurm_defaults(self, recipe: tp.Any) -> dict[str, tp.Any]:
        """``slurm:`` values for what a file of this recipe (``recipe:`` value ``recipe``) leaves out; a mapping
        value is the base the file's own mapping goes on top of."""
    def rank_sections(self, sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
        """Another recipe's sections as the ranks get them (Hydra's runtime values resolved at plan time), after
        the rules that hold wherever the job runs. Raises ConfigError."""
    def check_world(self, cfg: TrainConfig, world_size: int) -> None:
        """The rules that need the job's world size (its global batch). Raises ConfigError naming the key."""
    def host_problems(self, cfg: TrainConfig) -> list[ConfigError]:
        """The paths the ranks read, checked on this machine, whose filesystem they see (local, bare-metal Slurm)."""
    def rank_spec(self, cfg: TrainConfig, ours: dict[str, tp.Any]) -> dict[str, tp.Any]:
        """What every rank reads (``launch/job.yaml``), from ``ours``: the config without the sections no rank
        reads."""

    # paths (automodel_hydra.paths)
    def written_dirs(self, cfg: TrainConfig, job_dir: Path) -> list[tuple[str, Path]]:
        """``(key, path)`` of every dir the recipe writes (the job dir aside), relative ones under ``job_dir``."""
    def read_paths(self, cfg: TrainConfig) -> list[tuple[str, str]]:
        """``(key, value)`` of every Hub id or local path the ranks read, as written."""
    def checkpoint_dir(self, cfg: TrainConfig, job_dir: Path) -> Path | None:
        """Where the job checkpoints in this project's layout (``step-N``, ``latest``:
        :mod:`automodel_hydra.checkpoint` finds them), for a job dir ``job_dir``; None when the recipe
        checkpoints its own way."""
    def max_steps(self, cfg: TrainConfig) -> int | None:
        """The step the job trains to, when its resume point is this project's to find (the driver then keeps an
        earlier result or refuses a finished resume); None when the ranks decide."""

    # the driver and the interactive backend
    def check_recipe(self, cfg: TrainConfig, recipe: Recipe | None, seen: set[str], here: bool, ranks_here: bool,
                     note: tp.Callable[[str], None]) -> None:
        """Its sections and models checked before anything starts (each model once: ``seen``); ``recipe`` the
        resolved recipe (None: it imports only where the ranks run); ``here``: the ranks read this machine's
        files; ``ranks_here``: they are this machine's processes; ``note`` gets each thing left to the ranks."""
    def local_problem(self, cfg: TrainConfig, resolve: tp.Callable[[tp.Any], Recipe]) -> str | None:
        """Why its ranks cannot run as this host's processes (one line), else None."""

    # SkyPilot
    def node_extras(self, accelerators: str | None) -> tuple[str, ...]:
        """This project's extras the nodes install for it (``skypilot.accelerators``: GPU nodes or not)."""
    def upload_sources(self, cfg: TrainConfig, where: str, how: str) -> dict[str, str]:
        """Its local reads that travel to nodes that do not see this machine (``where``, shipped the ``how``
        way): the path as written -> its real path here. Raises ConfigError for one that cannot."""
    def on_nodes(self, cfg: TrainConfig, *, root: str, out: str, mount: str, uploaded: tp.Mapping[str, str],
                 inside: tp.Sequence[str], where: str, how: str) -> tuple[dict[str, str], dict[str, str]]:
        """``(spec keys, file mounts)`` on SkyPilot's nodes: the dotted keys of the rank spec that change there
        (-> their node value) and the file mounts of its reads (node path -> source here). ``root``: the job's
        dir on a node, ``out`` its output dir there, ``mount`` the checkpoint mount, ``uploaded`` what
        :meth:`upload_sources` found, ``inside`` dirs already on the nodes. Pure."""
    def skypilot_problems(self, cfg: TrainConfig, mount: str, use_spot: bool) -> list[ConfigError]:
        """Its resume keys on SkyPilot, where only the job's own checkpoints (under ``mount``) are on the nodes."""

    # the ranks (automodel_hydra.worker)
    def rank_config(self, cfg: TrainConfig) -> tp.Any:
        """What :func:`automodel_hydra.recipes.run_recipe` gets on a rank."""
    def own_capture_range(self, cfg: TrainConfig) -> str | None:
        """Under ``profile=nsys``, why the worker sets no capture range (the recipe calls the profiler API
        itself: the line to log, ``""`` for nothing to log), else None."""


class Bundled:
    """This project's recipe (:mod:`automodel_hydra.recipes.llm_finetune`): typed sections, its checkpoints in this
    project's layout under ``checkpoint.dir``, resumed as ``restore_from.path`` says."""

    name: KindName = "bundled"
    sbatch_options: tp.Mapping[str, object] = {}
    task_env: tp.Mapping[str, str] = {}
    settable_keys: tuple[str, ...] = ()

    def slurm_defaults(self, recipe: tp.Any) -> dict[str, tp.Any]:
        return {}

    def rank_sections(self, sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
        return sections  # its sections are typed, not passed on

    def check_world(self, cfg: TrainConfig, world_size: int) -> None:
        cfg.step_scheduler.grad_accumulation(world_size)

    def host_problems(self, cfg: TrainConfig) -> list[ConfigError]:
        """``data.path``, ``restore_from.path`` (``D/latest``: ``D`` a dir or not there yet)."""
        problems = []
        if cfg.data.source != "pydoc" and cfg.data.path and not Path(cfg.data.path).is_file():
            problems.append(ConfigError("data.path", cfg.data.path, "an existing file"))
        path = cfg.restore_from.path
        source = pointer_dir(path)
        if source is not None:  # D/latest: D need not exist yet (a first run starts fresh), but must be a dir
            if source.exists() and not source.is_dir():
                problems.append(ConfigError("restore_from.path", path, f"{source} is not a directory; valid: "
                                            "'latest', null, D/latest for a checkpoint dir D, or a step-N "
                                            "checkpoint dir"))
            return problems
        if path not in (None, POINTER) and not Path(path).is_dir():
            problems.append(ConfigError("restore_from.path", path,
                                        "'latest', null, or an existing checkpoint directory (a step-N dir)"))
        elif path not in (None, POINTER) and cfg.checkpoint.enabled and not (Path(path) / METADATA).is_file():
            # what the recipe would find only after the ranks started (checkpoint.py: a DCP dir has .metadata)
            steps = sorted((step, p) for p in Path(path).iterdir()
                           if (step := step_of(p.name)) is not None and (p / METADATA).is_file())
            hint = f" (this dir holds checkpoints: e.g. {steps[-1][1]})" if steps else ""
            problems.append(ConfigError("restore_from.path", path, "it holds no checkpoint (no .metadata); valid: "
                                        f"'latest', null, or a step-N checkpoint dir{hint}"))
        return problems

    def rank_spec(self, cfg: TrainConfig, ours: dict[str, tp.Any]) -> dict[str, tp.Any]:
        """Its resolved sections (with ``seed`` and ``dist_env``), without ``recipe``."""
        ours.pop("recipe", None)
        return ours

    def written_dirs(self, cfg: TrainConfig, job_dir: Path) -> list[tuple[str, Path]]:
        found = [("checkpoint.dir", cfg.checkpoint.under(job_dir))] if cfg.checkpoint.enabled else []
        if cfg.profile.nsys.enabled and cfg.profile.nsys.output_dir:
            found.append(("profile.nsys.output_dir", Path(job_dir) / cfg.profile.nsys.output_dir))
        return found

    def read_paths(self, cfg: TrainConfig) -> list[tuple[str, str]]:
        found = [("data.path", cfg.data.path)] if cfg.data.source != "pydoc" and cfg.data.path else []
        if cfg.model.name_or_path:
            found.append(("model.name_or_path", cfg.model.name_or_path))
        return [(k, v) for k, v in found if "$" not in v]

    def checkpoint_dir(self, cfg: TrainConfig, job_dir: Path) -> Path | None:
        """``checkpoint.dir`` (a relative one under the job dir: :mod:`automodel_hydra.paths`), or
        ``<job dir>/checkpoints``."""
        return Path(os.path.normpath(cfg.checkpoint.under(job_dir)))

    def max_steps(self, cfg: TrainConfig) -> int | None:
        return cfg.step_scheduler.max_steps

    def check_recipe(self, cfg: TrainConfig, recipe: Recipe | None, seen: set[str], here: bool, ranks_here: bool,
                     note: tp.Callable[[str], None]) -> None:
        check_models([cfg.model.name_or_path] if cfg.model.name_or_path else [], seen, here)

    def local_problem(self, cfg: TrainConfig, resolve: tp.Callable[[tp.Any], Recipe]) -> str | None:
        return None

    def node_extras(self, accelerators: str | None) -> tuple[str, ...]:
        return ()

    def upload_sources(self, cfg: TrainConfig, where: str, how: str) -> dict[str, str]:
        """Its ``data.path`` file (which must exist here) and a local ``model.name_or_path`` dir (else a Hub id)."""
        found = {}
        if cfg.data.source != "pydoc" and cfg.data.path:
            data = Path(cfg.data.path).expanduser()
            require(data.is_file(), "data.path", cfg.data.path, "an existing file here (it is uploaded to the "
                    "nodes)")
            found[cfg.data.path] = str(data.resolve())
        model = cfg.model.name_or_path
        if model and Path(model).expanduser().exists():  # a local model dir, else a hub id
            found[model] = str(Path(model).expanduser().resolve())
        return found

    def on_nodes(self, cfg: TrainConfig, *, root: str, out: str, mount: str, uploaded: tp.Mapping[str, str],
                 inside: tp.Sequence[str], where: str, how: str) -> tuple[dict[str, str], dict[str, str]]:
        """Its checkpoints in the job's output dir there (its bucket prefix or the node's disk); ``<mount>/latest``
        is ``latest`` there (the job's own checkpoints); its data file and local model dir under the job's
        ``launch/`` there."""
        keys = {"checkpoint.dir": f"{out}/{DEFAULT_CHECKPOINT_DIR}"}
        mounts = {}
        if cfg.restore_from.path is not None and _is_mount_pointer(cfg.restore_from.path, mount):
            keys["restore_from.path"] = POINTER
        if cfg.data.source != "pydoc" and cfg.data.path:  # the local text or jsonl file travels with the job
            node = f"{root}/launch/data/{Path(cfg.data.path).name}"
            mounts[node] = uploaded[cfg.data.path]
            keys["data.path"] = node
        model = cfg.model.name_or_path
        if model is not None and model in uploaded:  # a local model dir, not a hub id
            mounts[f"{root}/launch/model"] = uploaded[model]
            keys["model.name_or_path"] = f"{root}/launch/model"
        return keys, mounts

    def skypilot_problems(self, cfg: TrainConfig, mount: str, use_spot: bool) -> list[ConfigError]:
        """``restore_from.path``: ``latest`` or ``<mount>/latest`` (both: the job's own newest) or null; on spot,
        checkpoints on and ``latest`` (a recovered job resumes)."""
        path = cfg.restore_from.path
        if path is not None and _is_mount_pointer(path, mount):
            path = POINTER
        mine = f"'latest' or '{mount.rstrip('/')}/{POINTER}' (both: this job's newest checkpoint"
        if path not in (None, POINTER):
            return [ConfigError("restore_from.path", path, f"{mine}), or null on SkyPilot (a local checkpoint path "
                                "does not exist on the nodes; put it in the bucket and use skypilot.run_name to "
                                "resume from it)")]
        if use_spot and not cfg.checkpoint.enabled:
            return [ConfigError("checkpoint.enabled", False, "true with skypilot.use_spot=true: a recovered job "
                                "resumes from its newest checkpoint")]
        if use_spot and path != POINTER:
            return [ConfigError("restore_from.path", path, f"{mine}) with skypilot.use_spot=true: a recovered job "
                                "resumes")]
        return []

    def rank_config(self, cfg: TrainConfig) -> tp.Any:
        return cfg  # the validated TrainConfig

    def own_capture_range(self, cfg: TrainConfig) -> str | None:
        return ""  # it calls the profiler API itself (llm_finetune)


def _is_mount_pointer(path: str, mount: str) -> bool:
    """Whether ``restore_from.path`` is ``<checkpoint_mount>/latest`` (the spot-resume key
    ``restore_from: {path: /checkpoints/latest}``): on the nodes the mount holds the job's own checkpoints, in its
    run key's dir of the bucket, so this means ``latest`` there. Pure: compares text only."""
    return os.path.normpath(path) == os.path.join(mount.rstrip("/") or "/", POINTER)


class Function(OwnSections):
    """A user's function ``fn(cfg, dist, should_stop)`` (``recipe: my_pkg.train:main``): its sections are its own;
    its Slurm job is named after it; its ``dist.log`` rows go to the job's ``metrics.jsonl``."""

    name: KindName = "callable"

    def slurm_defaults(self, recipe: tp.Any) -> dict[str, tp.Any]:
        return {"job_name": recipe_target(recipe)}

    def rank_sections(self, sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
        """Hydra's runtime values resolved; what else it interpolates must resolve on the ranks
        (:func:`automodel_hydra.interpolations.rank_interpolation_problems`). Raises ConfigError."""
        from automodel_hydra.interpolations import rank_interpolation_problems

        resolved = super().rank_sections(sections)
        for problem in rank_interpolation_problems(resolved):
            raise problem
        return resolved

    def run(self, recipe: Recipe, sections: dict[str, tp.Any], dist: Distributed,
            should_stop: tp.Callable[[], bool], output_dir: str | None) -> dict[str, tp.Any]:
        """The function on this rank with its sections as a DictConfig; ``dist.log`` appends to
        ``<output_dir>/metrics.jsonl``. Raises RecipeError when it returns something other than a mapping or
        None."""
        from collections.abc import Mapping

        from omegaconf import OmegaConf

        from automodel_hydra.metrics import StepLog

        dist.step_log = StepLog(str(output_dir or "."), dist.rank)
        try:
            out = recipe.obj(OmegaConf.create(sections), dist, should_stop)
        finally:
            dist.step_log.close()
            dist.step_log = None
        if out is None:
            out = {}
        if not isinstance(out, Mapping):
            raise RecipeError(f"recipe {recipe.target} returned a {type(out).__name__}; a recipe function returns its "
                              "final metrics as a dict (e.g. {'loss': 1.2}) or None")
        result = dict(out)
        result.setdefault("stopped_early", bool(should_stop()))
        return result


class NamedBundled(OwnSections):
    """The bundled recipe named explicitly (``recipe: automodel_hydra.recipes.llm_finetune.train``): its sections
    travel as another recipe's, as written, and its ranks validate them (:func:`automodel_hydra.recipes.run_recipe`);
    no launcher default or rule of another kind applies."""

    name: KindName = "bundled"


BUNDLED: RecipeKind = Bundled()
FUNCTION = Function()
NAMED_BUNDLED = NamedBundled()
_KINDS: dict[KindName, RecipeKind] = {"bundled": BUNDLED, "automodel": AUTOMODEL, "callable": FUNCTION}
_RUNNERS: dict[KindName, OwnSections] = {"automodel": AUTOMODEL, "callable": FUNCTION}
#: Every kind's :attr:`RecipeKind.settable_keys`: a key outside it needs no kind asked.
SETTABLE_KEYS = frozenset(k for kind in (*_KINDS.values(), NAMED_BUNDLED) for k in kind.settable_keys)


def for_recipe(recipe: tp.Any) -> RecipeKind:
    """The kind of a ``recipe:`` value (:func:`automodel_hydra.recipe_names.kind_of`; a user's module may be imported
    to tell a class from a function): :data:`BUNDLED` for none, :data:`NAMED_BUNDLED` for the bundled recipe named.
    Raises RecipeError for a value that is not a recipe name."""
    if recipe is None:
        return BUNDLED
    name = kind_of(recipe)
    return NAMED_BUNDLED if name == "bundled" else _KINDS[name]


def of_sections(name: KindName) -> OwnSections:
    """The kind called ``name`` whose sections are its own (an AutoModel recipe, a function), as a rank runs it.
    Raises KeyError for the bundled recipe."""
    return _RUNNERS[name]


def for_file(sections: tp.Mapping[str, tp.Any]) -> RecipeKind:
    """The kind of a user's file (``sections``: its top level, as written): the bundled recipe's without a
    ``recipe:`` key. Raises RecipeError for a ``recipe:`` value that is not a recipe name."""
    return for_recipe(sections.get("recipe"))


def metrics_dir(spec: tp.Mapping[str, tp.Any], job_dir: Path) -> Path | None:
    """Where a job's recipe writes AutoModel's records (``training.jsonl``, ``validation*.jsonl``), from its rank
    spec (``launch/job.yaml``): for any recipe but the bundled one (asked without importing it: ``automodel-hydra
    status`` reads every job's), :func:`automodel_hydra.automodel.kind.metrics_dir`; None for the bundled recipe."""
    from automodel_hydra.automodel.kind import metrics_dir as own

    return None if spec.get("recipe") is None else own(spec, job_dir)
