"""Every common mistake, typed as a user types it: ``python train.py launcher=L <override> dry_run=true``.

Each case must exit non-zero with the field's name in the output (no traceback), start and submit nothing, and
leave what an earlier run wrote in the run dir as it was (a sentinel, a complete checkpoint and its pointer,
metrics, the earlier plan). Single-field ConfigErrors through ``config.load`` are in test_configs.py; these are
end to end. The subprocesses run a few at a time in one module fixture (each ~1 s, most of it Python start-up).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT

#: What an earlier run left in the run dir; every file must be byte-for-byte the same after a rejected run.
PREVIOUS = {
    "sentinel.txt": "written by an earlier run\n",
    "metrics.jsonl": "".join(f'{{"step": {s}, "loss": 1.0}}\n' for s in range(1, 6)),
    "checkpoints/latest": "step-5\n",
    "checkpoints/step-5/.metadata": "dcp metadata stand-in",
    "checkpoints/step-5/__0_0.distcp": "dcp shard stand-in",
    "checkpoints/step-5/.complete": "5\n",
    "launch/job.yaml": "# the earlier run's job file\n",
    "launch/torchrun.sh": "# the earlier run's plan\n",
}
#: What a rejected run may add: Hydra writes its config dumps and opens the job log before our code runs.
HYDRA_OWN = (".hydra", "train.log")

MISSING = "/nonexistent/automodel-hydra-test"


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]
    field: str  # must appear in the output
    ok: bool = False  # accepted (with a warning)
    expect: str | None = None  # more text the output must hold


def _cases() -> list[Case]:
    cases = [
        Case("slurm.nodes=0", ("launcher=slurm", "slurm.nodes=0"), "slurm.nodes"),
        Case("failure_budget.crash=-1", ("launcher=slurm", "failure_budget.crash=-1"), "failure_budget.crash",
             expect="an integer >= 0"),
        Case("failure_budget.oom=two", ("failure_budget.oom=two",), "failure_budget.oom",
             expect="is invalid: expected an integer"),
        Case("health_check.timeout_s=0", ("launcher=slurm", "health_check.timeout_s=0"), "health_check.timeout_s",
             expect="must be > 0"),
        Case("health_check.enabled=maybe", ("health_check.enabled=maybe",), "health_check.enabled"),
        Case("slurm.ntasks_per_node=-1", ("launcher=slurm", "slurm.ntasks_per_node=-1"), "slurm.ntasks_per_node"),
        Case("slurm.time=abc", ("launcher=slurm", "slurm.time=abc"), "slurm.time"),
        Case("slurm.time=-5", ("launcher=slurm", "slurm.time=-5"), "slurm.time"),
        Case("slurm.master_port=70000", ("launcher=slurm", "slurm.master_port=70000"), "slurm.master_port"),
        Case("mount-source-missing", ("launcher=slurm", "slurm.container_image=img",
                                      f"slurm.extra_mounts=[{{source:{MISSING},dest:/data}}]"),
             "slurm.extra_mounts[0].source", expect=MISSING),
        Case("launcher-field-unset-variable", ("launcher=slurm", "slurm.hf_home=${AUTOMODEL_TEST_UNSET_VARIABLE}/hub"),
             "slurm.hf_home", expect="${AUTOMODEL_TEST_UNSET_VARIABLE}, which is not set"),
        Case("token-field-unset", ("launcher=slurm", "++slurm.hf_token=${AUTOMODEL_TEST_UNSET_VARIABLE}"),
             "slurm.hf_token refers to", expect="${AUTOMODEL_TEST_UNSET_VARIABLE}, which is not set"),
        Case("env-var-reference-unset", ("launcher=slurm", "++slurm.env_vars.TOKEN=${AUTOMODEL_TEST_UNSET_VARIABLE}"),
             "slurm.env_vars.TOKEN", expect="AUTOMODEL_TEST_UNSET_VARIABLE"),
        Case("mount-source-relative", ("launcher=slurm", "slurm.extra_mounts=[{source:data,dest:/data}]"),
             "slurm.extra_mounts[0].source", expect="absolute"),
        Case("mount-dest-relative", ("launcher=slurm", "slurm.extra_mounts=[{source:/tmp,dest:data}]"),
             "slurm.extra_mounts[0].dest", expect="absolute"),
        Case("mount-string-dest-relative", ("launcher=slurm", "slurm.extra_mounts=['/tmp:/data','/tmp:data']"),
             "slurm.extra_mounts[1].dest"),
        Case("slurm.nodez", ("launcher=slurm", "slurm.nodez=3"), "slurm.nodez"),
        Case("slurm.job_name-newline", ("launcher=slurm", "slurm.job_name='llm\ntouch PWNED'"), "slurm.job_name",
             expect="one option per line"),
        Case("interactive.nproc_per_node=0", ("launcher=interactive", "interactive.nproc_per_node=0"),
             "interactive.nproc_per_node"),
        Case("skypilot.use_spot=maybe", ("launcher=skypilot", "skypilot.use_spot=maybe"), "skypilot.use_spot"),
        Case("skypilot.max_requeues", ("launcher=skypilot", "++skypilot.max_requeues=2"), "skypilot.max_requeues",
             expect="Slurm"),
        Case("interactive.max_requeues", ("launcher=interactive", "++interactive.max_requeues=2"),
             "interactive.max_requeues", expect="Slurm"),
        Case("interactive.requeue", ("launcher=interactive", "++interactive.requeue=true"), "interactive.requeue"),
    ]
    for launcher in ("interactive", "slurm", "skypilot"):  # recipe fields: rejected whatever the launcher
        cases += [
            Case(f"{launcher}:checkpoint_interval=0", (f"launcher={launcher}", "step_scheduler.checkpoint_interval=0"),
                 "step_scheduler.checkpoint_interval"),
            Case(f"{launcher}:restore_from-nowhere", (f"launcher={launcher}", f"restore_from.path={MISSING}/step-9"),
                 "restore_from.path", expect=MISSING),
        ]
    cases += [
        Case("checkpoint.restore_from-nowhere", ("checkpoint.restore_from=@RUN@/checkpoints/step-99",),
             "restore_from", expect="step-99"),
        # found before any rank starts (not at the first save, after the training steps)
        Case("checkpoint.dir-unwritable", ("checkpoint.dir=/proc/automodel-hydra-ckpt",), "checkpoint.dir",
             expect="could not write there: /proc is not writable"),
        Case("checkpoint.dir-under-a-file", ("checkpoint.dir=@RUN@/sentinel.txt/ckpt",), "checkpoint.dir",
             expect="sentinel.txt is not a directory"),
        Case("slurm:checkpoint.dir-in-job-dir-under-a-file", ("launcher=slurm", "checkpoint.dir=sentinel.txt/ckpt"),
             "checkpoint.dir", expect="sentinel.txt is not a directory"),
        Case("restore_from-holds-no-checkpoint", ("restore_from.path=@RUN@/launch",), "restore_from.path",
             expect="it holds no checkpoint (no .metadata)"),
        Case("restore_from-the-checkpoint-dir", ("restore_from.path=@RUN@/checkpoints",), "restore_from.path",
             expect="/checkpoints/step-5)"),
        # a bare variable name is a literal: accepted, with a warning that shows the reference syntax
        Case("slurm-HF_TOKEN-bare", ("launcher=slurm", "++slurm.env_vars.HF_TOKEN=HF_TOKEN"),
             "slurm.env_vars.HF_TOKEN", ok=True, expect="${HF_TOKEN}"),
        Case("skypilot-HF_TOKEN-bare", ("launcher=skypilot", "++skypilot.env_vars.HF_TOKEN=HF_TOKEN"),
             "skypilot.env_vars.HF_TOKEN", ok=True, expect="${HF_TOKEN}"),
        # a plain AutoModel-style config (no defaults list, no launcher group): its sections choose the launcher
        Case("automodel-both-sections", ("--config-dir", "@CONF@", "--config-name", "both", "++dry_run=true"),
             "slurm/skypilot", expect="skypilot"),
        Case("automodel-slurm-only", ("--config-dir", "@CONF@", "--config-name", "slurm_only", "++dry_run=true"),
             "sbatch.sh", ok=True, expect="#SBATCH --nodes=1"),
    ]
    return cases


CASES = _cases()

AUTOMODEL_SLURM = """\
# AutoModel style: what NeMo AutoModel users write (no Hydra defaults list)
step_scheduler:
  max_steps: 10
  ckpt_every_steps: 5
