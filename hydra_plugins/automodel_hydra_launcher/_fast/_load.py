"""The loader the fast path validates a sweep's jobs with (:class:`SweepLoader`): what
:func:`automodel_hydra.config.load` returns for each job, from the previous job's merged schema with the changed
values set, where the jobs differ in a few leaf values (OmegaConf's assignment: the same conversion and type check
as a merge into that node). ``tests/test_fast_path.py`` checks the results are ``load``'s, job for job.
"""

from __future__ import annotations

import copy
import typing as tp

from omegaconf import DictConfig, OmegaConf

from automodel_hydra import config
from automodel_hydra.config import TrainConfig


class SweepLoader:
    """``config.load`` for a sweep's jobs, whose configs differ from one job to the next in a few values.

    Merging a config into the typed schema is most of ``config.load``'s cost (~30 ms for this recipe), and a sweep
    job's data differs from the previous job's only where its overrides differ (``seed``, ``optim.lr``). The
    loader keeps the previous job's data and merged schema; when the next job's data differs from it only in
    leaf values (same keys everywhere, each changed value a scalar on both sides and no interpolation), it sets
    those values on the merged schema (OmegaConf's assignment: the same conversion and type check as a merge
    into that node) and builds the job from it as ``OmegaConf.to_object`` does, which resolves every
    interpolation against this job's values and runs every section's checks, as ``config.load`` does; a section
    that did not change and has no interpolation is copied from the object built for it before. Anything else,
    and any error on that way, goes through ``config.load``'s own merge, so each result and error is its own.
    """

    def __init__(self) -> None:
        self._data: dict[str, tp.Any] | None = None
        self._merged: DictConfig | None = None
        self._sections: dict[str, tp.Any] = {}  # section -> its object, built from the merged schema as it is
        self.fast = self.full = 0

    def load(self, cfg: DictConfig | dict[str, tp.Any], environ: tp.Mapping[str, str] | None = None,
             container: dict[str, tp.Any] | None = None) -> TrainConfig:
        """``config.load`` of ``cfg`` (``container``: see :func:`~automodel_hydra.config.load_data`). Raises what
        ``config.load`` raises."""
        data = config.load_data(cfg, environ, container)
        if self._data is not None and self._merged is not None:
            changes = leaf_changes(self._data, data)
            if changes is not None:
                try:
                    for path, value in changes:
                        self._sections.pop(path[0], None)
                        node: tp.Any = self._merged
                        for key in path[:-1]:
                            node = node[key]
                        node[path[-1]] = value
                    OmegaConf.clear_cache(self._merged)  # resolvers such as ${now:} answer anew, as in a merge
                    obj = self._to_object(self._merged)
                except Exception:  # (the merge below gives load's own result or error)
                    pass
                else:
                    self._data = data
                    self.fast += 1
                    return obj
            self._data = self._merged = None
        self._sections.clear()
        self.full += 1
        merged = OmegaConf.merge(config.schema(), data)
        built = OmegaConf.to_object(merged)
        assert isinstance(built, TrainConfig) and isinstance(merged, DictConfig)
        self._data, self._merged = data, merged
        return built


    def _to_object(self, merged: DictConfig) -> TrainConfig:
        """``OmegaConf.to_object(merged)``, as OmegaConf builds a structured config (each key's value, a section
        by ``to_object`` of its node, then ``TrainConfig(**values)``), with each section that has not changed since
        it was built and holds no interpolation copied from the one built then (a deep copy: ``TrainConfig``'s
        checks may change a section object, e.g. ``profile.nsys.enabled``)."""
        values: dict[str, tp.Any] = {}
        for key in merged:
            value = merged[key]
            if OmegaConf.is_config(value):
                built = self._sections.get(str(key))
                if built is None:
                    built = OmegaConf.to_object(value)
                    if not _interpolated_tree(OmegaConf.to_container(value, resolve=False)):
                        self._sections[str(key)] = copy.deepcopy(built)
                else:
                    built = copy.deepcopy(built)
                value = built
            values[str(key)] = value
        return TrainConfig(**values)


def _interpolated_tree(value: tp.Any) -> bool:
    if isinstance(value, dict):
        return any(_interpolated_tree(v) for v in value.values())
    if isinstance(value, list):
        return any(_interpolated_tree(v) for v in value)
    return _interpolated(value)


def leaf_changes(old: dict[str, tp.Any], new: dict[str, tp.Any],
                 prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], tp.Any]] | None:
    """``(key path, new value)`` for every leaf where ``new`` differs from ``old``, when both have the same keys
    at every level, every changed value is a scalar on both sides (same type and value = unchanged) and neither
    is text with an interpolation (``${``); otherwise None."""
    if old.keys() != new.keys():
        return None
    out: list[tuple[tuple[str, ...], tp.Any]] = []
    for key, a in old.items():
        b = new[key]
        if a is b and isinstance(a, (dict, list)):  # the same object: the caller changes no data it gave
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            sub = leaf_changes(a, b, (*prefix, key))
            if sub is None:
                return None
            out.extend(sub)
        elif type(a) is type(b) and (a is b or (a == b and (not isinstance(a, float) or repr(a) == repr(b)))):
            continue
        elif isinstance(a, (dict, list)) or isinstance(b, (dict, list)) or _interpolated(a) or _interpolated(b):
            return None
        else:
            out.append(((*prefix, key), b))
    return out


def _interpolated(value: tp.Any) -> bool:
    return isinstance(value, str) and "${" in value
