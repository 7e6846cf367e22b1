"""Plan-time checks of AutoModel YAML files: launcher/recipe sections, AutoModel's loader naming the bad key, and a
model that cannot be fetched failing in one line before any rank starts (local dirs, ``HF_HUB_OFFLINE=1``)."""

from __future__ import annotations

import sys
import typing as tp
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from omegaconf import OmegaConf

from automodel_hydra.automodel.files import (
    ModelNotFetchableError,
    RecipeSectionError,
    check_model_fetchable,
    model_names,
    split_sections,
    validate_recipe_sections,
)
from automodel_hydra.sections import NEVER_THE_RECIPES
from tests.automodel_assets import SQUAD_YAML

HUB_MODEL = "meta-llama/Llama-3.2-1B"  # what the unmodified YAML names


def squad() -> dict[str, tp.Any]:
    return yaml.safe_load(SQUAD_YAML.read_text())


# ------------------------------------------------------------------------------------------------ sections


def test_split_sections_separates_launcher_from_recipe() -> None:
    cfg = {"slurm": {"nodes": 2}, **squad(), "skypilot": {"cloud": "aws"}, "hydra": {}, "dry_run": True,
           "nemo_run": {}, "interactive": {}, "fault_tolerance": {}, "failure_budget": {}, "health_check": {},
           "launcher": "slurm",
           "profile": {"nsys": {}}}
    launcher, recipe = split_sections(cfg)
    assert set(launcher) == NEVER_THE_RECIPES
    assert list(recipe) == list(squad())  # order kept: recipe, step_scheduler, dist_env, rng, model, ...
    assert recipe["model"]["pretrained_model_name_or_path"] == HUB_MODEL


def test_split_sections_of_a_dictconfig_keeps_env_references_unresolved() -> None:
    cfg = OmegaConf.create({"slurm": {"nodes": 1}, "model": {"pretrained_model_name_or_path": "${HF_MODEL,x/y}"},
                            "dataset": {"path": "${oc.env:DATA_DIR}"}})
    _, recipe = split_sections(cfg)
    assert recipe == {"model": {"pretrained_model_name_or_path": "${HF_MODEL,x/y}"},
                      "dataset": {"path": "${oc.env:DATA_DIR}"}}


def test_model_names_finds_every_model_key() -> None:
    sections = {**squad(), "teacher_model": {"pretrained_model_name_or_path": "org/teacher"},
                "extra": [{"pretrained_model_name_or_path": "/models/x"}]}
    assert model_names(sections) == [("model.pretrained_model_name_or_path", HUB_MODEL),
                                     ("teacher_model.pretrained_model_name_or_path", "org/teacher"),
                                     ("extra.0.pretrained_model_name_or_path", "/models/x")]


