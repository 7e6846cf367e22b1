"""What a ``recipe:`` value names, told without running it: the bundled recipe, an AutoModel recipe class or a
user's callable (:func:`kind_of`), and the import of a ``module:attr`` / ``module.attr`` name
(:func:`import_target`). Imports nothing of this package but the schema's error base, so the config
(:mod:`automodel_hydra.config`) can ask a recipe's kind without importing the recipes; :mod:`automodel_hydra.recipes`
re-exports these names."""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import typing as tp
from collections.abc import Mapping
from pathlib import Path

from automodel_hydra import quiet
from automodel_hydra.schema import UserError

#: The bundled recipe, run when a job names none.
BUNDLED = "automodel_hydra.recipes.llm_finetune.train"

#: The kinds of recipe, by name (:mod:`automodel_hydra.recipe_kind` has what each answers).
KindName = tp.Literal["bundled", "automodel", "callable"]

_VALID = ("omit it (the bundled recipe), an AutoModel recipe class name (e.g. "
          "TrainFinetuneRecipeForNextTokenPrediction), a dotted path module.Class, {_target_: ...}, "
          "or a function module:attr / module.attr")


class RecipeError(UserError, ValueError):
    """A ``recipe:`` value that names nothing runnable. The message is one line: the value, why, what is valid."""


def recipe_target(spec: tp.Any) -> str | None:
    """The name a ``recipe:`` value gives, without importing anything: None for the bundled recipe, else the
    stripped string (a mapping's ``_target_``).

    Raises RecipeError for any other shape (a number, a list, a mapping without ``_target_``, an empty string)."""
    if spec is None:
        return None
    raw = spec.get("_target_") if isinstance(spec, Mapping) else spec
    if isinstance(raw, str) and raw.strip():
        return raw.strip()
    what = "a mapping without _target_" if isinstance(spec, Mapping) and raw is None else repr(spec)
    raise RecipeError(f"recipe={what} is not a recipe name; valid: {_VALID}")


def kind_of(spec: tp.Any) -> KindName:
    """The kind :func:`resolve` finds for a ``recipe:`` value, without importing NeMo AutoModel: bundled (None), an
    AutoModel recipe (a bare class name, which only AutoModel's recipes answer; a name under ``nemo_automodel.``;
    a class of the user's), or a callable (a function of the user's). A user's module is imported to tell a class
    from a function (once per name); one that does not import counts as callable here, and :func:`resolve` names
    the error at plan time. What depends on the kind: AutoModel's launcher defaults apply to AutoModel recipes
    only (docs/recipes.md).

    Raises RecipeError for a value that is not a recipe name (:func:`recipe_target`)."""
    target = recipe_target(spec)
    if target is None:
        return "bundled"
    return _kind_of_target(target)


@functools.lru_cache(maxsize=64)
def _kind_of_target(target: str) -> KindName:
    if ":" not in target and "." not in target or target.startswith("nemo_automodel."):
        return "automodel"
    try:
        obj = import_target(target)
    except RecipeError:
        return "callable"
    if f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}" == BUNDLED:
        return "bundled"
    return "automodel" if inspect.isclass(obj) else "callable"


def import_target(target: str) -> tp.Any:
    """``module:attr`` (attr may be dotted) or ``module.attr`` -> the object. Raises RecipeError naming the part
    that failed: a module that is not found, one whose own import raises (any exception: a GPU library raises
    RuntimeError on a host without a driver), a missing attribute."""
    module_name, sep, attr = target.partition(":")
    if not sep:
        module_name, _, attr = target.rpartition(".")
    if not module_name or not attr:
        raise RecipeError(f"recipe={target!r} is not module:attr or module.attr; valid: {_VALID}")
    quiet.install()  # a recipe module may import nemo_automodel
    try:
        obj: tp.Any = importlib.import_module(module_name)
    except ImportError as e:
        from automodel_hydra.snapshot import CODE_SRC_VAR

        snapshot = os.environ.get(CODE_SRC_VAR)  # set by a job that runs a code snapshot
        where = (f"; this job imports the code snapshot taken at submission ({snapshot}), which holds what "
                 "slurm.snapshot took" if snapshot else "")
        raise RecipeError(f"recipe={target!r}: cannot import module {module_name!r} ({e}); it must be importable "
                          f"on every rank (an installed package or PYTHONPATH){where}") from None
    except Exception as e:  # the module's own code failed (triton without a GPU driver: RuntimeError)
        first = " ".join(str(e).split()) or "no message"
        raise RecipeError(f"recipe={target!r}: importing module {module_name!r} failed here ({type(e).__name__}: "
                          f"{first}); it must import on the host that plans the job and on every rank") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise RecipeError(f"recipe={target!r}: module {module_name!r} has no attribute {attr!r}") from None
    return obj



def import_problem(target: str) -> str | None:
    """Why ``target`` (a ``_target_``, ``*_fn`` or ``recipe:`` name: ``a.b.C``, ``a.b:C`` or ``path/file.py:attr``)
    does not import in this process (``"ModuleNotFoundError: No module named 'x'"``, or the error its import raises
    here, e.g. a CUDA-only package on a CPU login node), or None when the module it names imports here, so that
    AutoModel's loader's verdict on the rest (an attribute missing, a private name) holds wherever the ranks run.
    Imports the module's parents as a rank would."""
    module_name, sep, _ = target.partition(":")
    if sep and module_name.endswith(".py"):
        return None if Path(module_name).is_file() else f"no file {module_name}"
    parts = (module_name if sep else target).split(".")
    quiet.install()
    for i in range(1, len(parts) + 1):
        name = ".".join(parts[:i])
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as e:
            if i > 1 and e.name == name:  # the package above has no such submodule: the rest are attributes
                return None
            return f"ModuleNotFoundError: {e}"
        except Exception as e:
            return f"{type(e).__name__}: {' '.join(str(e).split())[:200]}"
    return None


def importable_here(target: str) -> bool:
    """Whether the module ``target`` names imports in this process (:func:`import_problem`)."""
    return import_problem(target) is None
