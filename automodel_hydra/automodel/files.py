"""Plan-time helpers for NeMo AutoModel YAML files, run on the submitting host before any rank starts.

An AutoModel fine-tuning YAML mixes two kinds of top-level sections: the launcher's (``slurm``, ``skypilot``,
``nemo_run`` and ours: :data:`automodel_hydra.sections.NEVER_THE_RECIPES`), which this product reads, and the
recipe's (``recipe``, ``model``, ``dataset``, ``step_scheduler``, ``checkpoint`` ...), which only the
recipe reads, on the ranks, with AutoModel's own loader.

* :func:`split_sections` separates them (AutoModel's CLI likewise pops ``skypilot`` / ``nemo_run`` before the
  recipe sees its config, ``nemo_automodel/cli/app.py``).
* :func:`validate_recipe_sections` loads the recipe sections with AutoModel's loader
  (``nemo_automodel.components.config.loader.ConfigNode``) when ``nemo_automodel`` is installed, so a bad
  ``_target_`` or an unset ``${VAR}`` fails here, naming the key; without AutoModel it does nothing.
* :func:`model_names` and :func:`check_model_fetchable`: a model that cannot be fetched fails here, with one line
  naming the model and the reason, instead of on every rank minutes later.

Nothing here imports torch; ``huggingface_hub`` and ``nemo_automodel`` are imported only when used.
"""

from __future__ import annotations

import os
import typing as tp
from collections.abc import Mapping
from pathlib import Path

from automodel_hydra import quiet
from automodel_hydra.schema import UserError
from automodel_hydra.sections import NEVER_THE_RECIPES

#: The key AutoModel's model builders (``NeMoAutoModelFor*.from_pretrained``, ``NeMoAutoTokenizer``, the KD
#: teacher) take a Hub id or local dir under.
MODEL_KEY = "pretrained_model_name_or_path"


#: Leaf keys of a dataset section (:func:`read_path_values`) whose value AutoModel 0.7.0's dataset builders load
#: as a Hub dataset id or a local file or dir (``nemo_automodel/components/datasets``): ``path_or_dataset``
#: (``load_dataset(path_or_dataset)``: the VLM, audio and HellaSwag builders), ``path_or_dataset_id`` (the
#: column-mapped and chat datasets: a Hub id unless the path exists, else local JSON/JSONL files, a parquet file
#: or dir), ``dataset_name`` (SQuAD, seq2seq, xLAM, agent chat: ``load_dataset``), ``path`` (agent chat's JSON
#: files, the retrieval datasets), ``data_path`` / ``dataset_path`` / ``data_dir_list`` / ``jsonl_path_list``
#: (EAGLE-3, retrieval, Megatron GPT, multimodal files). Megatron's ``paths`` are file prefixes, not paths, and
#: are not among them.
DATASET_PATH_KEYS = ("path_or_dataset", "path_or_dataset_id", "dataset_name", "path", "data_path", "dataset_path",
                     "data_dir_list", "jsonl_path_list")


