"""An unknown key or a wrong type is one line, wherever the config is composed or validated: train.py's schema
at compose time, a user's file (validated by config.load), each job of a sweep. The key, the closest valid keys,
the section's keys where short; for a type, the key, the value and the expected type."""

from __future__ import annotations

import os

import pytest

from automodel_hydra import config, driver
from automodel_hydra.schema import ConfigError
from tests.helpers import train_py


def _last(proc) -> str:
    lines = proc.stdout.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.mark.slow
@pytest.mark.parametrize(("args", "line"), [
    (["step_scheduler.max_step=3"], "error: step_scheduler.max_step: no such key in step_scheduler; did you mean "
                                    "max_steps? (its keys: max_steps, checkpoint_interval,"),
    (["step_scheduler.max_steps=two"], "error: step_scheduler.max_steps='two' is invalid: expected an integer"),
    (["launcher=slurm", "slurm.nodez=2"], "error: slurm.nodez: no such key in slurm; did you mean nodes?"),
    (["launcher=slurmm"], "error: launcher=slurmm: no such option; did you mean slurm? (launcher: interactive, "),
    (["-m", "optim.lr=1e-3", "step_scheduler.max_steps=1,two", "dry_run=true"],
     "error: step_scheduler.max_steps='two' is invalid: expected an integer"),
    # a list for a mapping or a section, a mapping for a list (OmegaConf: "Cannot merge DictConfig with ListConfig",
    # no value), a list entry of the wrong shape (was a TypeError traceback)
    (["launcher=slurm", "slurm.sbatch_args=[--foo]"],
     "error: slurm.sbatch_args=['--foo'] is invalid: expected a mapping (KEY: VALUE); on the command line: "
     "++slurm.sbatch_args={KEY:VALUE,...}"),
    (["launcher=skypilot", "skypilot.env_vars=['A=1']"], "error: skypilot.env_vars=['A=1'] is invalid: expected a "
                                                        "mapping (KEY: VALUE)"),
    (["launcher=slurm", "slurm.setup={a:1}"], "error: slurm.setup={'a': 1} is invalid: expected a list; on the "
                                               "command line: slurm.setup=[A,B,...]"),
    (["launcher=slurm", "slurm={tunnel:[a]}"], "error: slurm.tunnel=['a'] is invalid: expected a section (KEY: "
                                               "VALUE entries); on the command line: ++slurm.tunnel={KEY:VALUE,...}"),
    (["launcher=slurm", "slurm.setup=[[a]]"], "error: slurm.setup[0]=['a'] is invalid: expected a string"),
    # a scalar for a mapping: how to write one
    (["launcher=slurm", "slurm.env_vars=3"], "error: slurm.env_vars=3 is invalid: expected a mapping (KEY: VALUE); "
                                             "on the command line: ++slurm.env_vars={KEY:VALUE,...}"),
    # an entry of a mapping of strings that is not one (OmegaConf: "Key 'A' is not in struct"; "Cannot convert")
    (["launcher=slurm", "slurm.env_vars={A:[1]}"], "error: slurm.env_vars.A=[1] is invalid: expected a string"),
    (["launcher=slurm", "++slurm.env_vars.A=[1]"], "error: slurm.env_vars.A=[1] is invalid: expected a string"),
    # a mapping's new key without ++ (was "no such key in slurm.sbatch_args", which has no fixed keys)
    (["launcher=slurm", "slurm.sbatch_args={qos:x}"], "error: slurm.sbatch_args.qos: a new key of the mapping "
                                                      "slurm.sbatch_args; on the command line a new key takes ++: "
                                                      "++slurm.sbatch_args={qos:x}"),
])
def test_composition_errors_are_one_line(tmp_path, args: list[str], line: str) -> None:
    proc = train_py(*args, f"hydra.run.dir={tmp_path / 'R'}", f"hydra.sweep.dir={tmp_path / 'S'}", check=False)
    assert proc.returncode == 2, proc.stdout[-2000:]
    assert _last(proc).startswith(line), proc.stdout[-2000:]
    assert "+step_scheduler" not in proc.stdout and "full_key" not in proc.stdout and "Traceback" not in proc.stdout
    assert "Cannot merge" not in proc.stdout and "not in struct" not in proc.stdout


@pytest.mark.slow
def test_a_users_file_and_its_launcher_section_get_the_same_line(tmp_path) -> None:
    (tmp_path / "mine.yaml").write_text("step_scheduler:\n  max_steps: 3\ndist_env:\n  timeout_minute: 2\n")
    proc = train_py("--config-dir", str(tmp_path), "--config-name", "mine", "dry_run=true",
                    f"hydra.run.dir={tmp_path / 'R'}", check=False)
    assert proc.returncode == 2
    assert _last(proc) == ("error: dist_env.timeout_minute: no such key in dist_env; did you mean timeout_minutes? "
                           "(its keys: timeout_minutes)"), proc.stdout[-2000:]
    with pytest.raises(Exception) as err:
        config.load({"slurm": {"nodes": "two"}, "output_dir": str(tmp_path)})
    assert driver.one_line(err.value) == "slurm.nodes='two' is invalid: expected an integer"
    with pytest.raises(Exception) as err:
        config.load({"slurm": {"gpus_per_nod": 1}, "output_dir": str(tmp_path)})
    assert driver.one_line(err.value).startswith("slurm.gpus_per_nod: no such key in slurm; did you mean gpus_per_node")


