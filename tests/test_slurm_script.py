"""``automodel_hydra.backends.slurm_script``: the sbatch renderer, the job-id parser and the export helpers.

The golden script is recorded once and reviewed; a missing golden fails (print it with ``python -m
tests.test_slurm_script > tests/golden/render_sbatch.sh``, read it, commit it). Quoting is checked against a
model of sbatch's ``#SBATCH`` parser here, and against the real sbatch in ``tests/test_slurm_cluster_signals.py``.
"""

from __future__ import annotations

import difflib
import os
import shlex
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra.backends.slurm_script import (
    SRUN_EXPORT_ARGS,
    parse_job_id,
    pattern_literal,
    render_sbatch,
    sbatch_export_args,
)
from automodel_hydra.plan import SubmitError
from tests.conftest import WEIRD_NAME

GOLDEN = Path(__file__).parent / "golden" / "render_sbatch.sh"
RECORD_COMMAND = "python -m tests.test_slurm_script > tests/golden/render_sbatch.sh"


def golden_script() -> str:
    """A two-node array job as the Slurm backend plans one: every kind of directive, in the order given."""
    return render_sbatch(
        directives=[
            ("job-name", "llm_finetune"), ("nodes", 2), ("ntasks-per-node", 8), ("gpus-per-node", 8),
            ("cpus-per-task", 12), ("mem", "512G"), ("time", 240), ("signal", "USR2@300"), ("requeue", True),
            ("array", "0-9%4"), ("output", "/scratch/sweep/slurm/%A_%a_0.out"), ("open-mode", "append"),
            ("partition", "batch"), ("account", "my_account"), ("constraint", "h100|a100"),
            ("comment", 'lr sweep "v2" # 10 points'),
        ],
        setup=["export PYTHONPATH=/src/automodel-hydra",
               'export AUTOMODEL_JOB_DIR="${job_dirs[$SLURM_ARRAY_TASK_ID]}"'],
        srun_args=["--kill-on-bad-exit=1", *SRUN_EXPORT_ARGS, "--output", "/scratch/sweep/slurm/%A_%a_%t.out"],
        command='python -u -m automodel_hydra.worker "$AUTOMODEL_JOB_DIR"/launch/job.yaml',
    )


def sbatch_argument(line: str) -> list[str]:
    """The arguments sbatch reads from one ``#SBATCH`` line: a model of ``_get_argument`` in Slurm's
    ``src/sbatch/opt.c`` (a backslash escapes the next character even inside quotes; ' and " group; an unquoted
    # starts a comment)."""
    rest, args = line[len("#SBATCH"):], tp.cast(list[str], [])
    while rest.strip():
        rest = rest.lstrip()
        out, quote, escape, i = "", "", False, 0
        while i < len(rest) and (quote or not rest[i].isspace()):
            c = rest[i]
            i += 1
            if escape:
                escape = False
            elif c == "\\":
                escape = True
                continue
            elif quote:
                if c == quote:
                    quote = ""
                    continue
            elif c in "\"'":
                quote = c
                continue
            elif c == "#":
                return args + ([out] if out else [])
            out += c
        assert not quote, f"unmatched quote in {line!r}"
        args.append(out)
        rest = rest[i:]
    return args


def directive(text: str, name: str) -> str:
    """The value sbatch reads for ``--name`` in a rendered script."""
    for line in text.splitlines():
        if line.startswith(f"#SBATCH --{name}"):
            (arg,) = sbatch_argument(line)
            return arg.split("=", 1)[1] if "=" in arg else ""
    raise AssertionError(f"no --{name} in {text}")


def test_golden_render_sbatch() -> None:
    text = golden_script()
    if not GOLDEN.exists():
        pytest.fail(f"{GOLDEN} is missing. Review this script, then record it with `{RECORD_COMMAND}`:\n{text}")
    expected = GOLDEN.read_text()
    if text != expected:
        diff = "\n".join(difflib.unified_diff(expected.splitlines(), text.splitlines(), "golden", "rendered",
                                              lineterm=""))
        pytest.fail(f"render_sbatch differs from {GOLDEN}:\n{diff}\nIf the change is intended, review it and "
                    f"record it again with `{RECORD_COMMAND}`")


