"""The resume keys of an AutoModel recipe's job, planned: what each means on SkyPilot (spot or not), where the ranks
see this machine's files (local, bare-metal Slurm), and what rank 0 resolves at job start in AutoModel's own layout
(``epoch_E_step_N`` dirs, a ``LATEST`` symlink; AutoModel's real ``find_latest_checkpoint``). The end-to-end resume
with AutoModel's real recipe is in tests/test_automodel_launch.py."""

from __future__ import annotations

import os
import typing as tp
from pathlib import Path

import pytest
import yaml

from automodel_hydra import config
from automodel_hydra.automodel import resume as automodel_resume
from automodel_hydra.backends import skypilot, slurm
from automodel_hydra.backends.interactive import Interactive
from automodel_hydra.plan import JobSpec
from automodel_hydra.schema import ConfigError

SQUAD = yaml.safe_load((Path(__file__).parent / "data" / "automodel" / "llama3_2_1b_squad.yaml").read_text())
JOB = JobSpec(job_dir=Path("/runs/out"), job_name="train", project_root=Path("/src/automodel-hydra"))
FACTS = skypilot.Facts("automodel-me-12345678", frozenset({"HF_TOKEN"}))


def squad(**changes: tp.Any) -> dict[str, tp.Any]:
    """AutoModel's SQuAD file's sections with ``changes`` (``checkpoint`` merged into its section)."""
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in SQUAD.items()}
    if "checkpoint" in changes:
        out["checkpoint"] = {**out["checkpoint"], **changes.pop("checkpoint")}
    return {**out, **changes}


def sky_plan(sections: dict[str, tp.Any], spot: bool = True, **block: tp.Any) -> skypilot.Plan:
    cfg = config.load({**sections, "output_dir": "/runs/out",
                       "skypilot": {"cloud": "aws", "use_spot": spot, "hf_token": "", **block}})
    return skypilot.make_plan(cfg, JOB, FACTS)


def test_skypilot_spot_resume_key_means_the_jobs_own_newest_checkpoint_on_the_nodes() -> None:
    """``restore_from: {path: /checkpoints/latest}`` (the spot-resume key) with AutoModel's recipe: on the nodes
    it is ``latest``, which rank 0 resolves to the newest checkpoint of the job's own dir in its bucket."""
    p = sky_plan(squad(restore_from={"path": "/checkpoints/latest"}))
    node = yaml.safe_load(p.files[skypilot.NODE_JOB_FILE])
    assert node["restore_from"] == {"path": "latest"}
    assert node["checkpoint"] == SQUAD["checkpoint"]  # the user's section as written
    moved = sky_plan(squad(restore_from={"path": "/ckpt/LATEST"}), checkpoint_mount="/ckpt")
    assert yaml.safe_load(moved.files[skypilot.NODE_JOB_FILE])["restore_from"] == {"path": "latest"}
    for fine in ({"restore_from": {"path": "latest"}}, {"checkpoint": {"restore_from": "LATEST"}}, {}):
        sky_plan(squad(**fine))


@pytest.mark.parametrize(("sections", "spot", "block", "key"), [
    (squad(checkpoint={"restore_from": "/elsewhere/epoch_0_step_5"}), True, {}, "checkpoint.restore_from"),
    (squad(checkpoint={"restore_from": "/elsewhere/epoch_0_step_5"}), False, {}, "checkpoint.restore_from"),
    (squad(checkpoint={"restore_from": "epoch_0_step_5"}), True, {}, "checkpoint.restore_from"),
    (squad(checkpoint={"restore_from": "/checkpoints/LATEST"}), True, {}, "checkpoint.restore_from"),
    (squad(restore_from={"path": "/elsewhere/latest"}), True, {}, "restore_from.path"),
    (squad(restore_from={"path": "/checkpoints/latest"}), True, {"checkpoint_mount": "/ckpt"}, "restore_from.path"),
], ids=["abs-spot", "abs-ondemand", "name-spot", "am-key-mount-pointer", "other-dir-latest", "other-mount"])
def test_skypilot_refuses_a_resume_key_the_nodes_cannot_honour(sections: dict[str, tp.Any], spot: bool,
                                                               block: dict[str, tp.Any], key: str) -> None:
    """A local path is not on the nodes; on spot, a fixed checkpoint would be loaded again on every recovery. One
    line naming the key and what to write (the bundled recipe's rule). Old main planned all of them."""
    with pytest.raises(ConfigError, match=rf"^{key}=.*(latest|LATEST)") as e:
        sky_plan(sections, spot=spot, **block)
    assert "\n" not in str(e.value)


