"""Shell references in SkyPilot fields, and the task's environment built from them (pure; no ``import sky``).

A value such as ``${DATA}/sub`` means what it means in a shell (bash(1), "Parameter Expansion"), expanded from the
submitting environment when the job is launched, never when it is planned:

===========================  ====================================================================================
``$VAR``, ``${VAR}``         the variable; unset = an error naming the field (AutoModel: ``KeyError``)
``${VAR:-default}``          ``default`` when VAR is unset or empty
``${VAR-default}``           ``default`` when VAR is unset
``${VAR,default}``           AutoModel's form of ``${VAR-default}`` (``nemo_automodel`` config loader)
``${oc.env:VAR[,default]}``  OmegaConf's form, same meaning
``\\$``                       a literal ``$``; a ``$`` before anything else (``$5``, ``$(``) is literal too
===========================  ====================================================================================

Any other ``${...}`` (``${VAR:?}``, ``${VAR/a/b}``) is refused, naming the field. What becomes of a value on the
nodes (:func:`task_env`): without a reference it is a literal in the task's ``envs``; a value that is exactly one
reference, and every ``hf_token`` / ``wandb_key``, is a SkyPilot secret (``secrets: {NAME: null}``, the value put
into the in-memory ``sky.Task`` at launch); any other value with a reference is ``envs: {NAME: null}``, SkyPilot's
"supplied at launch" form, its value given at launch as ``sky launch --env NAME=...`` would.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp
import warnings

from automodel_hydra.plan import PreflightError
from automodel_hydra.schema import ConfigError, require

_REF = re.compile(r"""
    \\(?P<esc>\$)
  | \$\{(?:oc\.env:)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|,)(?P<default>[^}]*))?\}
  | \$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<bad>\$\{[^}]*\}?)
