"""The top-level sections of a job's config that this product reads, and what each one is: the one table.

Every other top-level key belongs to the recipe. The typed schema of each section is elsewhere
(:class:`automodel_hydra.config.TrainConfig` and the modules it names); this table says only which section plays
which part, and every list of section names in the package is read from it (:data:`LAUNCHER_SECTIONS`,
:data:`LAUNCH_KEYS`, :data:`BUNDLED_KEYS`, :data:`RECIPE_KEEPS`, :data:`NEVER_THE_RECIPES`,
:data:`NOT_FOR_RANKS`, :data:`FOR_EVERY_RANK`, :data:`NOT_SET_BY_USERS`, :func:`selected_by`). It imports nothing,
so the rank side and the planning side read the same table.
"""

from __future__ import annotations

import typing as tp

#: What a section is:
#:
#: ``launcher``  a launcher's own section: the one present decides where the job runs (none = torchrun here), and
#:               ``launcher=NAME`` on the command line gives a job that section; never read by a rank or a recipe
#: ``launch``    read where the job is launched, whatever the recipe; never by a rank or a recipe
#: ``rank``      ours whatever the recipe, and every rank reads it too (the profiler's capture range); never a
#:               recipe's
#: ``job``       the job's output dir: Hydra's job dir (``hydra.run.dir``, not a key to set), which every rank and
#:               every recipe is given
#: ``recipe``    names the recipe the ranks run; another recipe's sections keep it too (AutoModel's files have it)
#: ``shared``    the bundled recipe's, and a key any command line may set whatever the recipe; another recipe's
#:               own when another runs (158 of AutoModel's example files have a top-level ``seed`` its recipes read)
#: ``consumed``  read while composing or loading, never kept: Hydra's own config, AutoModel's NeMo-Run section
#:               (translated into ours: :mod:`automodel_hydra.automodel.nemo_run`), a file's ``launcher`` choice
#: ``filled``    filled by ``config.load`` (another recipe's sections, set apart), never set by a user
Role = tp.Literal["launcher", "launch", "rank", "job", "recipe", "shared", "consumed", "filled"]

SECTIONS: dict[str, Role] = {
    "slurm": "launcher",
    "skypilot": "launcher",
    "interactive": "launch",
    "fault_tolerance": "launch",
    "dry_run": "launch",
    "output_dir": "job",
    "profile": "rank",
    "failure_budget": "rank",
    "health_check": "rank",
    "recipe": "recipe",
    "seed": "shared",
    "hydra": "consumed",
    "nemo_run": "consumed",
    "launcher": "consumed",
    "recipe_sections": "filled",
}


def _having(*roles: Role) -> tuple[str, ...]:
    return tuple(name for name, role in SECTIONS.items() if role in roles)


#: The launcher sections: which one is present decides where the job runs (none = interactive).
LAUNCHER_SECTIONS = _having("launcher")
#: The sections this product reads whatever the recipe (typed by our schema); with a recipe other than the bundled
#: one, every other section belongs to that recipe (AutoModel's CLI likewise pops its launcher sections first).
LAUNCH_KEYS = _having("launcher", "launch", "rank", "job", "recipe", "shared")
#: The keys among :data:`LAUNCH_KEYS` that another recipe's file keeps as its own (not ours then).
BUNDLED_KEYS = _having("shared")
#: The keys among :data:`LAUNCH_KEYS` that another recipe's sections keep (its ``recipe:`` and its own ``seed``).
RECIPE_KEEPS = _having("recipe", "shared")
#: The sections never handed to a recipe of another kind (an AutoModel recipe class): the launcher's.
NEVER_THE_RECIPES = frozenset(_having("launcher", "launch", "rank", "consumed"))
#: The sections no rank reads: left out of the rank-side spec (``launch/job.yaml``).
NOT_FOR_RANKS = _having("launcher", "launch", "filled")
#: Ours in every rank's spec, whatever the recipe (beside another recipe's sections as written).
FOR_EVERY_RANK = _having("job", "rank")
#: Top-level keys a user does not set: the job's dir (Hydra's ``hydra.run.dir`` sets it), what loading fills, and
#: what is consumed before the config is loaded. Every other field of the schema is a section a user may set.
NOT_SET_BY_USERS = frozenset(_having("job", "filled", "consumed"))


def selected_by(section: str) -> str:
    """The command-line choice that gives a job the launcher section ``section``: ``launcher=slurm``."""
    return f"launcher={section}"
