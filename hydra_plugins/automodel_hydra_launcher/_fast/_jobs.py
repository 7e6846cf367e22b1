"""Sweep jobs set up the way Hydra's ``run_job`` sets them up, without copying the whole config four times and
dumping it with a pure-Python YAML emitter for every job.

For each job Hydra's ``run_job`` (``hydra.core.utils``) sets the job's config as the global ``HydraConfig``,
computes ``hydra.runtime.output_dir`` (``hydra.sweep.dir`` / ``hydra.sweep.subdir``), creates the dir, changes into
it under ``hydra.job.chdir``, configures the job's logging (``hydra.job_logging``: the console and the job's own
log file), writes ``<output_subdir>/config.yaml`` (the job's config without ``hydra``, unresolved),
``hydra.yaml`` (its ``hydra`` node) and ``overrides.yaml`` (``hydra.overrides.task``), and calls the task function
on a copy of the config without ``hydra`` inside ``hydra.job.env_set``. On the way it deep-copies the config three
times (``set_config`` twice, the task config once) and the ``hydra`` node once more, which with YAML's Python
emitter is ~90 % of a sweep job's cost.

:class:`FastJobs` does the same for a job that ``_compose`` makes from a base config (every job whose overrides
are values plus config-group choices it has composed before): per base, it keeps the config without ``hydra``
pickled (a copy is ~1 ms) and the ``hydra`` node live as the global ``HydraConfig``; per job it sets the five
``hydra`` fields that differ from job to job (``job.id``, ``job.num``, ``job.override_dirname``,
``overrides.task``: ``_compose``'s rules; ``runtime.output_dir``: ``run_job``'s) on that node, copies the task
config and applies the job's value overrides to it, writes the three files with libyaml's emitter (the same data
as ``OmegaConf.to_yaml``: the same representation of text, long lines may wrap elsewhere), points the job log's
file handlers at the job's log file, and calls the task function's ``prepare`` inside ``env_set`` and ``chdir``
exactly as ``run_job`` would.

A job it cannot set up this way (``_compose`` has no base for it, a value override fails on the copy) is
answered with None: the launcher then runs ``run_job`` for it. Callbacks are not called here: the launcher uses
this only when ``hydra.callbacks`` is empty.
"""

from __future__ import annotations

import collections
import logging
import os
import re
import typing as tp
from pathlib import Path

from hydra import version
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.types import Override, OverrideType
from hydra.core.utils import JobReturn, JobRuntime, JobStatus, configure_log, env_override
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from automodel_hydra import paths

from ._compose import Split, SweepComposer, _Base, apply, freeze, thaw
from ._load import SweepLoader
from ._yaml import YamlDoc, to_yaml

# ----------------------------------------------------------------------------------------------- jobs


class _BaseState:
    """What every job made from one base config shares: the config without ``hydra`` (pickled), the full config
    whose ``hydra`` node becomes the global HydraConfig, and the ``hydra`` node as plain data (for hydra.yaml)."""

    def __init__(self, base: _Base, master: DictConfig) -> None:
        self.base = base  # held: the state is looked up by the base's identity
        self.full = base.copy()
        OmegaConf.copy_cache(from_config=master, to_config=self.full)
        task = base.copy()
        with read_write(task), open_dict(task):
            del task["hydra"]
        self.task = freeze(task)
        hydra = self.full.hydra
        self.task_data = tp.cast(dict, OmegaConf.to_container(task, resolve=False))
        self.task_doc = YamlDoc(self.task_data)
        self.work: DictConfig | None = None  # the last job's task config, and the keys its overrides set
        self.work_keys: frozenset[tuple[str, ...]] | None = None
        self.work_lines: tuple[str, ...] = ()  # its value overrides, the keys set once, the values read back
        self.work_once: frozenset[str] = frozenset()
        self.work_leaves: dict[tuple[str, ...], tp.Any] = {}
        self.hydra_data = tp.cast(dict, OmegaConf.to_container(hydra, resolve=False, enum_to_str=True))
        self.hydra_doc = YamlDoc({"hydra": self.hydra_data})
        refs = _hydra_refs(self.hydra_data)  # the job's fields an interpolation of the node reads from state.full
        self.referenced = {f for f in _JOB_FIELDS if any(r[:len(f)] == f[:len(r)] for r in refs)}
        self.output_subdir = hydra.output_subdir
        self.chdir = hydra.job.chdir
        # run_job warns when chdir is unset under version_base < 1.2: let it; a hydra value that refers to the
        # job's own config (hydra.sweep.subdir=${seed}) must see the job's values: run_job's path has them
        self.usable = (self.chdir is not None or version.base_at_least("1.2")) and _self_contained(self.hydra_data)
        self.chdir = bool(self.chdir)

    def plain_paths(self, values: tp.Sequence[Override]) -> dict[tuple[str, ...], Override] | None:
        """``{key path: override}`` when every override sets (``key=v``: no ``+``, ``++``, ``~``) a scalar on a
        key that the base holds as a plain value (not a mapping or list, none of them on its way); else None.
        A key set twice keeps its last override, as applying them in order does."""
        out: dict[tuple[str, ...], Override] = {}
        for o in values:
            value = o.value()
            if o.type != OverrideType.CHANGE or isinstance(value, (dict, list)):
                return None
            path = tuple(o.key_or_group.split("."))
            node: tp.Any = self.task_data
            for key in path:
                if not isinstance(node, dict) or key not in node:
                    return None
                node = node[key]
            if isinstance(node, (dict, list)):
                return None
            out[path] = o
        return out

    def task_copy(self) -> DictConfig:
        return thaw(self.task)