slurm:
  job_name: ft
  nodes: 1
  ntasks_per_node: 2
  time: "01:00:00"
  env_vars:
    HF_TOKEN: ${HF_TOKEN}
"""
AUTOMODEL_SKYPILOT = """\
skypilot:
  cloud: aws
  accelerators: "H100:8"
"""


def prepare_run_dir(run: Path) -> None:
    for name, text in PREVIOUS.items():
        (run / name).parent.mkdir(parents=True, exist_ok=True)
        (run / name).write_text(text)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HYDRA_FULL_ERROR", "SKYPILOT_"))}
    env.setdefault("HF_TOKEN", "hf_bad_input_test")  # the AutoModel-style file refers to it
    return env


def _run(case: Case, base: Path) -> tuple[Path, subprocess.CompletedProcess[str]]:
    run = base / case.id.replace(":", "_").replace("=", "_").replace("<", "_")
    prepare_run_dir(run)
    args = [a.replace("@RUN@", str(run)).replace("@CONF@", str(base / "conf")) for a in case.args]
    if "++dry_run=true" not in args:  # plain AutoModel configs have no dry_run key: they add it
        args.append("dry_run=true")
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args, f"hydra.run.dir={run}"], cwd=base,
                          env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    return run, proc


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess[str]]]:
    base = tmp_path_factory.mktemp("bad_input")
    (base / "conf").mkdir()
    (base / "conf" / "slurm_only.yaml").write_text(AUTOMODEL_SLURM)
    (base / "conf" / "both.yaml").write_text(AUTOMODEL_SLURM + AUTOMODEL_SKYPILOT)
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        futures = {c.id: pool.submit(_run, c, base) for c in CASES}
        return {k: f.result() for k, f in futures.items()}


def _snapshot(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in run.rglob("*") if p.is_file()}


@pytest.mark.slow  # runs train.py or a script as a real process
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_rejected_naming_the_field_and_nothing_is_lost(case: Case, results) -> None:
    run, proc = results[case.id]
    out = proc.stdout
    assert case.field in out, f"{case.field!r} not named in the output of {case.args}:\n{out[-3000:]}"
    if case.expect:
        assert case.expect in out, out[-3000:]
    assert "Traceback" not in out, f"a traceback instead of a one-line error:\n{out[-3000:]}"
    if case.ok:
        assert proc.returncode == 0, out[-3000:]
        assert "nothing was submitted or started" in out
        return
    assert proc.returncode != 0, f"{case.args} was accepted:\n{out[-3000:]}"
    # nothing started or submitted: no process id, no submission record, no metrics beyond the earlier ones
    assert not (run / "launch" / "pid").exists() and not (run / "launch" / "submission.json").exists()
    assert not (run / "result.json").exists()
    # what the earlier run wrote is intact, and nothing but Hydra's own files was added
    after = _snapshot(run)
    for name, text in PREVIOUS.items():
        assert after.get(name) == text.encode(), f"{name} was changed or removed by a rejected run"
    added = {n for n in after if n not in PREVIOUS and not n.startswith(HYDRA_OWN)}
    assert not added, f"a rejected run wrote {sorted(added)}"


@pytest.mark.slow  # runs train.py or a script as a real process
def test_bare_variable_name_is_passed_literally(results) -> None:
    run, proc = results["slurm-HF_TOKEN-bare"]
    assert "export HF_TOKEN=HF_TOKEN" in (run / "launch" / "sbatch.sh").read_text()
    run, proc = results["skypilot-HF_TOKEN-bare"]
    assert "HF_TOKEN: HF_TOKEN" in (run / "launch" / "sky_task.yaml").read_text()


@pytest.mark.slow  # runs train.py or a script as a real process
def test_automodel_style_config_routes_by_its_section(results) -> None:
    run, proc = results["automodel-slurm-only"]
    script = (run / "launch" / "sbatch.sh").read_text()
    assert "#SBATCH --ntasks-per-node=2" in script
    assert 'export HF_TOKEN="${HF_TOKEN}"' in script  # the AutoModel "${VAR}" syntax stays a reference
    assert "checkpoint_interval: 5" in (run / "launch" / "job.yaml").read_text()  # ckpt_every_steps alias


@pytest.mark.slow  # runs train.py or a script as a real process
def test_automodel_style_config_submits_without_a_dry_run_key(tmp_path: Path) -> None:
    """A plain AutoModel config has no ``dry_run`` key; a real submission must not trip over it (fixed in
    driver.run). ``sbatch`` is a stand-in that records its argument and prints a job id."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "slurm_only.yaml").write_text(AUTOMODEL_SLURM)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # as `sbatch --parsable SCRIPT` answers: the job id alone
    (bin_dir / "sbatch").write_text(f'#!/bin/sh\nfor a; do f=$a; done\necho "$f" > {tmp_path}/sbatch.args\necho 4242\n')
    (bin_dir / "sbatch").chmod(0o755)
    run = tmp_path / "R"
    env = {**_env(), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(tmp_path / "conf"),
                           "--config-name", "slurm_only", f"hydra.run.dir={run}"], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "submitted slurm job 4242" in proc.stdout
    assert (tmp_path / "sbatch.args").read_text().strip() == str(run / "launch" / "sbatch.sh")


