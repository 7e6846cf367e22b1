"""Sweep jobs set up without Hydra's ``run_job`` (``_jobs.FastJobs``) and validated by ``_fast._load.SweepLoader`` are
what Hydra composes and what ``run_job``'s path writes: each job's config, ``.hydra/`` files, plan files and
validation result, and each bad value's error."""

from __future__ import annotations

import dataclasses
import typing as tp
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf, open_dict

from automodel_hydra import config
from hydra_plugins.automodel_hydra_launcher._fast import _load
from hydra_plugins.automodel_hydra_launcher._fast._compose import simple_override
from hydra_plugins.automodel_hydra_launcher._fast._jobs import _self_contained
from hydra_plugins.automodel_hydra_launcher._fast._yaml import YamlDoc, to_yaml
from tests.helpers import compose_cfg

# ----------------------------------------------------------------------------------------------- SweepLoader

# each a change to the composed config, in sweep order: values the loader sets on its merged schema, changes of
# shape it hands to load's own merge, and bad values that must raise load's own error
STEPS: list[dict[str, tp.Any]] = [
    {"seed": 1},
    {"seed": 2, "optim.lr": 1e-4},
    {"seed": "3"},  # text that the int field converts, as a merge does
    {"optim.lr": 3e-4},
    {"step_scheduler.global_batch_size": 8},
    {"step_scheduler.max_steps": -1},  # bad: a section's own check
    {"seed": 4, "step_scheduler.max_steps": 100},
    {"seed": "abc"},  # bad: OmegaConf's type check
    {"seed": 5, "optim.weight_decay": "${optim.lr}"},  # an interpolation: load's merge
    {"optim.lr": 5e-4},  # the interpolation above follows it
    {"slurm": {"nodes": 2}},  # a section appears
    {"slurm.nodes": 3},
    {"slurm.partition": "debug"},
    {"slurm.nodes": 0},  # bad
    {"slurm.nodes": 1, "slurm.time": "00:10:00"},
    {"dry_run": 1},  # an int for a bool (OmegaConf accepts 1)
    {"dry_run": True},
    {"slurm.nsys_enabled": True},  # TrainConfig's check then turns on profile.nsys (a section that did not change)
    {"slurm.nsys_enabled": False},  # ... and it must be off again: the section object is not shared
    {"slurm.nsys_enabled": True},
    {"slurm.nsys_enabled": False},
    {"seed": 11},
    {"checkpoint.dir": "${output_dir}/ckpt"},  # a section with an interpolation
    {"seed": 12, "output_dir": "/elsewhere"},  # ... follows the value it refers to
    {"seed": 13},
]


def _apply(cfg: tp.Any, change: dict[str, tp.Any]) -> None:
    with open_dict(cfg):
        for key, value in change.items():
            OmegaConf.update(cfg, key, value, merge=True, force_add=True)


def _outcome(fn: tp.Callable[[], config.TrainConfig]) -> tp.Any:
    try:
        return dataclasses.asdict(fn())
    except Exception as e:
        return type(e), str(e)


def test_sweep_loader_gives_loads_result_and_error_for_every_step(tmp_path: Path) -> None:
    cfg = compose_cfg(["launcher=interactive"], output_dir=tmp_path)  # (sets the HydraConfig ${hydra:} reads)
    work = OmegaConf.create(tp.cast(dict, OmegaConf.to_container(cfg, resolve=False)))  # untyped, as load gets it
    with open_dict(work):
        del work["hydra"]
    loader = _load.SweepLoader()
    for change in STEPS:
        _apply(work, change)
        assert _outcome(lambda: loader.load(work)) == _outcome(lambda: config.load(work)), change
    assert loader.fast >= 8  # most steps took the short way, so the comparison above covered it


def test_leaf_changes_only_for_same_shape_and_plain_values() -> None:
    old = {"a": 1, "b": {"c": 1.0, "d": "x", "e": [1]}, "f": True}
    assert _load.leaf_changes(old, {"a": 2, "b": {"c": 1.0, "d": "y", "e": [1]}, "f": True}) == [
        (("a",), 2), (("b", "d"), "y")]
    assert _load.leaf_changes(old, {"a": 1, "b": {"c": 1.0, "d": "x", "e": [1]}, "f": 1}) == [(("f",), 1)]
    assert _load.leaf_changes(old, {"a": 1, "b": {"c": 1.0, "d": "x", "e": [2]}, "f": True}) is None
    assert _load.leaf_changes(old, {"a": {}, "b": {"c": 1.0, "d": "x", "e": [1]}, "f": True}) is None
    assert _load.leaf_changes(old, {"a": 1, "b": {"c": 1.0, "d": "${a}", "e": [1]}, "f": True}) is None
    assert _load.leaf_changes(old, {"a": 1, "b": {"c": 1.0, "d": "x", "e": [1]}}) is None