class RecipeSectionError(UserError, ValueError):
    """A recipe section AutoModel's loader refuses. ``key`` is the dotted key, the message one line."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class ModelNotFetchableError(UserError, ValueError):
    """A model that no rank could load. ``model`` is the name as given, the message one line with the reason."""

    def __init__(self, model: str, reason: str) -> None:
        super().__init__(f"model {model!r} cannot be fetched: {reason}")
        self.model = model


#: The ``distributed:`` keys of AutoModel's parallelism sizes that divide the world into data-parallel replicas
#: (``nemo_automodel/recipes/_dist_utils.py``, ``_PARALLELISM_DEFAULTS``: absent or null = 1).
MODEL_PARALLEL_KEYS = ("tp_size", "cp_size", "pp_size")


def data_parallel_size(recipe_sections: Mapping[str, tp.Any], world_size: int) -> int:
    """The data-parallel size an AutoModel recipe runs with on ``world_size`` ranks: the ``dp_size`` its
    step scheduler divides ``global_batch_size`` by (``StepScheduler``: a multiple of ``local_batch_size *
    dp_size``, where the recipe passes ``_get_dp_group_size()``, the size of its device mesh's ``dp`` axis).

    AutoModel's rule (``nemo_automodel/components/distributed/mesh_utils.py``, ``_infer_dp_size``): an explicit
    ``distributed.dp_size`` > 0 stands; otherwise ``world_size / (tp_size * cp_size * pp_size)``, and
    ``world_size / (tp_size * cp_size)`` for ``strategy: megatron_fsdp`` (its mesh has no pipeline axis). Sizes
    absent, null or AutoModel's ``none`` count as 1 (``dp_size``: inferred). A section or size that is not a
    plain number (an interpolation) gives ``world_size``: nothing is decided for it here.

    Raises ConfigError naming ``distributed.tp_size`` (or the size that does not divide) when the world size is
    not a multiple of the model-parallel sizes, as AutoModel's mesh does ("world_size must be divisible by ...").
    """
    from automodel_hydra.schema import ConfigError

    dist = recipe_sections.get("distributed")
    if not isinstance(dist, Mapping):
        return world_size

    def size(key: str) -> int | None:
        value = dist.get(key)
        if value is None or isinstance(value, str) and value.strip().lower() in ("none", "null", "~", ""):
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(key)
        return value

    try:
        explicit = size("dp_size")
        if explicit is not None and explicit > 0:
            return explicit
        keys = MODEL_PARALLEL_KEYS[:2] if str(dist.get("strategy", "")).lower() == "megatron_fsdp" \
            else MODEL_PARALLEL_KEYS
        sizes = {k: max(size(k) or 1, 1) for k in keys}
    except TypeError:
        return world_size
    non_dp = 1
    for k in keys:
        non_dp *= sizes[k]
    if world_size % non_dp:
        product = " * ".join(f"{k}={sizes[k]}" for k in keys)
        first = next((k for k in keys if sizes[k] > 1), keys[0])
        raise ConfigError(f"distributed.{first}", sizes[first], f"the world size {world_size} must be a multiple "
                          f"of {product} = {non_dp} (AutoModel's device mesh)")
    return world_size // non_dp


def split_sections(cfg: Mapping[str, tp.Any]) -> tuple[dict[str, tp.Any], dict[str, tp.Any]]:
    """``(launcher_sections, recipe_sections)`` of a top-level config mapping (a dict or an OmegaConf DictConfig,
    taken without resolving interpolations, so ``${VAR}`` stays for AutoModel's loader). Both keep the input's key
    order; a dict's values are its own objects (not copies), a DictConfig's become plain containers."""
    items = _items(cfg)
    launcher = {k: v for k, v in items if k in NEVER_THE_RECIPES}
    recipe = {k: v for k, v in items if k not in NEVER_THE_RECIPES}
    return launcher, recipe


def validate_recipe_sections(recipe_sections: Mapping[str, tp.Any], *, allow_unset_env: bool = False,
                             ranks_here: bool = True) -> list[tuple[str, str]]:
    """Load every value of ``recipe_sections`` with AutoModel's loader, as a rank will; a no-op when
    ``nemo_automodel`` is not installed. Returns the ``(dotted key, target)`` pairs left to the ranks (below).

    Each leaf goes through ``ConfigNode`` on its own, so the error names its key: ``_target_`` and ``*_fn`` values
    are imported (AutoModel 0.7.0 imports any module found on ``sys.path`` and refuses private or dunder attributes
    unless ``NEMO_ENABLE_USER_MODULES=1``; ``path/file.py:attr`` targets load that file), ``${VAR}`` /
    ``${VAR,default}`` / ``${oc.env:VAR}`` / ``$VAR`` are expanded from this process's environment.
    ``allow_unset_env=True`` accepts a variable that is unset here (one that only the compute nodes set).
    ``ranks_here=False`` (the ranks run elsewhere: a Slurm node, a container, a cloud VM): a ``_target_`` / ``*_fn``
    whose module does not import on this machine (:func:`automodel_hydra.recipe_names.importable_here`: not
    installed here, or its import fails here, as Transformer Engine's does on a CPU login node) is left to the ranks,
    which import it first thing (:func:`automodel_hydra.automodel.recipe.run`); one that imports here is checked.

    Raises RecipeSectionError naming the dotted key and AutoModel's reason."""
    quiet.install()
    try:
        from nemo_automodel.components.config.loader import ConfigNode
    except ImportError:
        return []
    from automodel_hydra.recipe_names import import_problem

    deferred: list[tuple[str, str]] = []

    def check(key: str, name: str, value: tp.Any) -> None:
        if isinstance(value, Mapping) or isinstance(value, list) and any(
                isinstance(v, (Mapping, list)) for v in value):
            for k, v in (_items(value) if isinstance(value, Mapping) else enumerate(value)):
                check(f"{key}.{k}", str(k), v)
            return
        try:
            ConfigNode({name: value})
        except KeyError as e:  # the loader's "Environment variable 'X' is not set (required by '${X}')."
            if allow_unset_env and "Environment variable" in str(e):
                return
            raise RecipeSectionError(key, _one_line(e.args[0] if e.args else e)) from None
        except Exception as e:
            problem = (import_problem(value) if isinstance(value, str) and (name == "_target_" or
                                                                            name.endswith("_fn")) else None)
            if problem is not None and not ranks_here:
                deferred.append((key, value))
                return
            why = f" ({problem})" if problem is not None and problem not in str(e) else ""
            raise RecipeSectionError(key, f"{type(e).__name__}: {_one_line(e)}{why}") from None

    for k, v in _items(recipe_sections):
        check(str(k), str(k), v)
    return deferred


def model_names(recipe_sections: Mapping[str, tp.Any]) -> list[tuple[str, str]]:
    """Every ``pretrained_model_name_or_path`` in the recipe sections, as ``(dotted key, value)``, in order.
    A value with ``$`` is expanded with AutoModel's ``resolve_yaml_env_vars`` when AutoModel is installed and every
    variable is set, and left out otherwise (it names no model until a rank expands it)."""
    found: list[tuple[str, str]] = []

    def walk(key: str, value: tp.Any) -> None:
        if isinstance(value, Mapping):
            for k, v in _items(value):
                sub = f"{key}.{k}" if key else str(k)
                if k == MODEL_KEY and isinstance(v, str):
                    name = _expand(v)
                    if name is not None:
                        found.append((sub, name))
                else:
                    walk(sub, v)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(f"{key}.{i}", v)

    walk("", recipe_sections)
    return found


def read_path_values(recipe_sections: Mapping[str, tp.Any]) -> list[tuple[str, str]]:
    """``(dotted key, value)`` of every value in a recipe's sections that a rank reads as a Hub id or a local path,
    in order: every :data:`MODEL_KEY` (the model, ``model.config``, ``tokenizer``, ``processor``, ``teacher_model``,
    a dataset's tokenizer), and every :data:`DATASET_PATH_KEYS` leaf of a dataset section (a top-level section
    whose name ends in ``dataset``: AutoModel's ``dataset`` and ``validation_dataset``). A list of strings gives
    ``key.0``, ``key.1`` ... Left out: values with ``$`` (a rank expands them where it runs, to what they mean
    there) and sections whose name starts with ``_`` (AutoModel's files switch a section off so). Which values
    are local paths is :func:`automodel_hydra.paths.path_form` and, for the rest, whether they exist."""
    found: list[tuple[str, str]] = []

    def leaf(key: str, value: tp.Any) -> None:
        values = [(key, value)] if isinstance(value, str) else \
            [(f"{key}.{i}", v) for i, v in enumerate(value) if isinstance(v, str)] if isinstance(value, list) else []
        found.extend((k, v) for k, v in values if v.strip() and "$" not in v)

    def walk(key: str, value: tp.Any, dataset: bool) -> None:
        if isinstance(value, Mapping):
            for k, v in _items(value):
                sub = f"{key}.{k}"
                if k == MODEL_KEY or dataset and k in DATASET_PATH_KEYS:
                    leaf(sub, v)
                else:
                    walk(sub, v, dataset)
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(f"{key}.{i}", v, dataset)

    for name, section in _items(recipe_sections):
        name = str(name)
        if not name.startswith("_"):
            walk(name, section, name.endswith("dataset"))
    return found


def check_model_fetchable(name_or_path: str | os.PathLike[str], *, offline: bool | None = None,
                          cache_dir: str | os.PathLike[str] | None = None, revision: str | None = None,
                          token: bool | str | None = None) -> None:
    """Fail now if ``from_pretrained(name_or_path)`` could not get the model on a rank.

    * An existing directory must hold ``config.json`` (what ``from_pretrained`` reads first).
    * A path (absolute, ``./``, ``../``, ``~``, or more than one ``/``) that does not exist: "local dir missing".
    * A Hub repo id (validated with huggingface_hub's ``validate_repo_id``):

      - offline (``offline=True``, or when None, ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` set truthy in the
        environment now, huggingface_hub's own rule): its ``config.json`` must be in the cache
        (``try_to_load_from_cache``; ``cache_dir`` defaults to huggingface_hub's ``HF_HUB_CACHE``);
      - online: ``auth_check`` (a metadata request; no download) must pass: gated without access or not found
        fails; an unreachable Hub falls back to the cache check.

    Raises ModelNotFetchableError (one line: the model and the reason). Returns None when fetchable."""
    name = os.fspath(name_or_path)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFetchableError(name, f"local dir {path} has no config.json (not a saved model)")
        return
    if path.exists():
        raise ModelNotFetchableError(name, f"{path} is a file, not a model directory or a Hub repo id")
    if name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name:
        raise ModelNotFetchableError(name, f"local dir missing: {path} does not exist")
    import huggingface_hub
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(name)
    except ValueError as e:  # HFValidationError
        raise ModelNotFetchableError(name, "not an existing local dir nor a valid Hub repo id "
                                     f"({_one_line(e)})") from None
    if offline is None:
        offline = any(os.environ.get(v, "").upper() in ("1", "ON", "YES", "TRUE")
                      for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))
    if not offline:
        from huggingface_hub import errors

        try:
            huggingface_hub.auth_check(name, token=token)
            return
        except errors.GatedRepoError:
            raise ModelNotFetchableError(name, "gated repo and this token has no access (accept its license on "
                                         "the Hub and set HF_TOKEN)") from None
        except errors.RepositoryNotFoundError:
            raise ModelNotFetchableError(name, "not found on the Hugging Face Hub (or private: set HF_TOKEN)") \
                from None
        except Exception as e:
            reason = f"Hub unreachable ({type(e).__name__}: {_one_line(e)[:160]})"
    else:
        reason = "offline (HF_HUB_OFFLINE=1)"
    cached = huggingface_hub.try_to_load_from_cache(name, "config.json", revision=revision,
                                                    cache_dir=None if cache_dir is None else os.fspath(cache_dir))
    if not isinstance(cached, str):
        where = cache_dir if cache_dir is not None else huggingface_hub.constants.HF_HUB_CACHE
        raise ModelNotFetchableError(name, f"{reason} and not in the Hugging Face cache {where}")


def _expand(value: str) -> str | None:
    if "$" not in value:
        return value
    quiet.install()
    try:
        from nemo_automodel.components.config.loader import resolve_yaml_env_vars
    except ImportError:
        return None
    try:
        return str(resolve_yaml_env_vars(value))
    except KeyError:
        return None


def _items(cfg: Mapping[str, tp.Any] | tp.Any) -> list[tuple[tp.Any, tp.Any]]:
    """Key/value pairs of a dict or DictConfig, values unresolved (OmegaConf would read ``${VAR}`` as its own
    interpolation and fail)."""
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a dependency
        return list(cfg.items())
    if isinstance(cfg, (DictConfig, ListConfig)):
        cfg = OmegaConf.to_container(cfg, resolve=False)
    if not isinstance(cfg, Mapping):
        raise TypeError(f"expected a mapping of config sections, got {type(cfg).__name__}")
    return list(cfg.items())


def _one_line(e: object) -> str:
    return " ".join(str(e).split())