class FastJobs:
    """``run_job`` for the jobs of one launch that are copies of a base config (see the module docstring).

    Parameters
    ----------
    composer:
        The launch's :class:`SweepComposer` (shared with the launcher's ``run_job`` path).
    master:
        The sweep's config.
    prepare:
        The task function's ``automodel_prepare`` (``driver.prepare``): called as ``prepare(cfg, load=...)`` with
        a :class:`SweepLoader`'s ``load``.
    """

    def __init__(self, composer: SweepComposer, master: DictConfig, prepare: tp.Callable[..., tp.Any]) -> None:
        self.composer, self.master, self.prepare = composer, master, prepare
        self.loader = SweepLoader()
        self.jobs = 0
        self._states: dict[int, _BaseState] = {}
        self._active: _BaseState | None = None
        self._handlers: list[tuple[logging.FileHandler, str]] | None = None  # job log files to repoint, per job

    def invalidate(self) -> None:
        """Something else set the global HydraConfig or the logging (``run_job``): set them again next job."""
        self._active, self._handlers = None, None

    def run(self, idx: int, overrides: tp.Sequence[str]) -> JobReturn | None:
        """Set up and prepare job ``idx`` as ``run_job`` would; None when it must go through ``run_job``."""
        split = self.composer.split(overrides)
        if split is None:
            return None
        state = self._state(split.base)
        if not state.usable:
            return None
        made = self._task_config(state, split)
        if made is None:
            return None
        cfg, container, config_yaml = made
        output_dir, fields = self._enter(state, idx, split)
        ret = JobReturn()
        ret.overrides = list(split.task)
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        old_cwd = os.getcwd()
        ret.working_dir = output_dir if state.chdir else old_cwd
        if state.output_subdir is not None:
            where = Path(output_dir) / str(state.output_subdir)
            where.mkdir(parents=True, exist_ok=True)
            (where / "config.yaml").write_text(config_yaml, encoding="utf-8")
            (where / "hydra.yaml").write_text(self._hydra_yaml(state, fields), encoding="utf-8")
            (where / "overrides.yaml").write_text(to_yaml(list(split.task)), encoding="utf-8")
        try:
            if state.chdir:
                os.chdir(output_dir)
            self._job_log(state, fields)
            with env_override(_global_hydra().job.env_set):
                try:
                    # the loader may use the data made above while ``prepare`` has not replaced ``cfg``
                    load = lambda c: self.loader.load(c, container=container if c is cfg else None)  # noqa: E731
                    ret.return_value = self.prepare(cfg, load=load)
                    ret.status = JobStatus.COMPLETED
                except Exception as e:
                    ret.return_value = e
                    ret.status = JobStatus.FAILED
            ret.task_name = JobRuntime.instance().get("name")
        finally:
            if state.chdir:
                os.chdir(old_cwd)
        self.jobs += 1
        return ret

    # ------------------------------------------------------------------------------------------- parts

    def _task_config(self, state: _BaseState, split: Split
                     ) -> tuple[DictConfig, dict[str, tp.Any], str] | None:
        """The job's config without ``hydra`` (the base's, with the job's value overrides applied), its plain data
        and its YAML text; None when an override fails on it (``run_job``'s path then gives Hydra's own error).

        When every value override sets a plain value on a key the base has as a plain value (``seed=3``), and the
        previous job of this base set the same keys, the overrides are applied to that job's config again: each
        key then holds this job's value and nothing else differs from a fresh copy, and only the set values are
        read back for the data and the YAML. An override that is the previous job's override at the same place,
        on a key that each of the two sets once (``slurm.partition=debug``, given once on the command line for
        every job), is not applied again: the key already holds that value. Otherwise the job gets a fresh copy
        of the base."""
        paths = state.plain_paths(split.values)
        reuse = paths is not None and state.work is not None and state.work_keys == frozenset(paths)
        cfg = state.work if reuse and state.work is not None else state.task_copy()
        lines = tuple(str(o.input_line) for o in split.values)
        once = _set_once(split.values)
        repeated = _repeated(state.work_lines, state.work_once, split.values, once) if reuse else set()
        before = state.work_leaves
        state.work, state.work_keys, state.work_lines, state.work_leaves = None, None, (), {}
        try:
            for i, o in enumerate(split.values):
                if i not in repeated:
                    apply(cfg, o)
            if paths is None:
                container = tp.cast(dict, OmegaConf.to_container(cfg, resolve=False))
                OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
                return cfg, container, to_yaml(container)
            kept = {tuple(split.values[i].key_or_group.split(".")) for i in repeated}
            leaves = {path: before[path] if path in kept else _raw(cfg, path, o) for path, o in paths.items()}
        except Exception:  # (run_job's path composes it with Hydra: Hydra's own result or error)
            return None
        if not reuse:
            OmegaConf.copy_cache(from_config=self.master, to_config=cfg)
        state.work, state.work_keys, state.work_lines, state.work_once = cfg, frozenset(paths), lines, once
        state.work_leaves = leaves
        return cfg, _replaced(state.task_data, leaves), state.task_doc.text(leaves)

    def _state(self, base: _Base) -> _BaseState:
        state = self._states.get(id(base))
        if state is None or state.base is not base:
            state = self._states[id(base)] = _BaseState(base, self.master)
        return state

    def _enter(self, state: _BaseState, idx: int, split: Split) -> tuple[str, dict[tuple[str, ...], tp.Any]]:
        """Make the job's ``hydra`` node the global HydraConfig's; returns ``hydra.runtime.output_dir`` (as
        ``run_job`` makes it) and the job's ``hydra`` fields (paths under ``hydra``).

        The global node gets all five fields; the base config it resolves its interpolations against
        (``state.full``) gets those that some interpolation of the node refers to. Values are read from the
        base's plain ``hydra`` data with the fields set (:func:`_lookup`), or where that cannot say, by OmegaConf
        from ``state.full``."""
        if self._active is not state:
            HydraConfig.instance().set_config(state.full)
            self._active, self._handlers = state, None
        fields: dict[tuple[str, ...], tp.Any] = {
            ("job", "id"): f"automodel_{idx}", ("job", "num"): idx, ("job", "override_dirname"): split.override_dirname,
            ("overrides", "task"): list(split.task)}
        _set(state.full.hydra, {k: v for k, v in fields.items() if k in state.referenced})
        data = _replaced(state.hydra_data, fields)
        where = []
        for key in ("dir", "subdir"):
            value = _lookup(data, data.get("sweep", {}).get(key))
            where.append(OmegaConf.select(state.full, f"hydra.sweep.{key}") if value is _UNKNOWN else value)
        too_long = paths.sweep_dir_problem(str(where[0]), str(where[1]), str(data.get("sweep", {}).get("subdir")),
                                           split.task)
        if too_long is not None:  # before the dir is made: one line naming the key, not an OSError
            from automodel_hydra import driver

            driver.fail(driver.one_line(too_long))
        output_dir = os.path.abspath(os.path.join(str(where[0]), str(where[1])))
        fields[("runtime", "output_dir")] = output_dir
        _set(state.full.hydra, {k: v for k, v in fields.items() if k in state.referenced})
        _set(_global_hydra(), fields)
        return output_dir, fields

    @staticmethod
    def _hydra_yaml(state: _BaseState, fields: tp.Mapping[tuple[str, ...], tp.Any]) -> str:
        """hydra.yaml: the base's ``hydra`` node with this job's five fields."""
        return state.hydra_doc.text({("hydra", *k): v for k, v in fields.items()})

    def _job_log(self, state: _BaseState, fields: tp.Mapping[tuple[str, ...], tp.Any]) -> None:
        """The job's logging as ``run_job`` configures it (``hydra.job_logging``): configured in full for the first
        job of a base; after that, when its only files are the root logger's plain ``FileHandler``s, those are
        pointed at this job's files (what configuring it again would do, without rebuilding every handler)."""
        hydra = state.full.hydra
        if self._handlers is None:
            configure_log(hydra.job_logging, hydra.verbose)
            self._handlers = _file_handlers(hydra.job_logging)
            return
        data = _replaced(state.hydra_data, fields)
        for handler, name in self._handlers:
            value = _lookup(data, data["job_logging"]["handlers"][name]["filename"])
            if value is _UNKNOWN:
                value = hydra.job_logging.handlers[name].filename
            path = os.path.abspath(str(value))
            if path != handler.baseFilename:
                stream = open(path, handler.mode, encoding=handler.encoding, errors=handler.errors)  # noqa: SIM115
                old = handler.setStream(tp.cast(tp.Any, stream))
                handler.baseFilename = path
                if old is not None:
                    old.close()


