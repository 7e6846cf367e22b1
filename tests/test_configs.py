"""Config composition: every launcher x profile, typed-schema errors, AutoModel aliases and routing."""

from __future__ import annotations

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from automodel_hydra import config, envvars
from automodel_hydra.backends.slurm import parse_slurm_time
from automodel_hydra.schema import ConfigError
from tests.helpers import compose_cfg


@pytest.mark.parametrize("launcher", ["interactive", "slurm", "skypilot"])
@pytest.mark.parametrize("profile", ["none", "nsys"])
def test_every_launcher_and_profile_composes(launcher: str, profile: str, tmp_path) -> None:
    cfg = compose_cfg([f"launcher={launcher}", f"profile={profile}"], tmp_path)
    train_cfg = config.load(cfg)
    assert train_cfg.backend == launcher
    assert train_cfg.profile.nsys.enabled is (profile == "nsys")
    assert train_cfg.output_dir == str(tmp_path)
    assert cfg.hydra.launcher._target_.endswith("AutomodelLauncher")  # one launcher; each job routes by section


@pytest.mark.parametrize("override, key", [
    ("slurm.nodez=3", "nodez"),
    ("step_scheduler.max_stepz=3", "max_stepz"),
    ("+optim.betas=3", "betas"),
])
def test_unknown_key_fails_before_start_naming_it(override: str, key: str, tmp_path) -> None:
    # plain overrides fail while Hydra composes; "+key" is added by Hydra and then fails the typed load
    with pytest.raises((ConfigCompositionException, ConfigKeyError)) as e:
        config.load(compose_cfg(["launcher=slurm", override], tmp_path))
    assert key in str(e.value) + str(e.value.__cause__)


@pytest.mark.parametrize("override, key", [
    ("slurm.nodes=two", "nodes"),
    ("skypilot.use_spot=maybe", "use_spot"),
    ("step_scheduler.max_steps=1.5", "max_steps"),
])
def test_wrong_type_fails_at_compose_naming_it(override: str, key: str) -> None:
    launcher = "skypilot" if override.startswith("skypilot") else "slurm"
    with pytest.raises((ConfigCompositionException, ValidationError)) as e:
        compose_cfg([f"launcher={launcher}", override])
    assert key in str(e.value) + str(e.value.__cause__)


@pytest.mark.parametrize("override, key", [
    ("slurm.nodes=0", "slurm.nodes"),
    ("slurm.ntasks_per_node=-1", "slurm.ntasks_per_node"),
    ("slurm.time=abc", "slurm.time"),
    ("slurm.time=-5", "slurm.time"),
    ("slurm.master_port=70000", "slurm.master_port"),
    ("interactive.nproc_per_node=0", "interactive.nproc_per_node"),
    ("step_scheduler.checkpoint_interval=0", "step_scheduler.checkpoint_interval"),
    ("+interactive.max_requeues=2", "interactive.max_requeues"),
])
def test_bad_values_name_the_key(override: str, key: str, tmp_path) -> None:
    launcher = "slurm" if override.startswith("slurm") else "interactive"
    cfg = compose_cfg([f"launcher={launcher}", override.lstrip("+")], tmp_path)
    with pytest.raises(ConfigError) as e:
        config.load(cfg)
    assert key in str(e.value)


def test_short_time_limit_shrinks_the_checkpoint_margin(tmp_path) -> None:
    """AutoModel's default ``time: "00:05:00"`` is accepted: the 300 s margin becomes half the limit."""
    slurm = config.load(compose_cfg(["launcher=slurm", "slurm.time=00:05:00"], tmp_path)).slurm
    assert slurm is not None and slurm.checkpoint_margin_s == 150
    long = config.load(compose_cfg(["launcher=slurm", "slurm.time=01:00:00"], tmp_path)).slurm
    assert long is not None and long.checkpoint_margin_s == 300


@pytest.mark.parametrize("text, minutes", [
    ("1-00:00:00", 1440), ("90", 90), (90, 90), ("00:30:30", 31), ("10:30", 11), ("2-12", 3600), ("1-1:1", 1501),
])
def test_slurm_time_forms(text: str | int, minutes: int) -> None:
    assert parse_slurm_time(text) == minutes


@pytest.mark.parametrize("text", ["0", "abc", "-5", "1:2:3:4", "", "UNLIMITED", "00:00:00"])
def test_slurm_time_rejected(text: str) -> None:
    with pytest.raises(ConfigError, match="slurm.time"):
        parse_slurm_time(text)