def test_a_refused_checkpoint_restore_from_lists_that_keys_own_values() -> None:
    """``checkpoint.restore_from`` takes LATEST or a checkpoint's name, not ``restore_from.path``'s values."""
    for spot in (True, False):
        with pytest.raises(ConfigError) as e:
            sky_plan(squad(checkpoint={"restore_from": "/x/epoch_0_step_3"}), spot=spot)
        valid = str(e.value).split(" is invalid: ", 1)[1]
        assert valid.startswith("LATEST, ") and "or restore_from.path: latest" in valid, valid
        assert ("checkpoint's name" in valid) is not spot


def test_an_entry_of_the_jobs_own_dir_is_fine_on_demand() -> None:
    sky_plan(squad(checkpoint={"restore_from": "epoch_0_step_5"}), spot=False)


@pytest.mark.parametrize(("sections", "match"), [
    (squad(restore_from={"path": None}), r"^restore_from.path=None is invalid: .*new checkpoint.checkpoint_dir"),
    (squad(restore_from={"path": "/a/latest"}, checkpoint={"restore_from": "LATEST"}),
     r"^checkpoint.restore_from='LATEST' is invalid: restore_from.path='/a/latest' is set too"),
    (squad(restore_from={"path": "latest"}, checkpoint={"enabled": False}),
     r"^restore_from.path='latest' is invalid: with checkpoint.enabled=false"),
])
def test_a_resume_key_that_cannot_mean_the_same_is_one_line_at_load(sections: dict[str, tp.Any],
                                                                     match: str) -> None:
    with pytest.raises(ConfigError, match=match) as e:
        config.load({**sections, "output_dir": "/runs/out"})
    assert "\n" not in str(e.value)


def _automodel_ckpt(root: Path, *steps: int, latest: int | None = None) -> Path:
    """AutoModel's layout: ``epoch_0_step_N/model/`` dirs and a ``LATEST`` symlink (relative, as it writes it)."""
    for n in steps:
        (root / f"epoch_0_step_{n}" / "model").mkdir(parents=True)
    if latest is not None:
        os.symlink(f"epoch_0_step_{latest}", root / "LATEST")
    return root


def test_where_the_ranks_see_this_machine_a_missing_or_foreign_checkpoint_is_one_line(tmp_path: Path) -> None:
    """Local runs and bare-metal Slurm (``config.host_problems``, both backends' preflight): the checkpoint an
    AutoModel recipe would start from is checked before any rank starts."""
    d = _automodel_ckpt(tmp_path / "d", 1, 3, latest=3)
    bundled = tmp_path / "bundled" / "step-4"
    bundled.mkdir(parents=True)
    (bundled / ".metadata").write_text("")
    cases = {f"{tmp_path}/nope/epoch_0_step_3": "no such directory here",
             str(bundled): "a checkpoint of the bundled recipe",
             str(d): f"write {d}/latest for its newest"}
    for path, why in cases.items():
        for sections in (squad(restore_from={"path": path}), squad(checkpoint={"restore_from": path})):
            cfg = config.load({**sections, "output_dir": str(tmp_path / "out")})
            (problem,) = config.host_problems(cfg)
            assert why in str(problem) and "\n" not in str(problem)
            with pytest.raises(ConfigError, match=why):
                Interactive().preflight([cfg])
            on_slurm = config.load({**sections, "output_dir": str(tmp_path / "out"),
                                    "slurm": {"job_name": "squad_ft", "time": "00:10:00"}})
            with pytest.raises(ConfigError, match=why):  # bare metal: the nodes see this filesystem
                slurm.Slurm().preflight([on_slurm])
    for fine in (f"{d}/latest", f"{d}/LATEST", str(d / "epoch_0_step_1"), "latest"):
        assert config.host_problems(config.load({**squad(restore_from={"path": fine}), "output_dir": "/o"})) == []
    assert config.host_problems(config.load({**squad(checkpoint={"restore_from": "epoch_0_step_9"}),
                                             "output_dir": "/o"})) == []  # AutoModel's name in its own dir
    # AutoModel's key reads D/LATEST as a path (its symlink): there, or not there yet (AutoModel would fail)
    assert config.host_problems(config.load({**squad(checkpoint={"restore_from": f"{d}/LATEST"}),
                                             "output_dir": "/o"})) == []
    (missing,) = config.host_problems(config.load({**squad(checkpoint={"restore_from": f"{tmp_path}/e/LATEST"}),
                                                   "output_dir": "/o"}))
    assert missing.key == "checkpoint.restore_from" and "no such directory" in str(missing)


