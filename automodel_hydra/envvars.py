"""Shell references in launcher fields: the one grammar every field of every launcher is read with.

A launcher field's value means what the same text means inside a double-quoted bash word (bash(1), "QUOTING" and
"Parameter Expansion"), plus the two forms of the config world that name a variable of the submitting shell:

===============================  ================================================================================
``$VAR``, ``${VAR}``             the variable; unset = one line naming the field (:class:`UnsetReference`)
``${VAR:-default}``              ``default`` when VAR is unset or empty (bash)
``${VAR-default}``               ``default`` when VAR is unset (bash)
``${VAR,default}``               AutoModel's form of ``${VAR-default}`` (``nemo_automodel`` config loader; the
                                 default is stripped, as that loader strips it)
``${oc.env:VAR[,default]}``      OmegaConf's form of ``${VAR}`` / ``${VAR-default}``
``\\$``, ``\\\\``                  a literal ``$`` / ``\\``; a ``$`` before anything else (``$5``, ``$(``) and a
                                 ``\\`` before anything else are literal too; quotes are literal characters
===============================  ================================================================================

OmegaConf's own interpolations keep their meaning: ``${key}`` where ``key`` is a key of the config
(``${output_dir}``), a dotted or relative path (``${a.b}``, ``${.x}``) and a registered resolver (``${now:%H}``,
``${hydra:job.name}``) are :class:`Interp` parts, left to OmegaConf. Any other ``${...}`` (bash's ``${VAR:?}``,
``${VAR/a/b}``, ``${#VAR}``, a default holding a reference, an unclosed ``${``) is a :class:`ConfigError` naming the
field, in one line.

What a field's references become is the launcher's business, not the grammar's: most fields are expanded from the
submitting shell when the config is loaded; ``env_vars`` values and token fields keep their references for the
place the job runs (:class:`EnvValue`: the Slurm script expands them; SkyPilot gets their values at launch), so a
secret is never written to a file. Fields that are whole bash scripts for the job (``setup``, ``srun_args``) are
not read with this grammar at all: bash reads them where the job runs, single quotes and all.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import typing as tp
import warnings

from automodel_hydra.plan import PreflightError
from automodel_hydra.schema import ConfigError, require

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_REF_BODY = re.compile(r"(?:oc\.env:(?P<env>[A-Za-z_][A-Za-z0-9_]*)(?:,(?P<env_default>.*))?"
                       r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:-|-|,)(?P<default>.*))?)", re.S)
_NODE_PATH = re.compile(r"\.*[A-Za-z_][\w-]*(?:\.[\w-]+|\[\d+\])*|\.+[\w-]*")
_RESOLVER = re.compile(r"(?P<name>[A-Za-z_][\w.]*):")
_LOOKS_LIKE_VAR = re.compile(r"^[A-Z][A-Z0-9_]*_[A-Z0-9_]*$|^[A-Z]{2,}$")
VALID_REFS = "$VAR, ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR,default}; \\$ for a literal $"
#: Variables Slurm and SkyPilot set inside a job (sbatch(1)/srun(1) "OUTPUT ENVIRONMENT VARIABLES"; SkyPilot's
#: ``SKYPILOT_*``): a reference to one in ``env_vars`` is for the job, never for the submitting shell.
JOB_TIME_PREFIXES = ("SLURM_", "SLURMD_", "SKYPILOT_")


class UnsetReference(PreflightError):
    """A field refers to a variable that is not set in the submitting shell and gives no default; one line naming
    the field and the variable."""

    def __init__(self, key: str, name: str) -> None:
        self.key, self.name = key, name
        super().__init__(f"{key} refers to ${{{name}}}, which is not set in this shell: export {name}=..., give a "
                         f"default (${{{name}:-...}}), or remove the reference")


@dataclasses.dataclass(frozen=True)
class Ref:
    """One reference to a variable of the submitting shell. ``op``: None (no default), ``"-"`` (``default`` when
    unset) or ``":-"`` (``default`` when unset or empty), bash's operators."""

    name: str
    op: str | None = None
    default: str = ""

    def value(self, environ: tp.Mapping[str, str]) -> str | None:
        """The expansion in ``environ``, or None when the variable is unset and there is no default."""
        value = environ.get(self.name)
        if (self.op == ":-" and not value) or (self.op == "-" and value is None):
            return self.default
        return value

    def text(self) -> str:
        """The reference as :func:`parse` reads it back (``${NAME}``, ``${NAME-d}``, ``${NAME:-d}``)."""
        return "${" + self.name + (self.op + self.default if self.op else "") + "}"

    def bash(self) -> str:
        """The same reference for bash, inside double quotes (the default escaped, so it stays data)."""
        return "${" + self.name + (self.op + _dq(self.default) if self.op else "") + "}"