def test_automodel_aliases(tmp_path) -> None:
    ckpt = tmp_path / "step-3"
    ckpt.mkdir()
    cfg = config.load(compose_cfg(["step_scheduler.ckpt_every_steps=7", f"checkpoint.restore_from={ckpt}"], tmp_path))
    assert cfg.step_scheduler.checkpoint_interval == 7
    assert cfg.restore_from.path == str(ckpt)


def test_alias_and_its_canonical_key_both_set_is_refused_naming_both(tmp_path) -> None:
    with pytest.raises(ConfigError, match=r"step_scheduler.ckpt_every_steps.*step_scheduler.checkpoint_interval"):
        config.load(compose_cfg(["step_scheduler.ckpt_every_steps=7", "step_scheduler.checkpoint_interval=9"],
                                tmp_path))
    same = config.load(compose_cfg(["step_scheduler.ckpt_every_steps=9", "step_scheduler.checkpoint_interval=9"],
                                   tmp_path))
    assert same.step_scheduler.checkpoint_interval == 9


def test_launcher_defaults_live_once_in_the_schema(tmp_path) -> None:
    """``launcher=slurm`` selects the section; every default comes from SlurmConfig itself."""
    from automodel_hydra.backends.slurm import SlurmConfig

    assert config.load(compose_cfg(["launcher=slurm"], tmp_path)).slurm == SlurmConfig()


def test_automodel_style_config_routes_by_section(tmp_path) -> None:
    plain = config.load({"output_dir": str(tmp_path)})
    assert plain.backend == "interactive"
    slurm = config.load({"output_dir": str(tmp_path), "slurm": {"nodes": 2, "ntasks_per_node": 8}})
    assert slurm.backend == "slurm" and slurm.slurm.world_size == 16
    sky = config.load({"output_dir": str(tmp_path), "skypilot": {"cloud": "gcp"}})
    assert sky.backend == "skypilot"
    with pytest.raises(ConfigError, match="slurm/skypilot"):
        config.load({"output_dir": str(tmp_path), "slurm": {}, "skypilot": {}})


def test_env_var_references_stay_references(tmp_path) -> None:
    cfg = compose_cfg(["launcher=slurm", "++slurm.env_vars.HF_TOKEN=${HF_TOKEN}", "++slurm.env_vars.MODE=fast"],
                      tmp_path)
    train_cfg = config.load(cfg)
    env = {e.name: e for e in envvars.parse_env_vars(train_cfg.slurm.env_vars, "slurm.env_vars")}
    assert env["HF_TOKEN"].ref == "HF_TOKEN" and env["HF_TOKEN"].literal is None
    assert env["MODE"].literal == "fast"
    assert env["HF_TOKEN"].resolve({"HF_TOKEN": "tok"}) == "tok"


def test_shell_references_in_launcher_fields_mean_what_a_shell_means(tmp_path) -> None:
    env = {"HF_HOME": "/lustre/hf", "IMG": "nvcr.io/nvidia/nemo:25.04"}
    cfg = config.load(compose_cfg(["launcher=slurm", "slurm.hf_home=${HF_HOME}", "slurm.container_image=$IMG",
                                   "slurm.job_name=${NAME:-exp}_${IMG,x}", "++slurm.env_vars.OUT=${output_dir}/o",
                                   "++slurm.env_vars.HOME_DIR=${oc.env:HOME}"], tmp_path), environ=env)
    assert cfg.slurm is not None
    assert (cfg.slurm.hf_home, cfg.slurm.container_image) == ("/lustre/hf", "nvcr.io/nvidia/nemo:25.04")
    assert cfg.slurm.job_name == "exp_nvcr.io/nvidia/nemo:25.04"
    assert cfg.slurm.env_vars["OUT"] == f"{tmp_path}/o"  # OmegaConf's own interpolation, resolved
    assert cfg.slurm.env_vars["HOME_DIR"] == "${HOME}"  # the job's variable: a reference, not a value
    with pytest.raises(envvars.UnsetReference, match=r"^slurm.hf_home refers to \$\{HF_HOME\}, which is not set"):
        config.load(compose_cfg(["launcher=slurm", "slurm.hf_home=${HF_HOME}/hub"], tmp_path), environ={})


def test_bare_variable_name_warns() -> None:
    with pytest.warns(UserWarning, match=r"\$\{HF_TOKEN\}"):
        (e,) = envvars.parse_env_vars({"HF_TOKEN": "HF_TOKEN"}, "slurm.env_vars")
    assert e.literal == "HF_TOKEN"