# ----------------------------------------------------------------------------------------------- pieces


def test_yaml_of_a_container_reads_back_as_omegaconfs_own() -> None:
    data = {"t": ["true", "no", "1", "1e5", "nan", "0x1f", "1_000", "a: b", "x\ny", "${seed}", ""],
            "n": [1, 1.5, None, True], "d": {"k": {}}, "l": []}
    ours, theirs = to_yaml(data), OmegaConf.to_yaml(OmegaConf.create(data))
    assert OmegaConf.to_container(OmegaConf.create(ours)) == OmegaConf.to_container(OmegaConf.create(theirs)) == data
    assert ours == theirs  # short values: the same text


@pytest.mark.parametrize(("value", "contained"), [
    ("${hydra.job.num}", True), ("multirun/${now:%Y-%m-%d}/${automodel_uid:}", True), ("j${hydra:job.num}", True),
    (r"$\${HF_TOKEN}", True), ("s${seed}", False), ("${oc.select:seed}", False), ("${.num}", False),
    ("\\\\${seed}", False), ({"a": ["x", "${optim.lr}"]}, False), ({"a": ["x", 1, None]}, True),
])
def test_a_hydra_node_is_self_contained_when_it_refers_only_to_hydra(value: tp.Any, contained: bool) -> None:
    assert _self_contained(value) is contained


def test_prepare_with_a_loader_is_prepare(tmp_path: Path) -> None:
    from automodel_hydra import driver

    cfg = compose_cfg(["launcher=slurm", "slurm.partition=debug"], output_dir=tmp_path)
    job = OmegaConf.masked_copy(cfg, [str(k) for k in cfg if k != "hydra"])
    loader = _load.SweepLoader()
    container = OmegaConf.to_container(job, resolve=False)
    assert driver.prepare(job, False, lambda c: loader.load(c, container=tp.cast(dict, container))) == \
        driver.prepare(job, False)


@pytest.mark.parametrize("text", ["seed=0", "seed=7", "seed=-3", "seed=+4", "a.b_c.d=123456789", "optim.lr=1e-4",
                                  "optim.lr=0.0003", "x=.5", "x=-2.5E+3", "x=3e5", "x=0.0", "_k=1.25",
                                  "hydra.job.num=1"])
def test_a_simple_override_is_what_hydras_parser_makes(text: str) -> None:
    ours, (theirs,) = simple_override(text), OverridesParser.create().parse_overrides([text])
    assert ours == theirs and ours is not None and type(ours.value()) is type(theirs.value())


@pytest.mark.parametrize("text", ["seed=007", "seed=1_000", "x=1.", "x=inf", "x=nan", "seed=abc", "+seed=1", "~seed=1",
                                  "a/b=1", "a@p=1", "seed=1,2", "x='1'", "x=${y}", "x=1 ", "a-b=1", "seed=", "x=1e",
                                  "x=0x1f"])
def test_anything_else_goes_to_hydras_parser(text: str) -> None:
    assert simple_override(text) is None


def test_a_yaml_doc_with_changes_is_the_yaml_of_the_changed_data() -> None:
    data = {"hydra": {"job": {"id": "???", "num": "???", "name": "train", "env": {"A": "1"}}, "list": [1, "on"],
                      "runtime": {"output_dir": "???", "cwd": "/x"}, "long": "word " * 40 + "\nline two"}}
    doc = YamlDoc(data)
    changes = {("hydra", "job", "num"): 7, ("hydra", "job", "id"): "automodel_7", ("hydra", "list"): ["a", "1"],
               ("hydra", "runtime", "output_dir"): "/s/7", ("hydra", "new", "key"): "yes"}
    changed = {"hydra": {"job": {"id": "automodel_7", "num": 7, "name": "train", "env": {"A": "1"}},
                         "list": ["a", "1"], "runtime": {"output_dir": "/s/7", "cwd": "/x"},
                         "long": data["hydra"]["long"], "new": {"key": "yes"}}}
    assert doc.text(changes) == to_yaml(changed)
    assert doc.text({}) == to_yaml(data)  # and the document itself is unchanged