def test_directives_keep_their_order_and_flags_are_bare() -> None:
    text = render_sbatch(directives=[("time", 5), ("requeue", True), ("job-name", "a")], setup=[], srun_args=[],
                         command="true")
    assert [line for line in text.splitlines() if line.startswith("#SBATCH")] == [
        "#SBATCH --time=5", "#SBATCH --requeue", "#SBATCH --job-name=a"]
    assert text.startswith("#!/bin/bash\n#SBATCH --time=5\n") and text.endswith("\nsrun true\n")


@pytest.mark.parametrize("value", [
    WEIRD_NAME.replace("\n", " "), "a\\b", 'x"y', "x'y", "#hash", "tab\there", "  lead", "trail  ", "%j\\%x",
    "ünïcode ∑", 'a\\"b', "a'\"'b",
])
def test_every_value_reaches_sbatch_whole(value: str) -> None:
    text = render_sbatch(directives=[("comment", value)], setup=[], srun_args=[], command="true")
    assert directive(text, "comment") == value


def test_percent_stays_a_filename_pattern_and_pattern_literal_escapes_it() -> None:
    text = render_sbatch(directives=[("output", pattern_literal("/runs/100%") + "/slurm/%A_%a.out")], setup=[],
                         srun_args=[], command="true")
    assert directive(text, "output") == "/runs/100%%/slurm/%A_%a.out"
    assert pattern_literal("/a/%j/b") == "/a/%%j/b"


@pytest.mark.parametrize("bad", ["a\nb", "a\rb", "a\0b"])
def test_a_line_break_in_a_value_is_refused_naming_the_option(bad: str) -> None:
    with pytest.raises(ValueError, match=r"^sbatch option --comment=.*one option per line") as e:
        render_sbatch(directives=[("job-name", "ok"), ("comment", bad)], setup=[], srun_args=[], command="true")
    assert "\n" not in str(e.value)


def test_weird_run_dir_with_a_newline_cannot_be_an_output_path(weird_path: Path) -> None:
    with pytest.raises(ValueError, match="sbatch option --output="):
        render_sbatch(directives=[("output", f"{weird_path}/%j.out")], setup=[], srun_args=[], command="true")


@pytest.mark.parametrize("name", ["output", "error", "input"])
def test_a_backslash_in_a_filename_pattern_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=rf"--{name}=.*cannot contain a backslash.*'/runs/ab/%j.out'"):
        render_sbatch(directives=[(name, "/runs/a\\b/%j.out")], setup=[], srun_args=[], command="true")


@pytest.mark.parametrize("args", [["--output", "/a\\b/%t.out"], ["--error=/a\\b/%t.err"]])
def test_a_backslash_in_an_srun_filename_pattern_is_refused(args: list[str]) -> None:
    with pytest.raises(ValueError, match=r"^srun --(output|error)=.*backslash"):
        render_sbatch(directives=[], setup=[], srun_args=args, command="true")


