"""One shell-reference grammar for every launcher field: the same text means the same value wherever the
submitting shell's variables are read (expanded when the config loads, kept for the job's script, or expanded at a
SkyPilot launch), bash itself is the judge of bash's forms, and a bad reference is one line naming the field."""

from __future__ import annotations

import functools
import subprocess
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import config, envvars
from automodel_hydra.backends import skypilot_env
from automodel_hydra.schema import UserError

ENV = {"X": "x", "E": "", "PATH": "/usr/bin:/bin"}  # X set, E set and empty, U unset

#: text -> its value in ENV. bash's forms are checked against bash below; AutoModel's and OmegaConf's are not bash.
BASH_FORMS = ["/p$X/a", "/p${X}b", "/p${U-d}q", "/p${E-d}q", "/p${E:-d}q", "/p${U:-d}q", "/p${X:-d}q",
              "/p\\$Xq", "/p\\\\q", "/p'$X'q", "/a b/${X}"]
OTHER_FORMS = {"/p${X,d}q": "/pxq", "/p${U,d}q": "/pdq", "/p${oc.env:X}q": "/pxq",
               "/p${oc.env:U,d}q": "/pdq"}
BAD = ["/p${X:?e}", "/p${X/a/b}", "/p${#X}", "/p${X:-$X}"]  # (an unclosed ${ never passes OmegaConf)


@functools.cache
def bash_value(text: str) -> str:
    """What bash makes of ``text`` as a double-quoted word, in ENV."""
    return subprocess.run(["bash", "--norc", "-c", f'printf %s "{text}"'], env=ENV, capture_output=True,
                          text=True, check=True).stdout


def load(section: str, block: dict[str, tp.Any], tmp_path: Path) -> tp.Any:
    return getattr(config.load({"output_dir": str(tmp_path), section: block}, environ=ENV), section)


def slurm_field(name: str) -> tp.Callable[[str, Path], str]:
    return lambda text, tmp: getattr(load("slurm", {name: text}, tmp), name)


def slurm_env_var(text: str, tmp: Path) -> str:
    """The value the job's ranks see: the script's export line, run by bash with the submitting environment
    (sbatch passes it on)."""
    sc = load("slurm", {"env_vars": {"A": text}}, tmp)
    lines = envvars.export_lines(envvars.parse_env_vars(sc.env_vars, "slurm.env_vars"))
    return subprocess.run(["bash", "--norc", "-c", "\n".join([*lines, 'printf %s "$A"'])], env=ENV,
                          capture_output=True, text=True, check=True).stdout


def skypilot_at_launch(name: str) -> tp.Callable[[str, Path], str]:
    """The value a SkyPilot launch gives the task's variable (skypilot_sdk.launch_values: expand in ENV)."""
    def value(text: str, tmp: Path) -> str:
        sc = load("skypilot", {"env_vars": {"A": text}} if name == "env_vars" else {name: text}, tmp)
        entries = skypilot_env.task_env(sc.env_vars, {}, sc.hf_home, (), frozenset())
        (entry,) = [e for e in entries if e.name == ("A" if name == "env_vars" else "HF_HOME")]
        return envvars.expand(entry.parts, ENV, entry.key)
    return value


def skypilot_job_dir(text: str, tmp: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    from automodel_hydra.backends.skypilot import SkyPilot

    cfg = config.load({"output_dir": str(tmp), "skypilot": {"job_dir": text}}, environ=ENV)
    for k in ("X", "E", "U"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("X", "x")
    monkeypatch.setenv("E", "")
    (value,) = SkyPilot().preflight([cfg]).job_dirs.values()
    return value


#: One field of each kind per launcher: expanded when the config loads (slurm.hf_home, skypilot.workdir; every
#: other plain field takes the same path), kept for the job's script (slurm.env_vars), expanded at launch
#: (skypilot.hf_home, skypilot.env_vars) or at preflight (skypilot.job_dir, below).
PLACES: dict[str, tp.Callable[[str, Path], str]] = {
    "slurm.hf_home": slurm_field("hf_home"),
    "slurm.env_vars": slurm_env_var,
    "skypilot.hf_home": skypilot_at_launch("hf_home"),
    "skypilot.env_vars": skypilot_at_launch("env_vars"),
    "skypilot.workdir": lambda text, tmp: load("skypilot", {"workdir": text}, tmp).workdir,
}


FORMS = BASH_FORMS + sorted(OTHER_FORMS)


def expected(text: str) -> str:
    return OTHER_FORMS.get(text) or bash_value(text)


@pytest.mark.parametrize("place", sorted(PLACES))
def test_a_reference_means_the_same_in_every_launcher_field(place: str, tmp_path: Path) -> None:
    """Each form (one test per place: the per-test fixtures cost more than the checks) against its meaning."""
    wrong = {text: got for text in FORMS if (got := PLACES[place](text, tmp_path)) != expected(text)}
    assert not wrong, {text: (got, expected(text)) for text, got in wrong.items()}


def test_skypilot_job_dir_reads_the_same_grammar(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wrong = {text: got for text in FORMS if (got := skypilot_job_dir(text, tmp_path, monkeypatch)) != expected(text)}
    assert not wrong, wrong


def test_bash_agrees_with_the_expected_values_of_its_forms() -> None:  # the oracle itself, on two known answers
    assert bash_value("/p${E:-d}q") == "/pdq" and bash_value("/p${E-d}q") == "/pq"


@pytest.mark.parametrize("place", sorted([*PLACES, "skypilot.job_dir"]))
def test_a_bad_reference_is_one_line_naming_the_field(place: str, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    for text in BAD:
        with pytest.raises(UserError) as e:
            if place == "skypilot.job_dir":
                skypilot_job_dir(text, tmp_path, monkeypatch)
            else:
                PLACES[place](text, tmp_path)
        message = str(e.value)
        assert "\n" not in message and message.startswith(place), message
        assert "not a supported reference" in message, message


@pytest.mark.parametrize("place", sorted(PLACES))
def test_an_unset_variable_is_one_line_naming_the_field(place: str, tmp_path: Path) -> None:
    if place == "slurm.env_vars":  # for the job: the preflight asks the submitting shell
        sc = load("slurm", {"env_vars": {"A": "/p${U}"}}, tmp_path)
        assert envvars.missing_refs(envvars.parse_env_vars(sc.env_vars, "slurm.env_vars"), ENV) == [("A", "U")]
        return
    with pytest.raises(envvars.UnsetReference) as e:
        PLACES[place]("/p${U}", tmp_path)
    assert str(e.value).startswith(f"{place}") and "${U}" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("text", ["echo '$X' \\$X ${X-d} ${X:?e} \"${U:-$X}\""])
def test_script_fields_are_bash_text_for_the_job_kept_as_written(text: str, tmp_path: Path) -> None:
    assert load("slurm", {"setup": [text], "srun_args": [text]}, tmp_path).setup == [text]
    assert load("slurm", {"srun_args": [text]}, tmp_path).srun_args == [text]
    assert load("skypilot", {"setup": text}, tmp_path).setup == text


def test_omegaconf_interpolations_keep_their_meaning_in_every_kind_of_field(tmp_path: Path) -> None:
    assert load("slurm", {"hf_home": "${output_dir}/hf"}, tmp_path).hf_home == f"{tmp_path}/hf"
    assert load("slurm", {"env_vars": {"A": "${output_dir}/$X"}}, tmp_path).env_vars["A"] == f"{tmp_path}/${{X}}"
    sky = load("skypilot", {"hf_home": "${output_dir}/hf"}, tmp_path)
    assert sky.hf_home == f"{tmp_path}/hf"
