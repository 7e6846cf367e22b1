"""YAML 1.1's implicit types, undone where they silently change a launcher value.

PyYAML (and so OmegaConf and Hydra) reads plain scalars by YAML 1.1's implicit-type rules: an unquoted
``time: 10:00:00`` is the base-60 integer 36000 (which sbatch would read as 25 days of minutes), ``partition: no``
is the boolean False, ``account: 0755`` the octal integer 493 (yaml.org/type/int.html, /type/bool.html). A launcher
field whose type is text never means any of those, so :func:`restorations` finds where the file's text must be put
back (the driver puts it back).

The file's text comes from PyYAML's public ``yaml.compose``, which keeps every scalar exactly as written. Only
values that came from the file are restored: a key overridden on the command line keeps the override (Hydra's
override grammar has no base-60 or octal forms).
"""

from __future__ import annotations

import dataclasses
import functools
import typing as tp
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf


def plain_scalars(text: str) -> dict[str, str]:
    """``dotted.key -> text`` for every plain (unquoted) scalar of a YAML mapping document."""
    out: dict[str, str] = {}
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return out

    def walk(node: yaml.Node, prefix: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    walk(value, f"{prefix}{key.value}.")
        elif isinstance(node, yaml.ScalarNode) and node.style is None:
            out[prefix[:-1]] = node.value

    if root is not None:
        walk(root, "")
    return out


@functools.cache
def _text_fields(schema: type) -> set[str]:
    """Fields of a launcher dataclass whose values are text (``str`` or ``Optional[str]``)."""
    hints = tp.get_type_hints(schema)
    return {f.name for f in dataclasses.fields(schema) if hints[f.name] in (str, tp.Optional[str])}


def restorations(cfg: DictConfig, files: tp.Iterable[Path],
                 overridden: tp.Collection[str]) -> list[tuple[str, tp.Any, str]]:
    """``(key, value, text)`` for every text-typed launcher field that YAML 1.1 turned into a number or a boolean:
    the file's ``text`` should replace ``value``. Reads nothing of ``cfg`` but those fields; changes nothing."""
    from automodel_hydra.backends.interactive_config import InteractiveConfig
    from automodel_hydra.backends.skypilot_config import SkyPilotConfig
    from automodel_hydra.backends.slurm_config import SlurmConfig

    text_fields = {"slurm": _text_fields(SlurmConfig), "skypilot": _text_fields(SkyPilotConfig),
                   "interactive": _text_fields(InteractiveConfig)}
    overridden_keys = {o.split("=", 1)[0].lstrip("+~") for o in overridden}
    found = []
    for path in files:
        for key, text in _scalars(Path(path)).items():
            section, _, name = key.partition(".")
            if name not in text_fields.get(section, ()) or key in overridden_keys:
                continue
            read = yaml.safe_load(text)  # what YAML 1.1 made of the text
            if isinstance(read, str) or read is None:
                continue
            value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
            if value == read or (isinstance(value, str) and value == str(read)):  # it came from the file
                found.append((key, value, text))
    return found


def _scalars(path: Path) -> dict[str, str]:
    """:func:`plain_scalars` of a file, read once per file version (a sweep prepares every job from one file)."""
    try:
        stat = path.stat()
    except OSError:
        return {}
    return _scalars_of(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _scalars_of(path: str, mtime_ns: int, size: int) -> dict[str, str]:
    try:
        return plain_scalars(Path(path).read_text())
    except OSError:
        return {}


def config_files() -> list[Path]:
    """The primary config file of this Hydra job, in every file-based search path entry (HydraConfig)."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    name = hc.job.config_name
    if not name:
        return []
    files = []
    for source in hc.runtime.config_sources:
        if str(source.schema) == "file":
            path = Path(str(source.path)) / (name if name.endswith(".yaml") else f"{name}.yaml")
            if path.is_file():
                files.append(path)
    return files