def _set_once(values: tp.Sequence[Override]) -> frozenset[str]:
    """The keys that exactly one of ``values`` sets."""
    count = collections.Counter(o.key_or_group for o in values)
    return frozenset(key for key, n in count.items() if n == 1)


def _repeated(before: tuple[str, ...], before_once: frozenset[str], values: tp.Sequence[Override],
              once: frozenset[str]) -> set[int]:
    """The places where a job's value override is the previous job's (``before``: their texts) on a key that each
    of the two jobs sets once (``before_once``, ``once``): applying it again would set the value the key holds."""
    if len(before) != len(values):
        return set()
    return {i for i, (line, o) in enumerate(zip(before, values))
            if line == str(o.input_line) and o.key_or_group in once and o.key_or_group in before_once}


def _set(node: DictConfig, fields: tp.Mapping[tuple[str, ...], tp.Any]) -> None:
    """Set ``fields`` (paths under ``node``, two keys each) in ``node``, read-only or struct as it may be. The
    flags are lifted on the small parent nodes: lifting them on ``node`` clears the flag cache of its tree."""
    by_parent: dict[str, list[tuple[str, tp.Any]]] = {}
    for (parent, key), value in fields.items():
        by_parent.setdefault(parent, []).append((key, value))
    for parent, items in by_parent.items():
        sub = node[parent]
        with read_write(sub), open_dict(sub):
            for key, value in items:
                sub[key] = value