@dataclasses.dataclass(frozen=True)
class Interp:
    """An OmegaConf interpolation (``${output_dir}``, ``${now:%H}``), kept as written for OmegaConf."""

    text: str


Part = tp.Union[str, Ref, Interp]


def parse(text: str, key: str, is_config_key: tp.Callable[[str], bool] = lambda name: False) -> tuple[Part, ...]:
    """``text`` as literal strings, :class:`Ref` s and :class:`Interp` s, adjacent literals joined (the module
    docstring has the grammar). ``is_config_key(name)``: ``${name}`` is OmegaConf's interpolation of that key.

    Raises ConfigError naming ``key`` for a ``${...}`` that is neither a supported reference nor OmegaConf's."""
    parts: list[Part] = []
    literal: list[str] = []

    def emit(part: Part) -> None:
        if literal:
            parts.append("".join(literal))
            literal.clear()
        parts.append(part)

    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n and text[i + 1] in "$\\":
            literal.append(text[i + 1])
            i += 2
        elif text.startswith("${", i):
            end = _closing_brace(text, i + 2)
            if end < 0:
                raise ConfigError(key, text, f"{text[i:]!r} is not closed; use {VALID_REFS}")
            emit(_braced(text[i + 2:end], text[i:end + 1], key, text, is_config_key))
            i = end + 1
        elif c == "$" and (m := _NAME.match(text, i + 1)):
            emit(Ref(m.group()))
            i = m.end()
        else:
            literal.append(c)
            i += 1
    if literal:
        parts.append("".join(literal))
    return tuple(parts)


def _closing_brace(text: str, start: int) -> int:
    depth = 1
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


def _braced(body: str, whole: str, key: str, text: str, is_config_key: tp.Callable[[str], bool]) -> Part:
    from omegaconf import OmegaConf

    m = _REF_BODY.fullmatch(body)
    if m and "$" not in (m.group("default") or m.group("env_default") or "") and "{" not in body:
        if m.group("env"):
            default = m.group("env_default")
            return Ref(m.group("env"), None if default is None else "-", default or "")
        name, op, default = m.group("name"), m.group("op"), m.group("default") or ""
        if op is None and is_config_key(name):
            return Interp(whole)
        if op is None:
            return Ref(name)
        return Ref(name, "-" if op == "," else op, default.strip() if op == "," else default)
    resolver = _RESOLVER.match(body)
    if _NODE_PATH.fullmatch(body) or (resolver and OmegaConf.has_resolver(resolver.group("name"))):
        return Interp(whole)
    raise ConfigError(key, text, f"{whole!r} is not a supported reference; use {VALID_REFS}")


def expand(parts: tp.Sequence[Part], environ: tp.Mapping[str, str], key: str) -> str:
    """The value of ``parts`` in ``environ`` (an :class:`Interp` as its text). Raises :class:`UnsetReference`
    naming ``key`` for a variable that is unset and has no default."""
    out = []
    for p in parts:
        if isinstance(p, Ref):
            value = p.value(environ)
            if value is None:
                raise UnsetReference(key, p.name)
            out.append(value)
        else:
            out.append(p if isinstance(p, str) else p.text)
    return "".join(out)


def home_elsewhere(parts: tp.Sequence[Part], key: str, whose: str | None) -> tuple[Part, ...]:
    """``parts`` of a field that names another machine's path (``whose`` home: a login node's, the nodes'; None:
    a field of this machine's, ``parts`` as they are; ``slurm_config.HOME_ELSEWHERE``), with a
    leading ``$HOME`` / ``${HOME}`` (alone or before ``/``) read as ``~``, the home *there*, which the field's
    own rule gives its meaning (the login node's ``$HOME`` read at preflight; ``"$HOME"`` in the job's script):
    this shell's ``$HOME`` names this machine's home, never that one. ``["${HOME}", "/jobs"]`` ->
    ``["~", "/jobs"]``. Raises ConfigError naming ``key`` for ``HOME`` anywhere else (with a default, or
    inside the path), which has no meaning there; the line suggests no local path."""
    out = list(parts)
    if whose is None:
        return tuple(out)
    if out and isinstance(out[0], Ref) and out[0].name == "HOME" and out[0].op is None and (
            len(out) == 1 or (isinstance(out[1], str) and out[1].startswith("/"))):
        out[0] = "~"
        if len(out) > 1:
            out[0:2] = ["~" + tp.cast(str, out[1])]
    if any(isinstance(p, Ref) and p.name == "HOME" for p in out):
        raise ConfigError(key, render(parts), f"$HOME only at its start ($HOME/... or ~/...: {whose}); this "
                          "shell's $HOME names this machine's home, not that one")
    return tuple(out)


