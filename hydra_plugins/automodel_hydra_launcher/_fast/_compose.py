"""Compose a sweep's job configs fast: Hydra's compose once per distinct set of config-group choices, then a copy
with each job's plain value overrides applied.

``ConfigLoader.load_sweep_config(master, overrides)`` composes every job from scratch: it reads the defaults
list, loads and merges every config file and schema, then applies the command line's value overrides. In a sweep
such as ``seed=range(0,1000) optim.lr=1e-4,3e-4`` every job has the same defaults list; only the values differ.
:class:`SweepComposer` composes one *base* config per distinct set of the jobs' other overrides (config group
choices such as ``launcher=slurm``, ``hydra.*`` overrides, anything it is not sure of) with Hydra itself, and
makes each job's config as an exact copy of its base (a pickle round trip) with the job's value overrides
applied the way Hydra applies them after composing (``OmegaConf.update(..., merge=True)`` for ``key=v``,
``force_add`` for ``+``/``++``, deletion for ``~``; override grammar:
https://hydra.cc/docs/advanced/override_grammar/basic/). The ``hydra.*``
bookkeeping that depends on the job's own overrides is then set as Hydra sets it: ``hydra.overrides.task`` (the
job's non-hydra overrides in command-line order) and ``hydra.job.override_dirname`` (those overrides minus
``hydra.job.config.override_dirname.exclude_keys``, sorted, joined with its ``item_sep``/``kv_sep``: Hydra's
"Customizing working directory based on the overrides", https://hydra.cc/docs/configure_hydra/workdir/). The
rest of ``hydra.*`` (``runtime.choices``, ``runtime.config_sources``, ``job.name``, ...) comes from the
config-group choices alone, which the base shares with the job.

An override is a *value override* only when Hydra itself applies it after composing (it is not a config group
override: no config source has a group of that name, as Hydra's defaults list decides), and when this module is
sure a copy gives Hydra's result: no ``@package``, no ``hydra`` key, no sweep, no ``/`` in the key. A job whose
value overrides touch a key that one of its other (base) config overrides also touches, a base whose config
sources differ from the loader's (a ``hydra.searchpath`` override), a base whose ``hydra.job.env_copy`` or
override-dirname settings are interpolations, and a job whose value override fails on the copy are all composed
by Hydra's own ``load_sweep_config`` for that job, so any error is Hydra's own error.

Only public API is used: ``ConfigLoader.load_sweep_config`` / ``get_sources``, ``ConfigSource.is_group``,
``OverridesParser`` and OmegaConf's public functions.
"""

from __future__ import annotations

import collections
import copy
import pickle
import re
import typing as tp

from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType, ValueType
from omegaconf import DictConfig, OmegaConf, open_dict

#: Base configs kept at once (least recently used is dropped): one per distinct set of group choices.
MAX_BASES = 8