""", re.VERBOSE)
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LOOKS_LIKE_VAR = re.compile(r"^[A-Z][A-Z0-9_]*_[A-Z0-9_]*$|^[A-Z]{2,}$")
VALID_REFS = "$VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR,default}; \\$ for a literal $"


@dataclasses.dataclass(frozen=True)
class Ref:
    """One reference to a variable of the submitting environment; ``op`` ``:-``, ``-`` or ``,`` has a default."""

    name: str
    op: str | None = None
    default: str = ""

    def value(self, environ: tp.Mapping[str, str]) -> str | None:
        """The expansion in ``environ``, or None when the variable is unset and there is no default."""
        value = environ.get(self.name)
        if (self.op == ":-" and not value) or (self.op in ("-", ",") and value is None):
            return self.default
        return value

    def bash(self) -> str:
        """The same reference for bash, inside double quotes (AutoModel's ``,`` is bash's ``-``)."""
        if self.op is None:
            return "${" + self.name + "}"
        return "${" + self.name + (":-" if self.op == ":-" else "-") + _dq(self.default) + "}"


Part = tp.Union[str, Ref]


def parse(text: str, key: str) -> tuple[Part, ...]:
    """Split shell text into literal strings and :class:`Ref` s. Raises ConfigError naming ``key`` for a ``${...}``
    that is not one of the supported forms."""
    parts: list[Part] = []
    pos = 0
    for m in _REF.finditer(text):
        parts.append(text[pos:m.start()])
        pos = m.end()
        if m.group("bad") is not None:
            raise ConfigError(key, text, f"{m.group('bad')!r} is not a supported reference; use {VALID_REFS}")
        if m.group("esc"):
            parts.append("$")
        elif m.group("bare"):
            parts.append(Ref(m.group("bare")))
        else:
            op, default = m.group("op"), m.group("default") or ""
            parts.append(Ref(m.group("name"), op, default.strip() if op == "," else default))
    parts.append(text[pos:])
    merged: list[Part] = []  # adjacent literals joined, empty ones dropped
    for p in parts:
        if isinstance(p, str) and merged and isinstance(merged[-1], str):
            merged[-1] += p
        elif p != "":
            merged.append(p)
    return tuple(merged)


def expand(parts: tp.Sequence[Part], environ: tp.Mapping[str, str], key: str) -> str:
    """The value in ``environ``. Raises PreflightError naming ``key`` and the variable when one is unset without
    a default (nothing has been launched yet)."""
    out = []
    for p in parts:
        value = p if isinstance(p, str) else p.value(environ)
        if value is None:
            assert isinstance(p, Ref)
            raise PreflightError(f"{key} refers to ${{{p.name}}}, which is not set in this shell: export "
                                 f"{p.name}=..., give a default (${{{p.name}:-...}}), or remove the reference")
        out.append(value)
    return "".join(out)


def _dq(text: str) -> str:
    """``text`` escaped for the inside of bash double quotes."""
    return re.sub(r'([\\"$`])', r"\\\1", text)


# ----------------------------------------------------------------------------------------------- the task's env


@dataclasses.dataclass(frozen=True)
class EnvEntry:
    """One variable of the task: ``name`` on the nodes, ``key`` the config field it came from, ``parts`` its
    value. ``secret``: a SkyPilot secret (value only in memory), else an env."""

    name: str
    key: str
    parts: tuple[Part, ...]
    secret: bool = False

    @property
    def literal(self) -> str | None:
        """The value when it has no reference (then it is written in the task), else None."""
        if all(isinstance(p, str) for p in self.parts):
            return "".join(tp.cast(tp.Sequence[str], self.parts))
        return None

    def by_hand(self) -> str:
        """``--env NAME="..."`` / ``--secret NAME="..."`` as bash reads it; a literal secret by name only (the
        ``sky`` CLI then reads ``$NAME``), so no value is written."""
        flag = "--secret" if self.secret else "--env"
        if self.secret and not (len(self.parts) == 1 and isinstance(self.parts[0], Ref)):
            return f"{flag} {self.name}"
        text = "".join(_dq(p) if isinstance(p, str) else p.bash() for p in self.parts)
        return f'{flag} {self.name}="{text}"'


#: AutoModel's secret fields and the variable each becomes on the nodes (``nemo_automodel`` SkyPilot launcher).
SECRET_FIELDS = {"hf_token": "HF_TOKEN", "wandb_key": "WANDB_API_KEY"}


def task_env(env_vars: tp.Mapping[str, str], secrets: tp.Mapping[str, str | None], hf_home: str | None,
             hydra_env: tp.Sequence[tuple[str, str]], set_vars: tp.AbstractSet[str]) -> list[EnvEntry]:
    """Every variable of the task, in order: ``HF_HOME`` (``skypilot.hf_home``), Hydra's ``env_set``,
    ``skypilot.env_vars``, then the secrets ``HF_TOKEN`` / ``WANDB_API_KEY``.

    ``secrets`` maps ``hf_token`` / ``wandb_key`` to its value: None = the submitting shell's variable of the same
    name when ``set_vars`` (read by preflight) holds it, as AutoModel's ``os.environ.get`` default; "" = none.
    Later sources win over ``hf_home``; ``env_vars`` and ``env_set`` naming the same variable, or ``env_vars`` and
    a secret field both set, is a ConfigError naming both. Also raises ConfigError for a bad name or reference."""
    entries: dict[str, EnvEntry] = {}
    if hf_home:
        entries["HF_HOME"] = EnvEntry("HF_HOME", "skypilot.hf_home", parse(hf_home, "skypilot.hf_home"))
    for name, text in hydra_env:
        entries[name] = EnvEntry(name, f"hydra.job.env_set.{name}", (text,) if text else ())
    for name, raw in env_vars.items():
        key = f"skypilot.env_vars.{name}"
        require(bool(_ENV_NAME.fullmatch(str(name))), key, raw, "variable names are [A-Za-z_][A-Za-z0-9_]*")
        if name in entries and entries[name].key.startswith("hydra."):
            raise ConfigError(key, raw, f"hydra.job.env_set.{name} sets it too: keep one of the two")
        text = "" if raw is None else str(raw)
        parts = parse(text, key)
        if _LOOKS_LIKE_VAR.match(text):
            warnings.warn(f"{key}={text!r} is passed as the literal string {text!r}; write '${{{text}}}' to pass the "
                          f"submitting shell's ${text} instead", stacklevel=3)
        entries[name] = EnvEntry(name, key, parts, secret=len(parts) == 1 and isinstance(parts[0], Ref))
    for field, name in SECRET_FIELDS.items():
        value, key = secrets.get(field), f"skypilot.{field}"  # key: the config field, not the loop's env key
        if value is None and name in set_vars and name not in entries:
            entries[name] = EnvEntry(name, key, (Ref(name),), secret=True)
        elif value:
            if name in entries and entries[name].key.startswith("skypilot.env_vars"):
                raise ConfigError(key, "<set>", f"skypilot.env_vars.{name} sets {name} too: keep one of the two")
            parts = parse(value, key)
            if all(isinstance(p, str) for p in parts):
                warnings.warn(f"{key} holds the value itself, so it is in this run's config files; write "
                              f"'${{{name}}}' to read it from your shell at launch", stacklevel=3)
            entries[name] = EnvEntry(name, key, parts, secret=True)
    return list(entries.values())
