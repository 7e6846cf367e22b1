"""The SkyPilot task's environment, built from the job's fields (pure; no ``import sky``).

Each field is read with the one shell-reference grammar of :mod:`automodel_hydra.envvars` and expanded from the
submitting environment when the job is launched, never when it is planned. What becomes of a value on the nodes
(:func:`task_env`): without a reference it is a literal in the task's ``envs``; a value that is exactly one
reference, and every ``hf_token`` / ``wandb_key``, is a SkyPilot secret (``secrets: {NAME: null}``, the value put
into the in-memory ``sky.Task`` at launch); any other value with a reference is ``envs: {NAME: null}``, SkyPilot's
"supplied at launch" form, its value given at launch as ``sky launch --env NAME=...`` would.
"""

from __future__ import annotations

import dataclasses
import typing as tp
import warnings

from automodel_hydra.envvars import Part, Ref, bash_text, check_name, parse, warn_bare_name
from automodel_hydra.schema import ConfigError

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
        return f'{flag} {self.name}="{bash_text(self.parts)}"'


#: AutoModel's secret fields and the variable each becomes on the nodes (``nemo_automodel`` SkyPilot launcher).
SECRET_FIELDS = {"hf_token": "HF_TOKEN", "wandb_key": "WANDB_API_KEY"}


def task_env(env_vars: tp.Mapping[str, str], secrets: tp.Mapping[str, str | None], hf_home: str | None,
             hydra_env: tp.Sequence[tuple[str, str]], set_vars: tp.AbstractSet[str],
             defaults: tp.Sequence[tuple[str, str]] = ()) -> list[EnvEntry]:
    """Every variable of the task, in order: ``defaults`` (the launcher's own: the job's tracker run,
    :func:`automodel_hydra.plan.tracker_env`), ``HF_HOME`` (``skypilot.hf_home``), Hydra's ``env_set``,
    ``skypilot.env_vars``, then the secrets ``HF_TOKEN`` / ``WANDB_API_KEY``; each later source wins over
    ``defaults``.

    ``secrets`` maps ``hf_token`` / ``wandb_key`` to its value: None = the submitting shell's variable of the same
    name when ``set_vars`` (read by preflight) holds it, as AutoModel's ``os.environ.get`` default; "" = none.
    Later sources win over ``hf_home``; ``env_vars`` and ``env_set`` naming the same variable, or ``env_vars`` and
    a secret field both set, is a ConfigError naming both. Also raises ConfigError for a bad name or reference."""
    entries: dict[str, EnvEntry] = {name: EnvEntry(name, "automodel-hydra", (text,)) for name, text in defaults}
    if hf_home:
        entries["HF_HOME"] = EnvEntry("HF_HOME", "skypilot.hf_home", parse(hf_home, "skypilot.hf_home"))
    for name, text in hydra_env:
        entries.pop(name, None)
        entries[name] = EnvEntry(name, f"hydra.job.env_set.{name}", (text,) if text else ())
    for name, raw in env_vars.items():
        key = f"skypilot.env_vars.{name}"
        check_name(key, name, raw)
        if name in entries and entries[name].key.startswith("hydra."):
            raise ConfigError(key, raw, f"hydra.job.env_set.{name} sets it too: keep one of the two")
        entries.pop(name, None)  # (a default gives way, and the variable is listed where its source is)
        text = "" if raw is None else str(raw)
        parts = parse(text, key)
        if all(isinstance(p, str) for p in parts):
            warn_bare_name(key, text)
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