#: What :func:`_lookup` cannot answer.
_UNKNOWN: tp.Any = object()
_HYDRA_REF = re.compile(r"\$\{hydra((?:\.[A-Za-z_][A-Za-z0-9_]*)+)\}")
_LITERAL = re.compile(r"[^$\\{}]*")


def _lookup(data: tp.Mapping[str, tp.Any], value: tp.Any, depth: int = 0) -> tp.Any:
    """What OmegaConf resolves ``value`` (a value of the plain ``hydra`` node ``data``) to, when it is a scalar,
    text without interpolation, or text of literal parts and ``${hydra.key}`` references to such values (a whole
    ``${hydra.key}`` keeps its value's type; in text each is ``str()``-ed, as OmegaConf joins them: its grammar,
    https://omegaconf.readthedocs.io/en/2.3_branch/grammar.html). :data:`_UNKNOWN` for anything else (a
    resolver, an escape, a missing ``???`` value, a container)."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if not isinstance(value, str) or value == "???" or depth > 16:
        return _UNKNOWN
    if "${" not in value:
        return value
    parts, pos = [], 0
    for m in _HYDRA_REF.finditer(value):
        literal = value[pos:m.start()]
        node: tp.Any = data
        for key in m.group(1)[1:].split("."):
            if not isinstance(node, dict) or key not in node:
                return _UNKNOWN
            node = node[key]
        resolved = _lookup(data, node, depth + 1)
        if resolved is _UNKNOWN or not _LITERAL.fullmatch(literal):
            return _UNKNOWN
        parts.append((literal, resolved))
        pos = m.end()
    tail = value[pos:]
    if not parts or not _LITERAL.fullmatch(tail):
        return _UNKNOWN
    if len(parts) == 1 and not parts[0][0] and not tail:
        return parts[0][1]
    return "".join(literal + str(resolved) for literal, resolved in parts) + tail


def _raw(cfg: DictConfig, path: tuple[str, ...], o: Override) -> tp.Any:
    """The value at ``path`` as ``OmegaConf.to_container(cfg, resolve=False)`` has it, right after ``o`` set it
    (an interpolation is kept as the text that was set)."""
    parent: tp.Any = cfg
    for key in path[:-1]:
        parent = parent[key]
    if OmegaConf.is_interpolation(parent, path[-1]):
        return o.value()
    if OmegaConf.is_missing(parent, path[-1]):
        return "???"
    return parent[path[-1]]


def _replaced(data: dict[str, tp.Any], leaves: tp.Mapping[tuple[str, ...], tp.Any]) -> dict[str, tp.Any]:
    """``data`` with the values at ``leaves``' paths replaced; the dicts on those paths are copies, all else is
    shared with ``data``."""
    out = dict(data)
    for path, value in leaves.items():
        node = out
        for key in path[:-1]:
            node[key] = dict(node[key])
            node = node[key]
        node[path[-1]] = value
    return out


def _global_hydra() -> DictConfig:
    """The global HydraConfig's ``hydra`` node (what ``HydraConfig.get()`` returns)."""
    cfg = HydraConfig.instance().cfg
    assert cfg is not None
    return tp.cast(DictConfig, cfg).hydra


