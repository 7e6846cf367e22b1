"""Which recipe a job's ranks run (:func:`resolve`), and how a rank runs it (:func:`run_recipe`).

A job's ``recipe:`` key names it (docs/recipes.md has the user's side):

========================================================= ========= ==================================================
``recipe:``                                               kind      what a rank calls
========================================================= ========= ==================================================
absent / ``null``                                         bundled   :func:`.llm_finetune.train`
``TrainFinetuneRecipeForNextTokenPrediction`` (bare name) automodel ``cls(cfg).setup(); .run_train_validation_loop()``
``nemo_automodel.recipes.llm.train_ft.TrainFinetune...``  automodel the same (any class with those two methods)
``{_target_: <either of the two above>}``                 automodel the same
``my_pkg.train:main`` or ``my_pkg.train.main``            callable  ``main(cfg, dist, should_stop)``
========================================================= ========= ==================================================

Names are resolved as NeMo AutoModel's CLI resolves its YAML's ``recipe:`` (``nemo_automodel/cli/app.py``): a
string, or a mapping's ``_target_``; a name without a dot is looked up with AutoModel's public
``nemo_automodel.cli.utils.resolve_recipe_name`` (a scan of ``nemo_automodel/recipes/**.py`` for classes whose name
contains ``Recipe``); a dotted name is imported as ``module.attr`` (``rsplit(".", 1)``, as AutoModel's
``resolve_recipe_cls`` does). ``module:attr`` (the entry-point form) is ours, for functions. Like AutoModel's CLI,
a recipe name is imported as given: the job's author chose the code.

The user function contract (:class:`RecipeFunction`)::

    def main(cfg: DictConfig, dist: automodel_hydra.bootstrap.Distributed,
             should_stop: Callable[[], bool]) -> dict | None

It is called on every rank after the process group is initialised (``dist.rank``, ``dist.world_size``,
``dist.device``; with ``world_size > 1`` ``torch.distributed`` is ready). ``dist.log(step, **metrics)`` logs a
step (rank 0 appends it to the job's ``metrics.jsonl``: :meth:`automodel_hydra.bootstrap.Distributed.log`). It
returns the final metrics (e.g.
``{"loss": 1.23}``; ``None`` means ``{}``), checkpoints wherever it likes, and polls ``should_stop()`` at step
boundaries: it turns true after SIGUSR2 (Slurm's time-limit warning) or SIGTERM (preemption, cancel). A function that
stops early on it should agree with the other ranks (e.g. ``all_reduce`` of the flag), checkpoint, and return
``{"stopped_early": True, ...}``; when it returns without that key, :func:`run_recipe` fills in ``should_stop()``.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import typing as tp
from collections.abc import Mapping

from automodel_hydra import quiet
from automodel_hydra.recipe_names import _VALID, import_target
from automodel_hydra.recipe_names import BUNDLED as BUNDLED
from automodel_hydra.recipe_names import KindName as KindName
from automodel_hydra.recipe_names import RecipeError as RecipeError
from automodel_hydra.recipe_names import kind_of as kind_of
from automodel_hydra.recipe_names import recipe_target as recipe_target

if tp.TYPE_CHECKING:
    from omegaconf import DictConfig

    from automodel_hydra.bootstrap import Distributed

class RecipeFunction(tp.Protocol):
    """What a user's recipe function is (see the module docstring for the contract)."""

    def __call__(self, cfg: DictConfig, dist: Distributed,
                 should_stop: tp.Callable[[], bool]) -> Mapping[str, tp.Any] | None: ...


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A resolved recipe: its kind, its fully qualified name (``module.attr`` or ``module:attr``), the object."""

    kind: KindName
    target: str
    obj: tp.Any = dataclasses.field(repr=False, compare=False)


def resolve(spec: tp.Any) -> Recipe:
    """Resolve a job's ``recipe:`` value (None, a string, or a mapping with ``_target_``) to a :class:`Recipe`.

    Imports the recipe's module (and, for a bare class name, scans AutoModel's recipes), so call it where the
    recipe will run, or at plan time to fail before anything starts.

    Raises
    ------
    RecipeError
        Unknown bare name (with AutoModel's close matches), a module that does not import, a missing attribute,
        a class that is not an AutoModel-style recipe, or a function that cannot take ``(cfg, dist, should_stop)``.
    """
    target = recipe_target(spec)
    if target is None:
        from automodel_hydra.recipes import llm_finetune

        return Recipe("bundled", BUNDLED, llm_finetune.train)
    if ":" not in target and "." not in target:
        target = _automodel_recipe_name(target)
    obj = import_target(target)
    if inspect.isclass(obj):
        missing = [m for m in ("setup", "run_train_validation_loop") if not callable(getattr(obj, m, None))]
        if missing:
            raise RecipeError(f"recipe={target!r} is a class without {' and '.join(m + '()' for m in missing)}: an "
                              "AutoModel recipe class has setup() and run_train_validation_loop(); a function "
                              "recipe is called as fn(cfg, dist, should_stop)")
        return Recipe("automodel", target, obj)
    if not callable(obj):
        raise RecipeError(f"recipe={target!r} is a {type(obj).__name__}, not a class or function; valid: {_VALID}")
    if f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}" == BUNDLED:  # named explicitly
        return Recipe("bundled", BUNDLED, obj)
    _check_signature(target, obj)
    return Recipe("callable", target, obj)


def run_recipe(recipe: Recipe, cfg: tp.Any, dist: Distributed,
               should_stop: tp.Callable[[], bool] = lambda: False, output_dir: str | None = None) -> dict[str, tp.Any]:
    """Run ``recipe`` on this rank; the process group is initialised (the worker's ``init_distributed``).

    ``cfg`` is the job's config as the rank has it (``launch/job.yaml`` as a DictConfig, or a dict): the bundled
    recipe gets it validated (``config.load_rank``, unless it is a ``TrainConfig`` already), an AutoModel recipe
    gets its recipe sections (:func:`automodel_hydra.automodel.recipe.run`), a function gets it as a DictConfig
    (:meth:`automodel_hydra.recipe_kind.Function.run`). For the last two, a
    relative written dir (``checkpoint.checkpoint_dir: checkpoints/``; :data:`automodel_hydra.paths.WRITTEN_DIR_KEYS`)
    is made absolute under the job's ``output_dir`` (the argument, else ``cfg``'s own key) first, so that each job
    of a sweep writes its own; an AutoModel recipe's ``checkpoint.checkpoint_dir`` left out counts as AutoModel's
    default ``checkpoints/`` (:func:`automodel_hydra.automodel.recipe.with_checkpoint_dir`).

    Returns the final metrics as a dict that always has ``stopped_early``.

    Raises RecipeError when a function returns something other than a mapping or None; whatever the recipe raises.
    """
    if recipe.kind == "bundled":
        from automodel_hydra import config

        train_cfg = cfg if isinstance(cfg, config.TrainConfig) else config.load_rank(cfg)
        return dict(recipe.obj(train_cfg, dist, should_stop=should_stop))
    from omegaconf import DictConfig, OmegaConf

    from automodel_hydra import recipe_kind
    from automodel_hydra.paths import anchored_sections

    kind = recipe_kind.of_sections(recipe.kind)
    plain = tp.cast(dict[str, tp.Any], OmegaConf.to_container(cfg, resolve=False) if isinstance(cfg, DictConfig)
                    else dict(cfg))
    output_dir = output_dir or plain.get("output_dir")
    plain = kind.with_written_defaults(plain)  # AutoModel's own default, anchored below as a written dir
    if output_dir:
        plain = anchored_sections(plain, str(output_dir))
    return kind.run(recipe, plain, dist, should_stop, output_dir)


def _automodel_recipe_name(name: str) -> str:
    """AutoModel's fully qualified name for a bare recipe class name (``resolve_recipe_name``)."""
    quiet.install()
    try:
        from nemo_automodel.cli.utils import resolve_recipe_name
    except ImportError:
        raise RecipeError(f"recipe={name!r}: a bare class name is looked up among NeMo AutoModel's recipes, and "
                          "nemo_automodel is not installed (pip install 'automodel-hydra[automodel]'); or give a "
                          "dotted path module.attr / module:attr") from None
    try:
        return resolve_recipe_name(name)
    except ValueError as e:  # its message lists the known names, one "  - Name" line each
        known = [line.strip()[2:] for line in str(e).splitlines() if line.strip().startswith("- ")]
        close = difflib.get_close_matches(name, known, n=3)
        hint = (f"did you mean {', '.join(close)}?" if close
                else f"AutoModel has {len(known)}, e.g. {', '.join(known[:3])}." if known else "")
        raise RecipeError(f"recipe={name!r} is not one of NeMo AutoModel's recipe classes; {hint} Or give a "
                          "dotted path module.attr / module:attr") from None


def _check_signature(target: str, fn: tp.Callable[..., tp.Any]) -> None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none: nothing to check
        return
    try:
        sig.bind(None, None, None)
    except TypeError:
        raise RecipeError(f"recipe={target!r} takes {sig}; a recipe function is called as "
                          "fn(cfg, dist, should_stop)") from None
