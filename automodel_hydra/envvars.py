"""``env_vars`` of a launcher section: parsed into literals and references, rendered without writing a secret.

``"${VAR}"`` (or ``"${oc.env:VAR}"``) in env_vars refers to the submitting shell's variable: generated scripts
carry the reference ``"${VAR}"`` and the job expands it at run time from the environment it inherits (torchrun's
child processes, the Slurm job's exported environment), and SkyPilot receives it as a secret. Literal values are
quoted with :func:`shlex.quote`, so ``;``, ``$( )``, quotes, spaces and newlines stay data.
"""

from __future__ import annotations

import re
import shlex
import typing as tp
import warnings
from dataclasses import dataclass

from automodel_hydra.schema import require

_SHELL_REF = re.compile(r"^\$\{(?:oc\.env:)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)\}$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOOKS_LIKE_VAR = re.compile(r"^[A-Z][A-Z0-9_]*_[A-Z0-9_]*$|^[A-Z]{2,}$")


@dataclass(frozen=True)
class EnvValue:
    """One ``env_vars`` entry. ``ref`` names a variable of the submitting shell (``"${HF_TOKEN}"``), expanded
    where the job runs and never written anywhere; otherwise ``literal`` is the value itself."""

    name: str
    literal: str | None = None
    ref: str | None = None

    def resolve(self, environ: tp.Mapping[str, str]) -> str:
        """The value for the job: the literal, or the referenced variable of ``environ`` ("" when unset)."""
        return (self.literal or "") if self.ref is None else environ.get(self.ref, "")


def parse_env_vars(raw: tp.Mapping[str, tp.Any], key: str) -> list[EnvValue]:
    """Split raw (unresolved) ``env_vars`` into literals and references to the submitting shell.

    ``"${VAR}"`` and ``"${oc.env:VAR}"`` are references; any other string is a literal. A literal that looks like
    a variable name (``HF_TOKEN: HF_TOKEN``) is kept, with a warning that it is not expanded.

    Raises ConfigError naming ``key.NAME`` for a name that is not a shell variable name."""
    out = []
    for name, value in raw.items():
        require(bool(_ENV_NAME.match(str(name))), f"{key}.{name}", value, "variable names are [A-Za-z_][A-Za-z0-9_]*")
        text = "" if value is None else str(value)
        m = _SHELL_REF.match(text)
        if m:
            out.append(EnvValue(str(name), ref=m.group("name")))
            continue
        if _LOOKS_LIKE_VAR.match(text):
            warnings.warn(
                f"{key}.{name}={text!r} is passed as the literal string {text!r}; write '${{{text}}}' to pass the "
                f"submitting shell's ${text} instead",
                stacklevel=2,
            )
        out.append(EnvValue(str(name), literal=text))
    return out


def export_lines(env: tp.Iterable[EnvValue]) -> list[str]:
    """``export NAME=...`` lines for a bash script: references stay ``"${VAR}"``, literals are quoted."""
    return [f'export {e.name}="${{{e.ref}}}"' if e.ref else f"export {e.name}={shlex.quote(e.literal or '')}" for e in env]


def missing_refs(env: tp.Iterable[EnvValue], environ: tp.Mapping[str, str]) -> list[str]:
    """Names of referenced shell variables that are not set in ``environ``."""
    return [e.ref for e in env if e.ref and e.ref not in environ]