class SweepComposer:
    """Job configs of one sweep, each equal to ``config_loader.load_sweep_config(master_config, overrides)``.

    Parameters
    ----------
    config_loader:
        The sweep's ``hydra_context.config_loader``.
    master_config:
        The sweep's config (what Hydra hands the launcher's ``setup``).
    max_bases:
        Base configs cached at once (least recently used dropped first).

    Attributes ``composed`` (Hydra composes run: bases plus per-job fallbacks), ``copied`` (jobs made from a base)
    and ``fallbacks`` (jobs composed by Hydra) count what :meth:`compose` did.
    """

    def __init__(self, config_loader: ConfigLoader, master_config: DictConfig, max_bases: int = MAX_BASES) -> None:
        self.loader = config_loader
        self.master = master_config
        self.max_bases = max_bases
        self.composed = self.copied = self.fallbacks = 0
        self._parser = OverridesParser.create()
        self._parsed: dict[str, Override] = {}
        self._is_value: dict[str, bool] = {}
        self._groups: dict[str, bool] = {}
        self._sources = [(s.path, s.scheme(), s.provider) for s in config_loader.get_sources()]
        self._bases: collections.OrderedDict[tuple[str, ...], _Base | None] = collections.OrderedDict()
        hydra_overrides = OmegaConf.to_container(master_config.hydra.overrides.hydra, resolve=False)
        assert isinstance(hydra_overrides, list)
        self._master_overrides = [self._parse(str(o)) for o in hydra_overrides]

    # ------------------------------------------------------------------------------------------- public

    def compose(self, overrides: tp.Sequence[str]) -> DictConfig:
        """The job config for ``overrides`` (one job's override strings, as the sweeper gives them).

        Raises exactly what ``load_sweep_config`` raises for these overrides (it is called for them)."""
        split = self.split(overrides)
        if split is None:
            return self._fallback(overrides)
        cfg = split.base.copy()
        try:
            for o in split.values:
                apply(cfg, o)
            cfg.hydra.overrides.task = list(split.task)
            cfg.hydra.job.override_dirname = split.override_dirname
        except Exception:  # (Hydra's own compose then raises its own error, or succeeds)
            return self._fallback(overrides)
        OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
        self.copied += 1
        return cfg

    def split(self, overrides: tp.Sequence[str]) -> Split | None:
        """The job's base config, its value overrides and the ``hydra.*`` fields they set; None when the job must
        be composed by Hydra (:meth:`compose` then does). Composes the base with Hydra when it is not cached."""
        try:
            parsed = [self._parse(o) for o in overrides]
        except Exception:  # (Hydra's compose raises its own parse error)
            return None
        values = [o for o in parsed if self._value(o)]
        others = [o for o in parsed if not self._value(o)]
        if self._overlap(values, others):
            return None
        base = self._base(tuple(str(o.input_line) for o in others))
        if base is None:
            return None
        task = [o for o in self._master_overrides + parsed if not o.is_hydra_override()]
        return Split(base, values, tuple(str(o.input_line) for o in task),
                     _override_dirname(task, base.exclude_keys, base.item_sep, base.kv_sep))

    # ------------------------------------------------------------------------------------------- parts

    def _fallback(self, overrides: tp.Sequence[str]) -> DictConfig:
        self.fallbacks += 1
        self.composed += 1
        return self.loader.load_sweep_config(self.master, list(overrides))

    def _parse(self, text: str) -> Override:
        o = self._parsed.get(text)
        if o is None:
            o = simple_override(text)
            if o is None:
                (o,) = self._parser.parse_overrides([text])
            self._parsed[text] = o
        return o

    def _value(self, o: Override) -> bool:
        """Whether Hydra applies ``o`` to the composed config (not a group choice) and a copy can do the same."""
        line = str(o.input_line)
        known = self._is_value.get(line)
        if known is None:
            key = o.key_or_group
            known = not (o.is_sweep_override() or o.package is not None or o.is_hydra_override() or key == "hydra"
                         or key.startswith("hydra.") or "/" in key or not key or self._is_group(key))
            self._is_value[line] = known
        return known

    def _is_group(self, key: str) -> bool:
        """Hydra's rule for a group override: some config source has a group at this path."""
        known = self._groups.get(key)
        if known is None:
            known = any(s.is_group(key) for s in self.loader.get_sources())
            self._groups[key] = known
        return known

    def _overlap(self, values: list[Override], others: list[Override]) -> bool:
        """A value override and one of the base's own config overrides touch the same node (order would matter)."""
        keys = [o.key_or_group for o in others if not self._is_group(o.key_or_group) or isinstance(o.value(), dict)]
        return any(_related(v.key_or_group, k) for v in values for k in keys)

    def _base(self, others: tuple[str, ...]) -> _Base | None:
        """The base config for these non-value overrides; None when a copy of it cannot give Hydra's result."""
        if others in self._bases:
            self._bases.move_to_end(others)
            return self._bases[others]
        try:
            self.composed += 1
            base: DictConfig | None = self.loader.load_sweep_config(self.master, list(others))
        except Exception:  # (each job then gets Hydra's own compose and its error)
            base = None
        if base is not None and not self._usable(base):
            base = None
        self._bases[others] = _Base.of(base) if base is not None else None
        while len(self._bases) > self.max_bases:
            self._bases.popitem(last=False)
        return self._bases[others]

    def _usable(self, base: DictConfig) -> bool:
        """The base was composed from the loader's own sources (so the group check above was Hydra's), and the
        hydra settings Hydra reads while composing are no interpolations (which a value override could move)."""
        sources = [(x.path, x.schema, x.provider) for x in base.hydra.runtime.config_sources]
        if sources != self._sources:
            return False
        read = [base.hydra.job, "env_copy"], [base.hydra.job.config.override_dirname, "exclude_keys"]
        if any(_has_interpolation(node, key) for node, key in read):
            return False
        od = base.hydra.job.config.override_dirname
        return not any(OmegaConf.is_interpolation(od, k) for k in ("item_sep", "kv_sep"))


class Split(tp.NamedTuple):
    """One job as a copy of a base config: ``base``, the ``values`` to apply to the copy (:func:`apply`, in this
    order), and what Hydra sets in the job's ``hydra.overrides.task`` and ``hydra.job.override_dirname``."""

    base: _Base
    values: list[Override]
    task: tuple[str, ...]
    override_dirname: str