def test_unknown_key_in_plain_dict_is_rejected(tmp_path) -> None:
    with pytest.raises(ConfigKeyError, match="nodez"):
        config.load({"output_dir": str(tmp_path), "slurm": {"nodez": 2}})


@pytest.mark.slow  # runs train.py or a script as a real process
def test_automodel_style_config_file_routes_to_slurm_and_sweeps_as_one_array(tmp_path) -> None:
    from tests.helpers import train_py

    (tmp_path / "am_slurm.yaml").write_text(
        "defaults:\n  - llm_finetune\n  - _self_\n"
        "slurm:\n  nodes: 2\n  ntasks_per_node: 8\n  time: '04:00:00'\n  partition: batch\n"
        "  env_vars:\n    HF_TOKEN: ${HF_TOKEN}\n"
        "step_scheduler:\n  ckpt_every_steps: 20\n")
    cfg = ["--config-dir", str(tmp_path), "--config-name", "am_slurm", "dry_run=true"]
    token = {"HF_TOKEN": "hf_test"}
    train_py(*cfg, f"hydra.run.dir={tmp_path / 'run'}", env=token)
    script = (tmp_path / "run" / "launch" / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --partition=batch" in script
    assert 'export HF_TOKEN="${HF_TOKEN}"' in script
    train_py("-m", *cfg, "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}", env=token)
    assert (tmp_path / "sweep" / "launch" / "sbatch.sh").read_text().count("#SBATCH --array=0-1") == 1


@pytest.mark.slow  # runs train.py or a script as a real process
def test_yaml11_implicit_types_never_change_a_launcher_value(tmp_path) -> None:
    """An unquoted ``time: 10:00:00`` is ten hours (not YAML 1.1's base-60 36000, 25 days to sbatch); ``no`` is a
    partition name, not False; a command-line override still wins."""
    from tests.helpers import train_py

    (tmp_path / "y11.yaml").write_text("defaults:\n  - llm_finetune\n  - _self_\n"
                                       "slurm:\n  time: 10:00:00\n  partition: no\n  account: 0755\n")
    cfg = ["--config-dir", str(tmp_path), "--config-name", "y11", "dry_run=true"]
    train_py(*cfg, f"hydra.run.dir={tmp_path / 'a'}")
    script = (tmp_path / "a" / "launch" / "sbatch.sh").read_text()
    assert "#SBATCH --time=600" in script and "#SBATCH --partition=no" in script
    assert "#SBATCH --account=0755" in script
    train_py(*cfg, "slurm.time=45", f"hydra.run.dir={tmp_path / 'b'}")
    assert "#SBATCH --time=45" in (tmp_path / "b" / "launch" / "sbatch.sh").read_text()


AUTOMODEL_RECIPE = "nemo_automodel.recipes.llm.train_ft.TrainFinetuneRecipeForNextTokenPrediction"


def test_an_automodel_recipes_slurm_section_gets_automodels_defaults_for_hardware_and_bill(tmp_path) -> None:
    base = {"output_dir": str(tmp_path), "recipe": AUTOMODEL_RECIPE}
    left_out = config.load({**base, "slurm": {"nodes": 2}}).slurm
    assert left_out is not None
    assert (left_out.time, left_out.partition, left_out.gpus_per_node) == ("00:05:00", "batch", None)
    assert left_out.sbatch_args == {"exclusive": None}
    given = config.load({**base, "slurm": {"time": "02:00:00", "partition": "gpu", "gpus_per_node": 8}}).slurm
    assert given is not None and (given.time, given.partition, given.gpus_per_node) == ("02:00:00", "gpu", 8)
    ours = config.load({"output_dir": str(tmp_path), "slurm": {"nodes": 2}}).slurm  # the bundled recipe: ours
    assert ours is not None and (ours.time, ours.partition) == ("04:00:00", None)
    # a file that sets other sbatch options still asks for whole nodes; `exclusive: false` is how it says no
    mail = config.load({**base, "slurm": {"sbatch_args": {"mail-user": "me@site"}}}).slurm
    assert mail is not None and mail.sbatch_args == {"exclusive": None, "mail-user": "me@site"}
    shared = config.load({**base, "slurm": {"sbatch_args": {"exclusive": False}}}).slurm
    assert shared is not None and shared.sbatch_args == {"exclusive": False}