def test_validate_is_a_no_op_without_automodel(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("nemo_automodel", "nemo_automodel.components.config.loader"):
        monkeypatch.setitem(sys.modules, name, None)
    validate_recipe_sections({"model": {"_target_": "no.such.thing"}})


@pytest.mark.automodel
def test_validate_names_the_bad_key(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nemo_automodel")
    monkeypatch.delenv("AMH_UNSET_VAR", raising=False)
    validate_recipe_sections(squad())  # AutoModel's own example loads

    bad_target = squad()
    bad_target["loss_fn"]["_target_"] = "nemo_automodel.components.loss.masked_ce.NoSuchLoss"
    with pytest.raises(RecipeSectionError) as err:
        validate_recipe_sections(bad_target)
    assert err.value.key == "loss_fn._target_" and str(err.value).startswith("loss_fn._target_: ImportError: ")
    assert "NoSuchLoss" in str(err.value) and "\n" not in str(err.value)

    unset = squad()
    unset["dataset"]["dataset_name"] = "${AMH_UNSET_VAR}"
    with pytest.raises(RecipeSectionError, match=r"^dataset.dataset_name: Environment variable 'AMH_UNSET_VAR' is "
                                                 r"not set \(required by '\$\{AMH_UNSET_VAR\}'\)"):
        validate_recipe_sections(unset)
    validate_recipe_sections(unset, allow_unset_env=True)  # set only on the compute nodes
    unset["dataset"]["dataset_name"] = "${AMH_UNSET_VAR,rajpurkar/squad}"
    validate_recipe_sections(unset)  # a default is AutoModel's meaning of ${VAR,default}

    private = squad()
    private["optimizer"]["_target_"] = "os._exit"  # AutoModel's loader refuses private attributes
    with pytest.raises(RecipeSectionError, match=r"^optimizer._target_: ImportError: Access to private or dunder "
                                                 r"attributes is disabled by default"):
        validate_recipe_sections(private)


# --------------------------------------------------------------------------------------------- model fetchable


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def cached_model(cache: Path, repo_id: str) -> None:
    """``repo_id``'s config.json in huggingface_hub's cache layout (models--ORG--NAME/refs/main -> snapshot)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0123456789abcdef0123456789abcdef01234567")
    snap = repo / "snapshots" / "0123456789abcdef0123456789abcdef01234567"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")


def test_local_model_dir(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    check_model_fetchable(tmp_path)
    check_model_fetchable(str(tmp_path))


@pytest.mark.parametrize(("name", "reason"), [
    ("/no/such/model-dir", "local dir missing: /no/such/model-dir does not exist"),
    ("./checkpoints/llama", "local dir missing"),
    ("~/no-such-dir-amh/llama", "local dir missing"),
    ("models/llama/3b", "local dir missing"),
    ("bad repo id!", "not an existing local dir nor a valid Hub repo id"),
])
def test_missing_local_paths_fail(name: str, reason: str, offline: None) -> None:
    with pytest.raises(ModelNotFetchableError) as err:
        check_model_fetchable(name)
    assert str(err.value).startswith(f"model {name!r} cannot be fetched: ") and reason in str(err.value)
    assert "\n" not in str(err.value)


def test_dir_without_config_and_file_fail(tmp_path: Path) -> None:
    with pytest.raises(ModelNotFetchableError, match=r"has no config.json \(not a saved model\)"):
        check_model_fetchable(tmp_path)
    (tmp_path / "weights.bin").write_text("")
    with pytest.raises(ModelNotFetchableError, match=r"is a file, not a model directory"):
        check_model_fetchable(tmp_path / "weights.bin")


def test_offline_needs_the_cache(tmp_path: Path, offline: None) -> None:
    with pytest.raises(ModelNotFetchableError, match=rf"^model '{HUB_MODEL}' cannot be fetched: offline "
                                                     rf"\(HF_HUB_OFFLINE=1\) and not in the Hugging Face cache "
                                                     rf"{tmp_path}$"):
        check_model_fetchable(HUB_MODEL, cache_dir=tmp_path)
    cached_model(tmp_path, HUB_MODEL)
    check_model_fetchable(HUB_MODEL, cache_dir=tmp_path)


def test_unmodified_yaml_offline_fails_naming_its_model(tmp_path: Path, offline: None) -> None:
    [(key, name)] = model_names(split_sections(squad())[1])
    assert key == "model.pretrained_model_name_or_path"
    with pytest.raises(ModelNotFetchableError, match="meta-llama/Llama-3.2-1B"):
        check_model_fetchable(name, cache_dir=tmp_path)


def _raise(exc: BaseException) -> tp.Callable[..., None]:
    def f(*args: tp.Any, **kwargs: tp.Any) -> None:
        raise exc
    return f


def _http_error(cls: type[Exception]) -> Exception:
    return cls("403 Forbidden", response=SimpleNamespace(headers={}, request=None))  # type: ignore[call-arg]


@pytest.mark.parametrize(("error", "reason"), [
    ("GatedRepoError", "gated repo and this token has no access"),
    ("RepositoryNotFoundError", "not found on the Hugging Face Hub (or private: set HF_TOKEN)"),
])
def test_online_gated_or_missing(monkeypatch: pytest.MonkeyPatch, error: str, reason: str) -> None:
    import huggingface_hub
    from huggingface_hub import errors

    monkeypatch.setattr(huggingface_hub, "auth_check", _raise(_http_error(getattr(errors, error))))
    with pytest.raises(ModelNotFetchableError) as err:
        check_model_fetchable(HUB_MODEL, offline=False)
    assert str(err.value) == f"model '{HUB_MODEL}' cannot be fetched: {reason}" + (
        " (accept its license on the Hub and set HF_TOKEN)" if error == "GatedRepoError" else "")


def test_online_unreachable_falls_back_to_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "auth_check", _raise(ConnectionError("Name or service not known")))
    with pytest.raises(ModelNotFetchableError, match=r"Hub unreachable \(ConnectionError: Name or service not "
                                                     r"known\) and not in the Hugging Face cache"):
        check_model_fetchable(HUB_MODEL, offline=False, cache_dir=tmp_path)
    cached_model(tmp_path, HUB_MODEL)
    check_model_fetchable(HUB_MODEL, offline=False, cache_dir=tmp_path)


def test_online_ok(monkeypatch: pytest.MonkeyPatch) -> None:
    import huggingface_hub

    seen: list[tuple[str, tp.Any]] = []
    monkeypatch.setattr(huggingface_hub, "auth_check", lambda repo_id, token=None: seen.append((repo_id, token)))
    check_model_fetchable(HUB_MODEL, offline=False, token="hf_x")
    assert seen == [(HUB_MODEL, "hf_x")]


def test_read_path_values_are_the_model_and_dataset_keys_a_rank_loads() -> None:
    """Every ``pretrained_model_name_or_path`` and the dataset sections' path keys (lists entered), in order; not a
    written dir, a value with ``$``, a switched-off ``_`` section or a path key outside a dataset section. The form
    alone tells absolute, ``~`` and relative paths from what may be a Hub id or is a URL."""
    from automodel_hydra.automodel.files import read_path_values
    from automodel_hydra.paths import path_form

    sections = {"model": {"pretrained_model_name_or_path": "/data/m",
                          "config": {"pretrained_model_name_or_path": "meta-llama/Llama-3.2-1B"}},
                "teacher_model": {"pretrained_model_name_or_path": "~/teacher"},
                "dataset": {"path_or_dataset_id": ["/d/a.jsonl", "/d/b.jsonl"],
                            "tokenizer": {"pretrained_model_name_or_path": "./tok"}},
                "_validation_dataset": {"path_or_dataset": "/off"},
                "validation_dataset": {"dataset_name": "rajpurkar/squad", "path": "${HOME}/x"},
                "checkpoint": {"checkpoint_dir": "/ck", "path": "/not/a/dataset/key"}}
    assert read_path_values(sections) == [
        ("model.pretrained_model_name_or_path", "/data/m"),
        ("model.config.pretrained_model_name_or_path", "meta-llama/Llama-3.2-1B"),
        ("teacher_model.pretrained_model_name_or_path", "~/teacher"),
        ("dataset.path_or_dataset_id.0", "/d/a.jsonl"), ("dataset.path_or_dataset_id.1", "/d/b.jsonl"),
        ("dataset.tokenizer.pretrained_model_name_or_path", "./tok"),
        ("validation_dataset.dataset_name", "rajpurkar/squad")]
    forms = {v: path_form(v) for v in ("/a", "~/a", "./a", "..", "a/b/c", "org/name", "name", "hf://org/name/f")}
    assert forms == {"/a": "absolute", "~/a": "home", "./a": "relative", "..": "relative", "a/b/c": "relative",
                     "org/name": None, "name": None, "hf://org/name/f": None}


def test_a_missing_dataset_path_is_one_line_where_the_ranks_read_this_machines_files(tmp_path: Path) -> None:
    """A dataset file given as an absolute or ``~`` path that does not exist, on torchrun here and on bare-metal
    Slurm (``config.host_problems``, both backends' preflight), is refused before any rank starts, naming the key
    and the value, as a missing local model dir is; a Hub dataset id and an existing file pass. Old main planned
    the job, whose ranks then failed in ``load_dataset``."""
    from automodel_hydra import config
    from automodel_hydra.backends import slurm
    from automodel_hydra.backends.interactive import Interactive
    from automodel_hydra.schema import ConfigError

    there = tmp_path / "train.jsonl"
    there.write_text('{"question": "q", "answer": "a"}\n')

    def load(value: str, **launcher: tp.Any) -> config.TrainConfig:
        sections = squad()
        sections["dataset"] = {"_target_": "nemo_automodel.components.datasets.llm.column_mapped_text_instruction_"
                               "dataset.ColumnMappedTextInstructionDataset", "path_or_dataset_id": value,
                               "column_mapping": {"question": "question", "answer": "answer"}}
        return config.load({**sections, "output_dir": str(tmp_path / "out"), **launcher})

    on_slurm = {"slurm": {"job_name": "squad_ft", "time": "00:10:00"}}
    for missing in (f"{tmp_path}/nope/train.jsonl", "~/no-such-dir-amh/train.jsonl"):
        (problem,) = config.host_problems(load(missing))
        assert problem.key == "dataset.path_or_dataset_id" and repr(missing) in str(problem)
        assert "does not exist" in str(problem) and "\n" not in str(problem)
        with pytest.raises(ConfigError, match="does not exist"):
            Interactive().preflight([load(missing)])
        with pytest.raises(ConfigError, match="does not exist"):  # bare metal: the nodes see this filesystem
            slurm.Slurm().preflight([load(missing, **on_slurm)])
    for fine in (str(there), "rajpurkar/squad", "squad"):  # an existing file, Hub ids (org/name, name)
        assert config.host_problems(load(fine)) == []
        assert config.host_problems(load(fine, **on_slurm)) == []
