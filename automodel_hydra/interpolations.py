"""What a recipe's own sections may still interpolate when they reach the ranks.

A function recipe's and an AutoModel file's sections are passed to the ranks as written (their own interpolation
forms, AutoModel's ``${VAR,default}`` included, mean what they mean where the ranks run). Two kinds of value cannot
mean anything there, and are dealt with where the job is planned:

* :data:`PLAN_TIME` interpolations (Hydra's runtime values ``${hydra:...}``, our output dirs' ``${automodel_uid:}``)
  resolve only inside the job's Hydra context, which the ranks do not have: :func:`resolve_plan_time` resolves them
  there, as Hydra's own launchers do (a rank would fail with ``UnsupportedInterpolationType``, and under fault
  tolerance be restarted into the same failure);
* a function's interpolation of a key the ranks do not get (a launcher section, Hydra's keys) or of a resolver
  unknown here: :func:`rank_interpolation_problems` makes each one line naming the key, before anything starts.

Everything else reaches the ranks as written: :func:`escape` keeps OmegaConf from reading it on the way
(:func:`omega_text`: the text that resolves to given literal pieces and interpolations).
"""

from __future__ import annotations

import re
import typing as tp

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from automodel_hydra.envvars import Interp
from automodel_hydra.schema import ConfigError
from automodel_hydra.sections import FOR_EVERY_RANK

#: Interpolations that resolve only where the launch is planned: Hydra's runtime values (``${hydra:...}``, from the
#: job's HydraConfig) and our output dirs' ``${automodel_uid:}``. Nothing nests in them (Hydra's keys are plain).
PLAN_TIME = re.compile(r"\$\{(?:hydra|automodel_uid):[^${}]*\}")
#: What a rank's config holds besides the recipe's own sections (``config.rank_spec``).
RANK_KEYS = FOR_EVERY_RANK


def resolve_plan_time(sections: tp.Any, key: str = "") -> tp.Any:
    """A recipe's own sections (a function's, an AutoModel file's; plain data, unresolved) with every
    :data:`PLAN_TIME` interpolation resolved now, inside the job's Hydra context: as under Hydra's own launchers,
    which resolve ``${hydra:runtime.output_dir}`` to the job's dir, so that the ranks, which run no Hydra, get the
    value (a rank would fail with ``UnsupportedInterpolationType``, and under fault tolerance be restarted into
    the same failure). A value that is one interpolation keeps the resolved type (``${hydra:job.num}`` -> 3);
    inside text it becomes text. Outside a Hydra job (a rank re-reading its spec) nothing is left to resolve.

    Raises ConfigError naming the key when one does not resolve here (an unknown key of Hydra's config)."""
    if isinstance(sections, dict):
        return {k: resolve_plan_time(v, f"{key}.{k}" if key else str(k)) for k, v in sections.items()}
    if isinstance(sections, list):
        return [resolve_plan_time(v, f"{key}[{i}]") for i, v in enumerate(sections)]
    if not isinstance(sections, str) or not PLAN_TIME.search(sections):
        return sections

    def value(text: str) -> tp.Any:
        try:
            return OmegaConf.create({"v": text})["v"]
        except (OmegaConfBaseException, ValueError) as e:  # ValueError: no HydraConfig (not inside a Hydra job)
            first = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise ConfigError(key, sections, f"{text} does not resolve where the job is planned ({first})") from None

    whole = PLAN_TIME.fullmatch(sections)
    if whole is not None:
        return value(sections)
    return PLAN_TIME.sub(lambda m: str(value(m.group(0))), sections)


def rank_interpolation_problems(sections: tp.Mapping[str, tp.Any]) -> list[ConfigError]:
    """Interpolations of a function recipe's sections that cannot resolve on its ranks, each one line naming the
    key: a key the ranks do not get (a launcher section such as ``${slurm.nodes}``, Hydra's ``${hydra.job.name}``:
    a rank's config is the recipe's sections plus :data:`RANK_KEYS`) or a resolver unknown here too. The function
    gets its config as an OmegaConf DictConfig with its interpolations live, so these would fail on every rank,
    where it reads the key. ``${oc.env:VAR}`` is the ranks' environment's and is not judged here."""
    plain = {k: v for k, v in sections.items() if k not in RANK_KEYS}
    try:
        node = OmegaConf.create(plain)
    except OmegaConfBaseException:
        return []
    problems: list[ConfigError] = []

    def walk(value: tp.Any, key: str) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{key}.{k}" if key else str(k))
        elif isinstance(value, list):
            for i, v in enumerate(value):
                walk(v, f"{key}[{i}]")
        elif (isinstance(value, str) and "${" in value and "${oc.env:" not in value
              and not any(f"${{{k}" in value for k in RANK_KEYS)):  # (the ranks get these: not judged here)
            from omegaconf.errors import InterpolationKeyError, UnsupportedInterpolationType

            try:
                OmegaConf.select(node, key, throw_on_resolution_failure=True)
            except (InterpolationKeyError, UnsupportedInterpolationType) as e:
                first = str(e).splitlines()[0] if str(e) else type(e).__name__
                problems.append(ConfigError(key, value, f"it does not resolve on the ranks ({first}): a rank's "
                                            "config is the recipe's sections, output_dir and profile, without the "
                                            "launcher sections or Hydra's; use ${hydra:...} (resolved when the job "
                                            "is planned) or a literal"))
            except OmegaConfBaseException:
                pass  # another failure (a custom resolver's own error): the ranks' to report

    walk(sections, "")
    return problems


def omega_text(pieces: tp.Iterable[str | Interp]) -> str:
    """OmegaConf text that resolves to the literal pieces as they are and to each :class:`Interp` as OmegaConf
    resolves it: ``${`` in a literal escaped as ``\\${``, backslashes right before a ``${`` doubled (OmegaConf's
    grammar)."""
    out = ""
    for piece in pieces:
        if isinstance(piece, Interp):
            out = re.sub(r"(\\+)$", r"\1\1", out) + piece.text
        else:
            out += re.sub(r"(\\*)\$\{", lambda m: m.group(1) * 2 + "\\${", piece)
    return out


def escape(value: tp.Any) -> tp.Any:
    """``value`` with every ``${`` escaped from OmegaConf, so a recipe's own interpolation forms (AutoModel's
    ``${VAR,default}``) reach it as written."""
    if isinstance(value, str):
        return omega_text([value])
    if isinstance(value, list):
        return [escape(v) for v in value]
    if isinstance(value, dict):
        return {k: escape(v) for k, v in value.items()}
    return value
