"""env_vars for a job (SPEC section 4), rendered for the shell without ever writing a secret value.

``"${VAR}"`` (or ``"${oc.env:VAR}"``) in env_vars refers to the submitting shell's variable: generated scripts
carry the reference ``"${VAR}"`` and the job expands it at run time from the environment it inherits (torchrun's
child processes, ``sbatch``'s default ``--export=ALL``). Literal values are quoted with :func:`shlex.quote`, so
``;``, ``$( )``, quotes, spaces and newlines stay data.
"""

from __future__ import annotations

import shlex
import typing as tp

from automodel_hydra.config import EnvValue, parse_env_vars


def export_lines(env: tp.Iterable[EnvValue]) -> list[str]:
    """``export NAME=...`` lines for a bash script: references stay ``"${VAR}"``, literals are quoted."""
    return [f'export {e.name}="${{{e.ref}}}"' if e.ref else f"export {e.name}={shlex.quote(e.literal or '')}" for e in env]


def missing_refs(env: tp.Iterable[EnvValue], environ: tp.Mapping[str, str]) -> list[str]:
    """Names of referenced shell variables that are not set in ``environ`` (the job would see them empty)."""
    return [e.ref for e in env if e.ref and e.ref not in environ]


__all__ = ["EnvValue", "parse_env_vars", "export_lines", "missing_refs"]