def test_d_latest_of_a_dir_that_does_not_exist_is_one_line_where_the_ranks_see_this_machine(tmp_path: Path) -> None:
    """``restore_from.path: D/latest`` with no dir ``D`` (a typo, an unmounted disk) would be a fresh start that
    nothing reports (rank 0 finds no checkpoint in it): refused on torchrun here and bare-metal Slurm, naming
    ``D``. ``latest`` and ``C/latest`` for the job's own checkpoint dir ``C`` (a first run creates it) still plan;
    on SkyPilot ``<mount>/latest`` is the bucket (test_skypilot_spot_resume_key_...). Old main planned it."""
    out = tmp_path / "out"
    missing = f"{tmp_path}/not-yet/latest"
    sections = squad(restore_from={"path": missing})
    (problem,) = config.host_problems(config.load({**sections, "output_dir": str(out)}))
    assert problem.key == "restore_from.path" and f"{tmp_path}/not-yet does not exist" in str(problem)
    assert "\n" not in str(problem)
    with pytest.raises(ConfigError, match="not-yet does not exist"):
        Interactive().preflight([config.load({**sections, "output_dir": str(out)})])
    on_slurm = config.load({**sections, "output_dir": str(out), "slurm": {"job_name": "squad_ft", "time": "00:10:00"}})
    with pytest.raises(ConfigError, match="not-yet does not exist"):
        slurm.Slurm().preflight([on_slurm])
    for fine in (squad(restore_from={"path": "latest"}),  # the job's own checkpoints/, under the job dir
                 squad(restore_from={"path": f"{out}/checkpoints/latest"}),
                 squad(restore_from={"path": f"{tmp_path}/mine/LATEST"},
                       checkpoint={"checkpoint_dir": f"{tmp_path}/mine/"})):
        assert config.host_problems(config.load({**fine, "output_dir": str(out)})) == []
    sky_plan(squad(restore_from={"path": "/checkpoints/latest"}))  # the job's bucket dir on the nodes


def test_rank0_resolves_d_latest_own_checkpoints_first_in_automodels_layout(tmp_path: Path) -> None:
    pytest.importorskip("nemo_automodel")
    from nemo_automodel.components.checkpoint.utils import find_latest_checkpoint

    d = _automodel_ckpt(tmp_path / "d", 1, 3, latest=3)
    own = tmp_path / "own"
    sections = squad(restore_from={"path": f"{d}/latest"}, checkpoint={"checkpoint_dir": str(own)})
    value, line = automodel_resume.resolve(sections, find_latest_checkpoint) or (None, "")
    assert value == str(d / "epoch_0_step_3") and "the job's own" in line and "has none yet" in line
    _automodel_ckpt(own, 5, latest=5)  # the job saved one: a recovery continues from it
    value, line = automodel_resume.resolve(sections, find_latest_checkpoint) or (None, "")
    assert value == str(own / "epoch_0_step_5") and "its own progress comes first" in line
    empty = squad(restore_from={"path": f"{tmp_path}/none/latest"}, checkpoint={"checkpoint_dir": str(tmp_path / "e")})
    assert automodel_resume.resolve(empty, find_latest_checkpoint) == (
        None, f"restore_from.path='{tmp_path}/none/latest': no complete checkpoint in {tmp_path / 'e'} or "
              f"{tmp_path}/none: fresh start")
    assert automodel_resume.resolve(squad(checkpoint={"restore_from": "LATEST"}), find_latest_checkpoint) is None
