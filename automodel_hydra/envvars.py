"""Shell references in launcher fields, and ``env_vars`` rendered without ever writing a secret.

A launcher field may refer to the submitting shell the way a shell does: ``$VAR``, ``${VAR}``, ``${VAR}/sub``,
``${VAR:-default}``, and AutoModel's ``${VAR,default}`` (bash(1), "Parameter Expansion"; AutoModel's config loader).
OmegaConf's own interpolations keep their meaning: ``${oc.env:HOME}``, ``${hydra:...}``, and ``${key}`` where
``key`` is a key of the config (``${output_dir}``). :func:`split` tells the two apart.

* every launcher field but ``env_vars`` (``hf_home: ${HF_HOME}``, ``container_image: ${IMAGE}``) is expanded on the
  submitting host (:func:`expand`); an unset variable without a default is a ConfigError naming the field;
* an ``env_vars`` value that is exactly one reference (``HF_TOKEN: ${HF_TOKEN}``) is a secret: scripts carry the
  reference, SkyPilot gets it as a secret, no file ever holds its value (:class:`EnvValue`); other values keep their
  references for the place the job runs (Slurm: bash expands them in the job, where ``$SLURM_JOB_ID`` exists).
  Literal text is quoted with :func:`shlex.quote`, so ``;``, ``$( )``, quotes and newlines stay data.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
import typing as tp
import warnings

from automodel_hydra.schema import ConfigError, require

_TOKEN = re.compile(r"\$\{(?P<body>[^{}]*)\}|\$(?P<bare>[A-Za-z_][A-Za-z0-9_]*)")
_REF_BODY = re.compile(r"^(?P<env>oc\.env:)?(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<sep>:-|,)(?P<default>.*))?$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_LOOKS_LIKE_VAR = re.compile(r"^[A-Z][A-Z0-9_]*_[A-Z0-9_]*$|^[A-Z]{2,}$")
#: Variables Slurm sets inside a job (sbatch(1)/srun(1) "OUTPUT ENVIRONMENT VARIABLES"): a reference to one in
#: ``slurm.env_vars`` is for the job, never for the submitting shell.
JOB_TIME_PREFIXES = ("SLURM_", "SLURMD_", "SKYPILOT_")


@dataclasses.dataclass(frozen=True)
class Ref:
    """A reference to a shell variable; ``default`` is used when it is unset (None = no default)."""

    name: str
    default: str | None = None


Segment = tp.Union[str, Ref]


def split(text: str, is_config_key: tp.Callable[[str], bool] = lambda name: False) -> list[Segment]:
    """``text`` as literal strings and :class:`Ref` s. OmegaConf interpolations (``${oc.*:...}`` other than
    ``oc.env``, ``${hydra:...}``, ``${a.b}`` and ``${key}`` where ``is_config_key(key)``) stay in the literal text."""
    out: list[Segment] = []
    pos = 0
    for m in _TOKEN.finditer(text):
        body, bare = m.group("body"), m.group("bare")
        ref = None
        if bare is not None:
            ref = Ref(bare)
        else:
            b = _REF_BODY.match(body or "")
            if b and (b.group("env") or not is_config_key(b.group("name"))):
                ref = Ref(b.group("name"), b.group("default"))
        if ref is None:
            continue
        if m.start() > pos:
            out.append(text[pos:m.start()])
        out.append(ref)
        pos = m.end()
    if pos < len(text):
        out.append(text[pos:])
    return _merge_literals(out)


def _merge_literals(segments: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for s in segments:
        if isinstance(s, str) and out and isinstance(out[-1], str):
            out[-1] += s
        else:
            out.append(s)
    return out


def expand(text: str, environ: tp.Mapping[str, str], key: str,
           is_config_key: tp.Callable[[str], bool] = lambda name: False) -> str:
    """``text`` with every shell reference replaced by its value in ``environ`` (OmegaConf interpolations kept).

    Raises ConfigError naming ``key`` for a variable that is unset and has no default."""
    parts = []
    for s in split(text, is_config_key):
        if isinstance(s, str):
            parts.append(s)
        elif s.name in environ:
            parts.append(environ[s.name])
        elif s.default is not None:
            parts.append(s.default)
        else:
            raise ConfigError(key, text, f"${s.name} is not set in this shell: export it, or give a default "
                              f"(${{{s.name}:-value}})")
    return "".join(parts)


@dataclasses.dataclass(frozen=True)
class EnvValue:
    """One ``env_vars`` entry: literal text and references, in order. ``ref`` is set when the whole value is one
    reference without a default (a secret: it is passed on by name, never written)."""

    name: str
    segments: tuple[Segment, ...] = ()

    @property
    def ref(self) -> str | None:
        (only,) = self.segments if len(self.segments) == 1 else (None,)
        return only.name if isinstance(only, Ref) and only.default is None else None

    @property
    def literal(self) -> str | None:
        """The value when it refers to nothing."""
        if any(isinstance(s, Ref) for s in self.segments):
            return None
        return "".join(tp.cast(tp.Sequence[str], self.segments))

    @property
    def refs(self) -> list[Ref]:
        return [s for s in self.segments if isinstance(s, Ref)]

    def resolve(self, environ: tp.Mapping[str, str]) -> str:
        """The value with references taken from ``environ`` (an unset one without a default: "")."""
        return "".join(s if isinstance(s, str) else environ.get(s.name, s.default or "") for s in self.segments)

    def shell(self) -> str:
        """The value as a bash word: literal text quoted, references expanded where the script runs
        (``"${NAME}"``, ``"${NAME:-default}"`` with the default quoted too)."""
        parts = []
        for s in self.segments:
            if isinstance(s, str):
                parts.append(shlex.quote(s))
            elif s.default is None:
                parts.append(f'"${{{s.name}}}"')
            else:
                # a quoted default inside ${NAME:-...} stays data (no command substitution)
                parts.append(f'"${{{s.name}:-{_dq(s.default)}}}"')
        return "".join(parts) or "''"


def _dq(text: str) -> str:
    """``text`` escaped for a double-quoted bash context."""
    return re.sub(r'(["\\$`])', r"\\\1", text)


def parse_env_vars(raw: tp.Mapping[str, tp.Any], key: str,
                   is_config_key: tp.Callable[[str], bool] = lambda name: False) -> list[EnvValue]:
    """Raw (unresolved) ``env_vars`` as :class:`EnvValue` s. A literal that looks like a variable name
    (``HF_TOKEN: HF_TOKEN``) is kept, with a warning that it is not expanded.

    Raises ConfigError naming ``key.NAME`` for a name that is not a shell variable name."""
    out = []
    for name, value in raw.items():
        require(bool(_ENV_NAME.match(str(name))), f"{key}.{name}", value, "variable names are [A-Za-z_][A-Za-z0-9_]*")
        text = "" if value is None else str(value)
        env = EnvValue(str(name), tuple(split(text, is_config_key)))
        if env.literal is not None and _LOOKS_LIKE_VAR.match(text):
            warnings.warn(
                f"{key}.{name}={text!r} is passed as the literal string {text!r}; write '${{{text}}}' to pass the "
                f"submitting shell's ${text} instead",
                stacklevel=2,
            )
        out.append(env)
    return out


def export_lines(env: tp.Iterable[EnvValue]) -> list[str]:
    """``export NAME=...`` lines for a bash script: references stay references, literals are quoted."""
    return [f"export {e.name}={e.shell()}" for e in env]


def missing_refs(env: tp.Iterable[EnvValue], environ: tp.Mapping[str, str]) -> list[tuple[str, str]]:
    """``(entry, variable)`` for each reference without a default whose variable is not set in ``environ``;
    variables that the scheduler sets inside the job (:data:`JOB_TIME_PREFIXES`) are not asked of this shell."""
    return [(e.name, r.name) for e in env for r in e.refs
            if r.default is None and r.name not in environ and not r.name.startswith(JOB_TIME_PREFIXES)]