#: Bad inputs submitted for real (no dry run) to the project's Slurm cluster: nothing may reach the queue.
REAL_SLURM = ["slurm.nodes=0", "slurm.time=abc", "slurm.hf_home=${AUTOMODEL_TEST_UNSET_VARIABLE}",
              f"restore_from.path={MISSING}", "slurm.nodez=3"]


@pytest.mark.slurm
@pytest.mark.slow
def test_bad_input_submits_nothing_to_a_real_cluster(slurm_cluster, tmp_path: Path) -> None:
    name = f"bad-{secrets.token_hex(4)}"
    procs = [subprocess.Popen([sys.executable, str(ROOT / "train.py"), "launcher=slurm", "slurm.partition=debug",
                               "slurm.gpus_per_node=0", f"slurm.job_name={name}", bad,
                               f"hydra.run.dir={tmp_path / str(i)}"],
                              env=_env(), cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, bad in enumerate(REAL_SLURM)]
    for bad, p in zip(REAL_SLURM, procs):
        out = p.communicate(timeout=120)[0]
        assert p.returncode != 0 and bad.split("=")[0] in out, out[-2000:]
        assert "submitted" not in out
    assert slurm_cluster.run("squeue", "-h", f"--name={name}").stdout == ""
    assert slurm_cluster.run("sacct", "-n", "-X", f"--name={name}").stdout.strip() == ""