@pytest.mark.parametrize("directives, message", [
    ([("--time", 5)], "not a long option name"),
    ([("Time", 5)], "not a long option name"),
    ([("time", 5), ("time", 6)], "--time is given twice"),
    ([("account", None)], "--account: None is not a value"),
    ([("requeue", False)], "--requeue: False is not a value"),
    ([("account", "")], "--account: empty value"),
])
def test_bad_directives_are_refused_naming_the_option(directives: list[tuple[str, object]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        render_sbatch(directives=directives, setup=[], srun_args=[], command="true")


def test_bash_runs_the_srun_line_with_weird_arguments_intact(tmp_path: Path, weird_path: Path) -> None:
    """The srun line is bash: srun arguments and the command's own quoting survive a real bash run."""
    (tmp_path / "bin").mkdir()
    record = tmp_path / "argv"
    fake = tmp_path / "bin" / "srun"
    fake.write_text(f"#!{sys.executable}\nimport sys, json\n"
                    f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    text = render_sbatch(directives=[("job-name", "w")], setup=[f"cd {shlex.quote(str(weird_path))}"],
                         srun_args=["--output", f"{tmp_path}/%t.out", f"--comment={weird_path}"],
                         command=f"echo {shlex.quote(str(weird_path))}")
    script = tmp_path / "job.sh"
    script.write_text(text)
    subprocess.run(["bash", str(script)], check=True, cwd=tmp_path,
                   env={**os.environ, "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}"})
    import json

    assert json.loads(record.read_text()) == ["--output", f"{tmp_path}/%t.out", f"--comment={weird_path}", "echo",
                                              str(weird_path)]
    assert not list(tmp_path.glob("MARK*")) and not list(weird_path.glob("MARK*")), "a name was run as code"


@pytest.mark.parametrize("stdout, job_id", [("123", "123"), ("123\n", "123"), ("4567;cluster\n", "4567"),
                                            (" 89 \n", "89")])
def test_parse_job_id(stdout: str, job_id: str) -> None:
    assert parse_job_id(stdout) == job_id


@pytest.mark.parametrize("stdout", ["", "\n", "Submitted batch job 123\n", "abc", "12 34", "123;", "123\n456\n"])
def test_parse_job_id_quotes_what_it_could_not_read(stdout: str) -> None:
    with pytest.raises(SubmitError) as e:
        parse_job_id(stdout)
    assert repr(stdout) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("site, names, args", [
    (None, ["HF_TOKEN"], []),  # sbatch's default, ALL: every variable reaches the job
    ("ALL", ["HF_TOKEN"], []),
    ("ALL,FOO=1", ["HF_TOKEN"], []),
    ("NONE", [], []),  # nothing referenced: the script exports all it needs
    ("NONE", ["HF_TOKEN", "WANDB_API_KEY"], ["--export=HF_TOKEN,WANDB_API_KEY"]),
    ("none", ["HF_TOKEN"], ["--export=HF_TOKEN"]),
    ("PATH,HOME", ["HF_TOKEN", "HOME"], ["--export=PATH,HOME,HF_TOKEN"]),  # the site's list stands, ours added
    ("LANG=C", ["HF_TOKEN", "HF_TOKEN"], ["--export=LANG=C,HF_TOKEN"]),
])
def test_sbatch_export_args(site: str | None, names: list[str], args: list[str]) -> None:
    environ = {"HF_TOKEN": "hf_secret_value"} | ({"SBATCH_EXPORT": site} if site is not None else {})
    assert sbatch_export_args(environ, names) == args
    assert not any("hf_secret_value" in a for a in args), "a value went onto the command line"


def test_sbatch_export_args_refuses_a_bad_name() -> None:
    with pytest.raises(ValueError, match=r"--export: 'HF-TOKEN' is not an environment variable name"):
        sbatch_export_args({"SBATCH_EXPORT": "NONE"}, ["HF-TOKEN"])


if __name__ == "__main__":  # print the golden script, for review and recording
    sys.stdout.write(golden_script())


def test_an_sbatch_input_variable_of_a_planned_option_is_named_and_one_of_another_option_kept() -> None:
    """sbatch(1): an ``SBATCH_*`` variable beats the script's ``#SBATCH`` line. Those of options the script sets
    (and of the ones every plan decides: no array for one job, no --wait, stderr with --output) are named for
    dropping; a site's variable of an option the script leaves alone (``SBATCH_ACCOUNT``, ``SBATCH_RESERVATION``)
    is not, nor a variable that is no input of sbatch."""
    from automodel_hydra.backends.slurm_script import SBATCH_INPUT_VARS, overridden

    script = render_sbatch(directives=[("job-name", "mine"), ("time", 240), ("partition", "debug"), ("mem", "4G"),
                                       ("requeue", True), ("output", "/r/slurm/%j.out")],
                           setup=[], srun_args=[], command="true")
    names = ["SBATCH_PARTITION", "SBATCH_TIMELIMIT", "SBATCH_JOB_NAME", "SBATCH_ACCOUNT", "SBATCH_RESERVATION",
             "SBATCH_MEM_PER_CPU", "SBATCH_NO_REQUEUE", "SBATCH_ARRAY_INX", "SBATCH_WAIT", "SBATCH_ERROR",
             "SBATCH_EXPORT", "SBATCH_NOT_A_VARIABLE", "PATH"]
    assert dict(overridden(script, names)) == {
        "SBATCH_ARRAY_INX": "array", "SBATCH_ERROR": "error", "SBATCH_JOB_NAME": "job-name",
        "SBATCH_MEM_PER_CPU": "mem", "SBATCH_NO_REQUEUE": "requeue", "SBATCH_PARTITION": "partition",
        "SBATCH_TIMELIMIT": "time", "SBATCH_WAIT": "wait"}
    assert "SBATCH_EXPORT" not in SBATCH_INPUT_VARS and all(v.startswith("SBATCH_") for v in SBATCH_INPUT_VARS)