#: The ``hydra`` fields that differ from job to job of one base (``_compose``'s two, the launcher's two, run_job's).
_JOB_FIELDS = (("job", "id"), ("job", "num"), ("job", "override_dirname"), ("overrides", "task"),
               ("runtime", "output_dir"))


def _hydra_refs(data: tp.Any) -> set[tuple[str, ...]]:
    """The ``hydra.*`` paths (under ``hydra``) that ``${hydra.a.b}`` references anywhere in ``data`` name."""
    if isinstance(data, dict):
        return set().union(*(_hydra_refs(v) for v in data.values())) if data else set()
    if isinstance(data, list):
        return set().union(*(_hydra_refs(v) for v in data)) if data else set()
    if isinstance(data, str) and "${" in data:
        return {tuple(m.group(1)[1:].split(".")) for m in re.finditer(r"\$\{\s*hydra((?:\.[^.}:\s]+)+)", data)}
    return set()


#: Resolvers whose answer does not depend on the job's own config (``hydra:`` reads the global HydraConfig;
#: ``automodel_help_keys``, in ``hydra.help``, reads the schema: automodel_hydra.train.help_keys).
_CONTEXT_FREE = frozenset({"now", "hydra", "oc.env", "oc.decode", "automodel_uid", "automodel_help_keys"})
_INTERPOLATION = re.compile(r"(\\*)\$\{\s*([^}:\s]*)\s*(:?)")


def _self_contained(data: tp.Any) -> bool:
    """Every interpolation in ``data`` (the ``hydra`` node, unresolved) refers to ``hydra.*`` or calls a resolver
    of :data:`_CONTEXT_FREE`: so the node resolves the same in the base config as in any job made from it.
    An escaped ``\\${`` is text."""
    if isinstance(data, dict):
        return all(_self_contained(v) for v in data.values())
    if isinstance(data, list):
        return all(_self_contained(v) for v in data)
    if not isinstance(data, str) or "${" not in data:
        return True
    for m in _INTERPOLATION.finditer(data):
        escaped, name, call = len(m.group(1)) % 2 == 1, m.group(2), m.group(3)
        if escaped:
            continue
        if call and name not in _CONTEXT_FREE:
            return False
        if not call and not name.startswith("hydra."):
            return False
    return True


def _file_handlers(job_logging: DictConfig | None) -> list[tuple[logging.FileHandler, str]] | None:
    """The root logger's file handlers as ``hydra.job_logging`` just configured them, with their names there;
    None (configure in full for every job) unless every handler with a file is a plain, not delayed
    ``logging.FileHandler`` of the root logger alone."""
    if job_logging is None:
        return None
    conf = OmegaConf.to_container(job_logging, resolve=True)
    if not isinstance(conf, dict):
        return None
    handlers = conf.get("handlers") or {}
    files = [name for name, h in handlers.items() if isinstance(h, dict) and "filename" in h]
    root = (conf.get("root") or {}).get("handlers") or []
    loggers = conf.get("loggers") or {}
    if any(name in (spec or {}).get("handlers", []) for spec in loggers.values() for name in files):
        return None
    out = []
    on_root = [h for h in logging.getLogger().handlers if isinstance(h, logging.FileHandler)]
    for name in files:
        spec = handlers[name]
        match = [h for h in on_root if type(h) is logging.FileHandler and not h.delay
                 and h.baseFilename == os.path.abspath(str(spec["filename"]))]
        if spec.get("class") != "logging.FileHandler" or name not in root or len(match) != 1:
            return None
        out.append((match[0], name))
    if len(out) != len(on_root):
        return None
    return out