def render(parts: tp.Sequence[Part]) -> str:
    """Text that :func:`parse` reads back as ``parts`` (literal ``\\`` and ``$`` escaped)."""
    return "".join(_escape_literal(p) if isinstance(p, str) else p.text() if isinstance(p, Ref) else p.text
                   for p in parts)


def bash_text(parts: tp.Sequence[Part]) -> str:
    """``parts`` for the inside of a bash double-quoted word: literal text escaped, references as bash's."""
    return "".join(p.bash() if isinstance(p, Ref) else _dq(p if isinstance(p, str) else p.text) for p in parts)


def _escape_literal(text: str) -> str:
    return text.replace("\\", "\\\\").replace("$", "\\$")


def _dq(text: str) -> str:
    """``text`` escaped for the inside of bash double quotes."""
    return re.sub(r'([\\"$`])', r"\\\1", text)


def warn_bare_name(key: str, text: str) -> None:
    """Warn that ``text``, a literal that looks like a variable name (``HF_TOKEN``), is not expanded."""
    if _LOOKS_LIKE_VAR.match(text):
        warnings.warn(f"{key}={text!r} is passed as the literal string {text!r}; write '${{{text}}}' to pass the "
                      f"submitting shell's ${text} instead", stacklevel=3)


def check_name(key: str, name: tp.Any, value: tp.Any) -> None:
    """``name`` is a shell variable name; else ConfigError naming ``key``."""
    require(bool(_NAME.fullmatch(str(name))), key, value, "variable names are [A-Za-z_][A-Za-z0-9_]*")


# ----------------------------------------------------------------------------------------- values for the job


@dataclasses.dataclass(frozen=True)
class EnvValue:
    """One ``env_vars`` entry: literal text and references, in order. ``ref`` is set when the whole value is one
    reference without a default (a secret: it is passed on by name, never written)."""

    name: str
    segments: tuple[Part, ...] = ()

    @property
    def ref(self) -> str | None:
        (only,) = self.segments if len(self.segments) == 1 else (None,)
        return only.name if isinstance(only, Ref) and only.op is None else None

    @property
    def literal(self) -> str | None:
        """The value when it refers to nothing."""
        if any(not isinstance(s, str) for s in self.segments):
            return None
        return "".join(tp.cast(tp.Sequence[str], self.segments))

    @property
    def refs(self) -> list[Ref]:
        return [s for s in self.segments if isinstance(s, Ref)]

    def resolve(self, environ: tp.Mapping[str, str]) -> str:
        """The value with references taken from ``environ`` (an unset one without a default: "")."""
        return "".join(s if isinstance(s, str) else (s.value(environ) or "") if isinstance(s, Ref) else s.text
                       for s in self.segments)

    def shell(self) -> str:
        """The value as a bash word: literal text quoted, references expanded where the script runs
        (``"${NAME}"``, ``"${NAME:-default}"`` with the default quoted too)."""
        return "".join(shlex.quote(s) if isinstance(s, str) else f'"{s.bash()}"' if isinstance(s, Ref)
                       else shlex.quote(s.text) for s in self.segments) or "''"


def parse_env_vars(raw: tp.Mapping[str, tp.Any], key: str) -> list[EnvValue]:
    """Raw (unresolved) ``env_vars`` as :class:`EnvValue` s. A literal that looks like a variable name
    (``HF_TOKEN: HF_TOKEN``) is kept, with a warning that it is not expanded.

    Raises ConfigError naming ``key.NAME`` for a name that is not a shell variable name or a bad reference."""
    out = []
    for name, value in raw.items():
        check_name(f"{key}.{name}", name, value)
        text = "" if value is None else str(value)
        env = EnvValue(str(name), parse(text, f"{key}.{name}"))
        if env.literal is not None:
            warn_bare_name(f"{key}.{name}", text)
        out.append(env)
    return out


def export_lines(env: tp.Iterable[EnvValue]) -> list[str]:
    """``export NAME=...`` lines for a bash script: references stay references, literals are quoted."""
    return [f"export {e.name}={e.shell()}" for e in env]


def missing_refs(env: tp.Iterable[EnvValue], environ: tp.Mapping[str, str]) -> list[tuple[str, str]]:
    """``(entry, variable)`` for each reference without a default whose variable is not set in ``environ``;
    variables that the scheduler sets inside the job (:data:`JOB_TIME_PREFIXES`) are not asked of this shell."""
    return [(e.name, r.name) for e in env for r in e.refs
            if r.op is None and r.name not in environ and not r.name.startswith(JOB_TIME_PREFIXES)]