@pytest.mark.slow
def test_a_users_hydra_full_error_still_gets_hydras_traceback(tmp_path) -> None:
    proc = train_py("step_scheduler.max_step=3", f"hydra.run.dir={tmp_path / 'R'}", env={"HYDRA_FULL_ERROR": "1"},
                    check=False)
    assert proc.returncode == 1 and "Traceback" in proc.stdout


@pytest.mark.parametrize(("section", "line"), [
    ({"slurm": {"sbatch_args": ["--foo"]}}, "slurm.sbatch_args=['--foo'] is invalid: expected a mapping (KEY: VALUE)"),
    ({"slurm": {"setup": {"a": 1}}}, "slurm.setup={'a': 1} is invalid: expected a list"),
    ({"skypilot": {"env_vars": ["A=1"]}}, "skypilot.env_vars=['A=1'] is invalid: expected a mapping (KEY: VALUE)"),
    ({"slurm": ["a"]}, "slurm=['a'] is invalid: expected a section (KEY: VALUE entries)"),
    ({"slurm": {"tunnel": {"options": ["a"]}}}, "slurm.tunnel.options=['a'] is invalid: expected a mapping"),
    # was exported as A='[1]', the list's repr
    ({"slurm": {"env_vars": {"A": [1]}}}, "slurm.env_vars.A=[1] is invalid: expected a string"),
    ({"slurm": {"srun_args": [{"a": 1}]}}, "slurm.srun_args[0]={'a': 1} is invalid: expected a string"),  # was kept
])
def test_a_users_file_with_a_value_of_the_wrong_shape_gets_the_key(tmp_path, section, line: str) -> None:
    """A user's file is validated by config.load, where OmegaConf's merge error names no key at all, and its merge
    keeps a list or a mapping given as an entry of a List[str] or Dict[str, str] (which then failed later, or was
    exported as its repr)."""
    with pytest.raises(ConfigError) as err:
        config.load({**section, "output_dir": str(tmp_path)})
    assert driver.one_line(err.value).startswith(line)


@pytest.mark.slow
@pytest.mark.parametrize("override", ["checkpoint.checkpoint_dir=~/ckpt", "model.pretrained_model_name_or_path=~/m"])
def test_an_unquoted_tilde_in_a_value_is_one_line_with_the_forms_to_write(tmp_path, override: str) -> None:
    """Hydra's override grammar has ``~`` only as a key's delete prefix: ``key=~/x`` was Hydra's
    ``LexerNoViableAltException`` and a caret line. Now one line naming the override and the forms to write: the
    path written out (no shell and no AutoModel recipe expands a quoted ``~``) and the quoted form for a literal
    ``~``, which Hydra's own parser reads as meant (as a shell passes them)."""
    import shlex

    from hydra.core.override_parser.overrides_parser import OverridesParser

    (tmp_path / "mine.yaml").write_text(
        "recipe: TrainFinetuneRecipeForNextTokenPrediction\nmodel:\n  _target_: nemo_automodel.NeMoAutoModelForCausal"
        "LM.from_pretrained\n  pretrained_model_name_or_path: meta-llama/Llama-3.2-1B\ncheckpoint:\n  enabled: true\n"
        "  checkpoint_dir: checkpoints/\n")
    proc = train_py("--config-dir", str(tmp_path), "--config-name", "mine", "dry_run=true", override,
                    f"hydra.run.dir={tmp_path / 'R'}", check=False)
    assert proc.returncode == 2, proc.stdout[-2000:]
    line = _last(proc)
    assert line.startswith(f"error: {override}: Hydra's override grammar does not accept an unquoted ~ in a value; "
                           "on the command line write the path out: "), line
    assert "Lexer" not in proc.stdout and "Traceback" not in proc.stdout and "^" not in proc.stdout
    key, _, value = override.partition("=")
    # the path written out (a quoted ~ would reach AutoModel's recipe as a literal ~), and the quoted form for a
    # literal ~, each read by Hydra's own parser as a shell passes it
    written = line.split("write the path out: ", 1)[1].split(" (", 1)[0]
    (quoted,) = shlex.split(line.split("for a literal ~: ", 1)[1])
    parser = OverridesParser.create()
    assert (parser.parse_override(written).key_or_group, parser.parse_override(written).value()) == (
        key, os.path.expanduser(value))
    parsed = parser.parse_override(quoted)
    assert (parsed.key_or_group, parsed.value()) == (key, value)


@pytest.mark.slow
def test_our_warning_is_one_line(tmp_path) -> None:
    """A warning of ours printed as Python prints one: ``.../slurm.py:620: UserWarning: ...`` and then our source
    line. It is one line, ``warning: <message>``, as an error is ``error: <message>``."""
    proc = train_py("launcher=slurm", "slurm.partition=debug", "slurm.ntasks_per_node=1", "++slurm.command=my.sh",
                    "slurm.snapshot=none",
                    "dry_run=true", f"hydra.run.dir={tmp_path / 'R'}")
    lines = proc.stdout.splitlines()
    (at,) = [i for i, line in enumerate(lines) if "slurm.command" in line and "ignored" in line]
    assert lines[at].startswith("warning: slurm.command is set by AutoModel's own CLI"), lines[at]
    assert "UserWarning" not in proc.stdout and not lines[at + 1].startswith("  ")