class _Base:
    """A composed base config, kept pickled (unpickling is 2-3x faster than ``copy.deepcopy``; OmegaConf configs
    pickle), with the override-dirname settings Hydra reads from it (``_usable`` made sure they are plain values,
    and value overrides never touch ``hydra.*``, so every copy has these)."""

    def __init__(self, payload: bytes | DictConfig, exclude_keys: list[str], item_sep: str, kv_sep: str) -> None:
        self.payload, self.exclude_keys, self.item_sep, self.kv_sep = payload, exclude_keys, item_sep, kv_sep

    @classmethod
    def of(cls, cfg: DictConfig) -> _Base:
        od = cfg.hydra.job.config.override_dirname
        return cls(freeze(cfg), [str(k) for k in od.exclude_keys], str(od.item_sep), str(od.kv_sep))

    def copy(self) -> DictConfig:
        """An exact, independent copy of the base config."""
        return thaw(self.payload)


def freeze(cfg: DictConfig) -> bytes | DictConfig:
    """``cfg`` kept for many exact copies (:func:`thaw`): pickled (unpickling is 2-3x faster than
    ``copy.deepcopy``), or the config itself where it does not pickle (a structured node's class is not found by
    its name because its module was run again)."""
    try:
        return pickle.dumps(cfg, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError):
        return cfg


def thaw(frozen: bytes | DictConfig) -> DictConfig:
    """An exact, independent copy of what :func:`freeze` kept."""
    if isinstance(frozen, bytes):
        cfg = pickle.loads(frozen)
        assert isinstance(cfg, DictConfig)
        return cfg
    return copy.deepcopy(frozen)


# ----------------------------------------------------------------------------------------------- Hydra's rules

#: ``key=number`` in the simplest spelling of Hydra's override grammar (``OverrideLexer.g4``: ``ID`` keys joined by
#: dots; ``INT``: ``[+-]? ('0' | [1-9] DIGIT*)``; ``FLOAT``: a point float with digits after the point, or an
#: exponent float, no ``_``): what a sweep's ``seed=range(...)``/``optim.lr=1e-4,...`` jobs are made of.
_SIMPLE = re.compile(r"(?P<key>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)="
                     r"(?:(?P<int>[+-]?(?:0|[1-9][0-9]*))"
                     r"|(?P<float>[+-]?(?:(?:0|[1-9][0-9]*)?\.[0-9]+(?:[eE][+-]?[0-9]+)?|(?:0|[1-9][0-9]*)[eE][+-]?[0-9]+)))")


def simple_override(text: str) -> Override | None:
    """The Override Hydra's parser makes of ``text`` when it is a plain ``key=number`` (see :data:`_SIMPLE`),
    without the parser (~1 ms a line); None for anything else."""
    m = _SIMPLE.fullmatch(text)
    if m is None:
        return None
    value: int | float = int(m["int"]) if m["int"] is not None else float(m["float"])
    return Override(type=OverrideType.CHANGE, key_or_group=m["key"], value_type=ValueType.ELEMENT, _value=value,
                    input_line=text)



def apply(cfg: DictConfig, o: Override) -> None:
    """Apply one value override as Hydra does after composing (its loader's config-override step): ``~k[=v]``
    deletes (v must match), ``+k=v`` adds (refused when k holds a value and v is no dict/list), ``++k=v``
    adds or sets, ``k=v`` sets an existing key (struct mode refuses a new one). Raises on any refusal; the caller
    then lets Hydra compose the job, which raises Hydra's own message."""
    key, value = o.key_or_group, o.value()
    if o.is_delete():
        current = OmegaConf.select(cfg, key, throw_on_missing=False)
        if current is None or (value is not None and value != current):
            raise KeyError(key)
        parent, _, leaf = key.rpartition(".")
        with open_dict(cfg):
            if not parent:
                del cfg[key]
            else:
                node = OmegaConf.select(cfg, parent)
                del node[leaf]
    elif o.is_add():
        if OmegaConf.select(cfg, key, throw_on_missing=False) is not None and not isinstance(value, (dict, list)):
            raise KeyError(key)
        OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    elif o.is_force_add():
        OmegaConf.update(cfg, key, value, merge=True, force_add=True)
    else:
        OmegaConf.update(cfg, key, value, merge=True)


def _override_dirname(overrides: tp.Sequence[Override], exclude_keys: tp.Sequence[str], item_sep: str,
                      kv_sep: str) -> str:
    """``hydra.job.override_dirname`` as Hydra builds it: the input lines of the task overrides whose key is not
    excluded, sorted, joined by ``item_sep``, every ``=`` replaced by ``kv_sep``."""
    lines = sorted(str(o.input_line) for o in overrides if o.key_or_group not in exclude_keys)
    return re.sub("[=]", kv_sep, item_sep.join(lines))


def _related(a: str, b: str) -> bool:
    """``a`` and ``b`` are the same dotted key, or one lies under the other."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def _has_interpolation(node: tp.Any, key: str) -> bool:
    if OmegaConf.is_interpolation(node, key):
        return True
    child = node.get(key)
    if OmegaConf.is_config(child):
        raw = OmegaConf.to_container(child, resolve=False)
        return "${" in repr(raw)
    return False
