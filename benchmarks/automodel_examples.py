"""Dry-run every NeMo AutoModel example file with automodel-hydra and count what plans (the whole-file count).

    .venv/bin/python benchmarks/automodel_examples.py --git-dir AUTOMODEL.git   # HEAD and the last Slurm-era commit
    .venv/bin/python benchmarks/automodel_examples.py --examples CHECKOUT        # a work tree that has examples/
    ... --ref v0.3.0 --variants plain,slurm --only llm_finetune --json out.json --keep --exec

Not a test: it needs AutoModel's source tree (a clone, or a bare git dir), and the real ``nemo_automodel`` package
in this environment (``EXTRAS=test,automodel,skypilot scripts/setup``; the SkyPilot variants also need
``.venv-sky``). Run it under the machine's shared lock when others are testing (``flock LOCK python ...``).

Method
------
1. **The files.** With ``--git-dir``, each ``--ref`` is exported with ``git archive REF examples`` into a temporary
   dir. The default refs are ``HEAD`` and ``last-slurm``: the parent of the commit that deleted
   ``nemo_automodel/components/launcher/slurm`` (found with ``git log --diff-filter=D``), the last AutoModel whose
   CLI had its Slurm launcher and whose examples have no ``recipe:`` line. Every ``examples/**.yaml`` is a case.
2. **The command.** What an AutoModel user of that tree typed, through ``automodel-hydra``'s own CLI parsing
   (:func:`automodel_hydra.argv.from_automodel_cli`): ``automodel-hydra FILE.yaml`` when the file has a top-level
   ``recipe:`` line; otherwise AutoModel's older form ``automodel-hydra <command> <domain> -c FILE.yaml`` with the
   words its example dir stands for (:data:`OLD_COMMANDS`: ``llm_finetune`` -> ``finetune llm`` ...); a file in
   a dir no older command served (diffusion, retrieval ...) is run as ``FILE.yaml`` and its answer counted too.
3. **The model.** Every ``pretrained_model_name_or_path`` key the file has (``model``, ``model.config``,
   ``processor``, ``dataset.tokenizer``, ``teacher_model`` ...) is overridden on the command line with AutoModel's
   ``--KEY=DIR`` form, ``DIR`` a tiny local Llama with its tokenizer (``tests/automodel_assets.make_tiny_llama``,
   made once, no network), and the Hub is offline (``HF_HUB_OFFLINE=1``): plan time checks that each model can be
   fetched, and a Hub id would be refused here for want of a cache, not for anything in the file. Nothing else
   is overridden: dataset names and tokenizer options are only read by the ranks, never at plan time. The file
   itself is never changed; ``dry_run=true`` is added.
4. **The variants** (``--variants``):

   * ``plain``: the file as it is (no launcher section: torchrun on this machine), with AutoModel's
     ``--nproc-per-node 8`` (``--nproc``): the world size the examples are written for, one 8-GPU node as in the
     ``slurm:`` block, so their parallelism sizes are checked against it and not against this machine's cores;
   * ``slurm``: the file plus AutoModel's documented ``slurm:`` block (:data:`SLURM_BLOCK`, from its
     ``docs/launcher/cluster.md``; ``extra_mounts`` names a dir made here, because a mount source must exist);
   * ``skypilot``: the file with ``launcher=skypilot`` on the command line (the form the README shows for
     ``train.py``);
   * ``sky-block``: the file plus AutoModel's documented ``skypilot:`` block (:data:`SKYPILOT_BLOCK`, from its
     ``docs/launcher/skypilot.mdx``; ``HF_TOKEN`` is set to a placeholder, never a token).

   A block is appended to a copy of the file written beside it (so relative paths in the file still resolve); a
   file that already has that section is run as it is.
5. **Running.** Each case is ``automodel-hydra ARGS`` in a fresh working dir, in a child process. By default the
   child is forked from a parent that has already imported this project, Hydra and AutoModel's loader (a
   fork-server: each case still runs in its own process, from the same entry point as the console script, minus
   the ``exec``); ``--exec`` runs the installed console script instead (slower: every case re-imports torch and
   AutoModel). At most ``--workers`` children run at once (default 2).
6. **Classes.** ``plans``: exit 0 and the dry run's ``dry run:`` line. ``needs-gpu``: the same, plus the dry run's
   warning that the AutoModel recipe needs a GPU host (torchrun here, no CUDA in this environment: a real run is
   refused with that line); the tables count it among the plans and note how many. ``crash``: a Python traceback or the
   driver's "unexpected error ... a bug" line (a bug of ours or of a library: each is listed with its file).
   ``timeout``: past ``--timeout``. ``refused``: any other exit, with its one line (the last ``error:`` line, or
   the last line printed). Refusals are grouped by their first ``--words`` words after paths, numbers and quoted
   values are made generic, and each group is labelled with the open gap its words belong to (:data:`GAPS`;
   ``-`` when none).

Output: a table per tree (rows: the example dir; columns: the variants, ``plans/files``), then the top reasons per
variant, then every crash. ``--json FILE`` writes every case (command, class, reason, seconds).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing as tp
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: AutoModel's older CLI words (``automodel <command> <domain> -c FILE``) for a file without ``recipe:``, by the
#: example dir the file lives in (``examples/<dir>/...``): what that dir's README and file headers told users
#: to type. A dir not named here had no command in that CLI.
OLD_COMMANDS = {
    "llm_finetune": ("finetune", "llm"),
    "vlm_finetune": ("finetune", "vlm"),
    "llm_pretrain": ("pretrain", "llm"),
    "llm_kd": ("kd", "llm"),
    "vlm_kd": ("kd", "vlm"),
    "benchmark": ("benchmark", "llm"),
    "llm_benchmark": ("benchmark", "llm"),
    "convergence": ("finetune", "llm"),
}

#: AutoModel's documented ``slurm:`` block (its ``docs/launcher/cluster.md`` of the Slurm-era release);
#: ``{mount}`` is a dir made here (the docs' ``/lustre`` does not exist on this machine).
SLURM_BLOCK = """
slurm:
  job_name: llm-finetune
  nodes: 1
  ntasks_per_node: 8
  time: 00:30:00
  account: your_account
  partition: gpu
  container_image: nvcr.io/nvidia/nemo-automodel:25.11.00
  gpus_per_node: 8
  extra_mounts:
    - {mount}:/lustre
  hf_home: /path/to/your/HF_HOME
"""

#: AutoModel's documented ``skypilot:`` block (its ``docs/launcher/skypilot.mdx``).
SKYPILOT_BLOCK = """
skypilot:
  cloud: gcp
  accelerators: T4:1
  use_spot: true
  disk_size: 100
  num_nodes: 1
  region: us-central1
  job_name: llama3_2_finetune
  hf_token: ${HF_TOKEN}
"""

VARIANTS = ("plain", "slurm", "skypilot", "sky-block")
#: The section each block variant adds (a file that has it already is run unchanged).
BLOCKS = {"slurm": ("slurm", SLURM_BLOCK), "sky-block": ("skypilot", SKYPILOT_BLOCK)}
OTHER = {"slurm": "skypilot", "skypilot": "slurm"}

#: The open gaps of AutoModel support a refusal or crash belongs to, tried in order on its line: (label, regex).
#: ``correct`` labels answers AutoModel itself would give at that world size (its device mesh, its step
#: scheduler); a reason that matches none is a new kind, shown as ``-``.
GAPS: tuple[tuple[str, str], ...] = (
    ("7 launcher=skypilot", r"Could not override 'launcher'|launcher=skypilot: no such|No match in the defaults list"
                            r"|launcher.*not in defaults|To append to your default list"),
    ("10 restore_from latest", r"restore_from|/checkpoints/latest|\blatest\b"),
    # a local model or dataset path the nodes or the container cannot have (automodel_hydra.paths.local_reads)
    ("correct: local path", r"is invalid: an absolute path on|is invalid: a file or dir that exists on this machine"),
    ("1 SkyPilot", r"KeyError: 'checkpoint'|skypilot|SkyPilot|sky\b|checkpoint\.dir"),
    ("2 containers", r"container_image|container image|nemo_mount|pyxis|enroot"),
    ("4 nemo_run", r"nemo_run"),
    ("8 nsys", r"nsys"),
    ("6 plan-time imports", r"ImportError|ModuleNotFoundError|No module named|cannot import|importing module"
                            r"|_target_|active drivers"),
    ("correct: world size", r"global_batch_size|local_batch_size|dp_size|tp_size|cp_size|pp_size|device mesh"),
    ("no AutoModel CLI command", r"names no recipe:"),
)

#: The driver's line for an exception that is not the user's mistake (``driver.BUG_LINE``).
BUG_MARK = "an unexpected error, not a mistake in the config"
TRACEBACK = "Traceback (most recent call last)"
#: In the dry run's warning for an AutoModel recipe planned for torchrun on a host without CUDA
#: (``automodel_hydra.automodel.recipe.NEEDS_GPU_HOST``; a real run is refused with it).
NEEDS_GPU_HOST = "needs a GPU host"


@dataclasses.dataclass
class Case:
    tree: str  # the tree's label (a ref)
    rel: str  # the file, relative to the tree (examples/...)
    group: str  # examples/<group>/...
    variant: str
    argv: list[str]  # automodel-hydra's arguments
    file: str = ""  # the file run (a block variant's copy)
    recipe: str = ""  # the recipe the older CLI's command adds ("" when the file names its own)
    model_keys: list[str] = dataclasses.field(default_factory=list)
    cls: str = ""  # plans | refused | crash | timeout
    reason: str = ""
    seconds: float = 0.0
    log: str = ""
    altered: str = ""  # a plan whose rank file gives the recipe other sections than the file's: what differs


# ----------------------------------------------------------------------------------------------- the files


def git(git_dir: Path, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", str(git_dir), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def resolve_ref(git_dir: Path, ref: str) -> str:
    """A commit id for ``ref``; ``last-slurm`` is the parent of the commit that deleted AutoModel's Slurm launcher
    (``nemo_automodel/components/launcher/slurm``). Raises SystemExit naming the ref when it does not resolve."""
    if ref == "last-slurm":
        gone = git(git_dir, "log", "-1", "--format=%H", "--diff-filter=D", "HEAD", "--",
                   "nemo_automodel/components/launcher/slurm")
        if not gone:
            raise SystemExit("last-slurm: this repository's history never deleted "
                             "nemo_automodel/components/launcher/slurm; name a ref with --ref")
        ref = gone + "^"
    try:
        return git(git_dir, "rev-parse", "--verify", ref + "^{commit}")
    except subprocess.CalledProcessError:
        raise SystemExit(f"--ref {ref}: not a commit of {git_dir}") from None


def export(git_dir: Path, commit: str, dest: Path) -> Path:
    """``git archive COMMIT examples`` unpacked into ``dest``; returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", commit, "examples"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def model_keys(data: tp.Any, prefix: str = "") -> list[str]:
    """Dotted keys of every ``pretrained_model_name_or_path`` in a loaded YAML mapping (lists are not entered:
    AutoModel's examples have none there, and a list item has no ``--KEY=`` form)."""
    found: list[str] = []
    if isinstance(data, dict):
        for k, v in data.items():
            key = f"{prefix}.{k}" if prefix else str(k)
            if k == "pretrained_model_name_or_path" and isinstance(v, str):
                found.append(key)
            else:
                found += model_keys(v, key)
    return found


def cases(tree: str, root: Path, variants: tp.Sequence[str], model: Path, mount: Path,
          only: str | None, nproc: int = 8) -> list[Case]:
    """Every ``root/examples/**.yaml`` x ``variants`` as a :class:`Case` (module docstring, steps 2-4); the block
    variants' copies are written beside each file."""
    import yaml

    out = []
    for file in sorted((root / "examples").rglob("*.yaml")):
        rel = file.relative_to(root).as_posix()
        if only and not re.search(only, rel):
            continue
        if ".amcount-" in file.name:
            continue
        text = file.read_text()
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            data = None
        data = data if isinstance(data, dict) else {}
        group = rel.split("/")[1] if rel.count("/") > 1 else "."
        overrides = [f"--{k}={model}" for k in model_keys(data)] + ["dry_run=true"]
        for variant in variants:
            target, extra = file, []
            if variant in BLOCKS:
                section, block = BLOCKS[variant]
                if OTHER[section] in data:  # both launchers: not a file anyone writes
                    continue
                if section not in data:
                    target = file.with_name(f"{file.stem}.amcount-{variant}.yaml")
                    target.write_text(text.rstrip("\n") + "\n" + block.replace("{mount}", str(mount)))
            elif variant == "skypilot":
                extra = ["launcher=skypilot"]
            elif nproc and "slurm" not in data and "skypilot" not in data:  # plain, no launcher section
                extra = [f"--nproc-per-node={nproc}"]
            recipe = ""
            if "recipe" in data or group not in OLD_COMMANDS:
                head = [str(target)]
            else:
                head = [*OLD_COMMANDS[group], "-c", str(target)]
                from automodel_hydra.argv import COMMAND_RECIPES

                recipe = COMMAND_RECIPES.get(OLD_COMMANDS[group], "")
            out.append(Case(tree, rel, group, variant, [*head, *overrides, *extra], str(target), recipe,
                            model_keys(data)))
    return out


# ----------------------------------------------------------------------------------------------- running


def child_env(work: Path) -> dict[str, str]:
    """The environment of every case: offline Hugging Face (the models are local), one thread, a private HOME and
    TMPDIR under the work dir (SkyPilot writes ``~/.sky``; ``automodel-hydra FILE`` links the file under TMPDIR),
    and a placeholder ``HF_TOKEN`` for the ``sky-block`` variant's ``${HF_TOKEN}``."""
    home, tmp = work / "home", work / "tmp"
    home.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HOME": str(home), "TMPDIR": str(tmp),
            "HF_HOME": str(home / ".cache" / "huggingface"), "HF_TOKEN": "placeholder-not-a-token",
            "PYTHONWARNINGS": "ignore"}


def preload(todo: tp.Sequence[Case]) -> None:
    """Import in the fork-server parent what the cases import at plan time: this project's Hydra app, AutoModel's
    config loader, every recipe the cases name (``recipe:`` or the older CLI's command) and the module of every
    ``_target_`` (failures are left for each case to meet, as a fresh process would)."""
    import importlib
    import warnings

    import yaml

    import automodel_hydra.train  # noqa: F401  (Hydra, the driver, the schema)
    from automodel_hydra import argv as shapes
    from automodel_hydra import quiet, recipes

    quiet.install()
    try:
        import nemo_automodel.components.config.loader  # noqa: F401
    except ImportError:
        print("note: nemo_automodel is not installed here: recipe sections are not checked at plan time",
              file=sys.stderr)
        return
    names: set[str] = set()
    modules: set[str] = set()

    def walk(v: tp.Any) -> None:
        if isinstance(v, dict):
            for k, x in v.items():
                if k == "_target_" and isinstance(x, str) and "." in x:
                    modules.add(x.split(":")[0] if ":" in x else x.rpartition(".")[0])
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)

    for case in {(c.tree, c.rel): c for c in todo}.values():
        file = case.argv[case.argv.index("-c") + 1] if "-c" in case.argv else case.argv[0]
        try:
            data = yaml.safe_load(Path(file).read_text())
        except (OSError, yaml.YAMLError):
            continue
        if isinstance(data, dict):
            if isinstance(data.get("recipe"), str):
                names.add(data["recipe"])
            walk(data)
        if "-c" in case.argv:
            names.add(shapes.COMMAND_RECIPES.get(tuple(case.argv[:2]), ""))  # type: ignore[arg-type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(n for n in names if n):
            with contextlib.suppress(Exception):
                recipes.resolve(name)
        for module in sorted(modules):
            with contextlib.suppress(Exception):
                importlib.import_module(module)


def run_forked(argv: list[str], cwd: Path, log: Path, env: dict[str, str]) -> tp.NoReturn:
    """The child of a fork: ``automodel-hydra ARGV`` as :func:`automodel_hydra.cli.launch_file` runs it, without
    the ``exec`` (the imports are the parent's). Never returns."""
    code = 1
    try:
        os.setsid()
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        tempfile.tempdir = None
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        from automodel_hydra import argv as shapes
        from automodel_hydra import train

        try:
            args = shapes.from_automodel_cli(argv)
        except (FileNotFoundError, shapes.UsageError) as e:
            print(f"error: {e}", file=sys.stderr)
            code = 2
        else:
            sys.argv = [train.__file__, *args]
            try:
                train.cli(train.__file__)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def run_all(todo: list[Case], work: Path, workers: int, timeout: float, exec_mode: bool,
            keep: bool, model: Path) -> None:
    """Run every case, at most ``workers`` at once, filling in its class, reason, time and log path."""
    env = child_env(work)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    running: dict[int, tuple[Case, float, Path, subprocess.Popen[bytes] | None]] = {}
    queue = list(enumerate(todo))
    done = 0
    total = len(todo)
    started = time.monotonic()

    def start(i: int, case: Case) -> None:
        cwd = work / "runs" / str(i)
        cwd.mkdir(parents=True)
        log = logs / f"{i}.log"
        case.log = str(log)
        sys.stdout.flush()
        sys.stderr.flush()
        if exec_mode:
            with open(log, "wb") as f:
                proc = subprocess.Popen([sys.executable, "-m", "automodel_hydra.cli", *case.argv], cwd=cwd,
                                        env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
            running[proc.pid] = (case, time.monotonic(), cwd, proc)
            return
        pid = os.fork()
        if pid == 0:
            run_forked(case.argv, cwd, log, env)
        running[pid] = (case, time.monotonic(), cwd, None)

    while queue or running:
        while queue and len(running) < workers:
            start(*queue.pop(0))
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            now = time.monotonic()
            for p, (case, t0, _, _) in list(running.items()):
                if now - t0 > timeout:
                    with contextlib.suppress(OSError):
                        os.killpg(p, signal.SIGKILL)
                    case.cls, case.reason = "timeout", f"still running after {timeout:.0f} s"
            time.sleep(0.05)
            continue
        if pid not in running:
            continue
        case, t0, cwd, _ = running.pop(pid)
        with contextlib.suppress(OSError):
            os.killpg(pid, signal.SIGKILL)  # whatever the case left behind (a bridge process)
        case.seconds = time.monotonic() - t0
        code = os.waitstatus_to_exitcode(status)
        if case.cls != "timeout":
            case.cls, case.reason = classify(code, Path(case.log).read_text(errors="replace"))
        if case.cls in PLANNED:
            case.altered = alterations(case, cwd, model)
        if not keep:
            shutil.rmtree(cwd, ignore_errors=True)
        done += 1
        if done % 25 == 0 or done == total:
            print(f"  {done}/{total} cases, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------- classes


#: The classes that planned (the tables' ``plans/files`` count both).
PLANNED = ("plans", "needs-gpu")


def classify(code: int, output: str) -> tuple[str, str]:
    """``(class, reason)`` of a finished case from its exit status and output (module docstring, step 6)."""
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    if TRACEBACK in output or BUG_MARK in output:
        return "crash", crash_line(lines)
    if code == 0 and any(ln.startswith("dry run") or "dry run:" in ln for ln in lines):
        gpu = next((ln for ln in lines if NEEDS_GPU_HOST in ln), None)
        return ("needs-gpu", gpu.split("] - ", 1)[-1]) if gpu else ("plans", "")
    errors = [ln for ln in lines if ln.startswith("error: ")]
    if errors:
        return "refused", errors[-1][len("error: "):]
    if code == 0:
        return "refused", "exit 0 without a dry run line: " + (lines[-1] if lines else "(no output)")
    return "refused", lines[-1] if lines else f"exit {code}, no output"


def crash_line(lines: list[str]) -> str:
    """The exception and where it was raised: the last ``Kind: message`` line of the traceback (or the driver's
    bug line), with the innermost frame of this project when there is one."""
    exc = next((ln for ln in reversed(lines) if re.match(r"^[\w.]+(Error|Exception|Interrupt|Exit)\b", ln)
                or BUG_MARK in ln), lines[-1] if lines else "")
    exc = exc.split(" -- " + BUG_MARK)[0].removeprefix("error: ")
    frames = [m.group(1, 2) for ln in lines if (m := re.search(r'File "[^"]*/(automodel_hydra/[^"]+)", line (\d+)',
                                                               ln))]
    return f"{exc} [{frames[-1][0]}:{frames[-1][1]}]" if frames else exc


def alterations(case: Case, cwd: Path, model: Path) -> str:
    """What the recipe would get on the ranks that the file (with the case's overrides) does not say: the planned
    rank file (``launch/job.sky.yaml`` on SkyPilot, else ``launch/job.yaml``) read as a rank reads it
    (:func:`automodel_hydra.config.load_rank`), its recipe sections compared with the file's (both read by
    OmegaConf, as Hydra reads the file). "" when they are the same; else up to three differing dotted keys."""
    from omegaconf import DictConfig, OmegaConf

    from automodel_hydra import config, sections

    files = sorted(cwd.glob("**/launch/job.sky.yaml")) or sorted(cwd.glob("**/launch/job.yaml"))
    if not files:
        return "no launch/job.yaml was written"
    try:
        rank = OmegaConf.load(files[0])
        assert isinstance(rank, DictConfig)
        got = config.load_rank(rank).recipe_sections
        src = OmegaConf.to_container(OmegaConf.load(case.file), resolve=False)
    except Exception as e:
        return f"the rank file does not load: {type(e).__name__}: {' '.join(str(e).split())[:160]}"
    assert isinstance(src, dict)
    for key in case.model_keys:
        node = src
        *path, last = key.split(".")
        for part in path:
            node = node[part]
        node[last] = str(model)
    # the launcher's keys are not the recipe's, except those another recipe's file keeps (``seed``, which
    # AutoModel's recipes read) and ``recipe`` itself
    want = {k: v for k, v in src.items() if k not in sections.LAUNCH_KEYS or k in sections.RECIPE_KEEPS}
    if case.recipe and "recipe" not in want:
        want["recipe"] = case.recipe
    diffs = _diff(_plain(want), _plain(got))
    return "; ".join(diffs[:3]) + (f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else "")


def _plain(v: tp.Any) -> tp.Any:
    if isinstance(v, str):
        return v.replace("\\${", "${")
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _diff(want: tp.Any, got: tp.Any, key: str = "") -> list[str]:
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in [*want, *(k for k in got if k not in want)]:
            sub = f"{key}.{k}" if key else k
            if k not in got:
                out.append(f"{sub} dropped")
            elif k not in want:
                out.append(f"{sub} added")
            else:
                out += _diff(want[k], got[k], sub)
        return out
    return [] if want == got else [f"{key} changed"]


def generic(reason: str, words: int) -> str:
    """The grouping key of a reason: its first ``words`` words after paths, quoted values and numbers are made
    generic."""
    text = re.sub(r"(?<![\w.])/[^\s'\",;:)]+", "PATH", reason)
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "'…'", text)
    text = re.sub(r"\b\d+(\.\d+)?\b", "N", text)
    return " ".join(text.split()[:words])


def gap_of(reason: str) -> str:
    return next((label for label, rx in GAPS if re.search(rx, reason)), "-")


# ----------------------------------------------------------------------------------------------- the report


def report(all_cases: list[Case], variants: tp.Sequence[str], trees: dict[str, str], words: int, top: int) -> str:
    out: list[str] = []
    for tree, desc in trees.items():
        mine = [c for c in all_cases if c.tree == tree]
        groups = sorted({c.group for c in mine})
        out.append(f"\n## {tree} ({desc}): {len({c.rel for c in mine})} files")
        head = ["examples/", "files", *variants]
        rows = []
        for g in [*groups, "all"]:
            sel = [c for c in mine if g in ("all", c.group)]
            row = [g, str(len({c.rel for c in sel}))]
            for v in variants:
                vs = [c for c in sel if c.variant == v]
                n = sum(c.cls in PLANNED for c in vs)
                notes = [f"{k} {w}" for k, w in ((sum(c.cls == "needs-gpu" for c in vs), "need a GPU host"),
                                                 (sum(c.cls == "crash" for c in vs), "crash"),
                                                 (sum(bool(c.altered) for c in vs), "altered")) if k]
                row.append(f"{n}/{len(vs)}" + (f" ({', '.join(notes)})" if notes else ""))
            rows.append(row)
        out.append(_table(head, rows))
        for v in variants:
            vs = [c for c in mine if c.variant == v]
            counts = collections.Counter(c.cls for c in vs)
            out.append(f"\n### {tree} / {v}: " + ", ".join(f"{k} {counts[k]}" for k in
                                                          ("plans", "needs-gpu", "refused", "crash", "timeout")
                                                          if counts[k]))
            bad = [c for c in vs if c.cls not in PLANNED]
            by = collections.defaultdict(list)
            for c in bad:
                by[(c.cls, generic(c.reason, words))].append(c)
            ranked = sorted(by.items(), key=lambda kv: -len(kv[1]))
            rows = [[str(len(cs)), cls, gap_of(cs[0].reason), key, cs[0].rel]
                    for (cls, key), cs in ranked[:top]]
            if rows:
                out.append(_table(["n", "class", "gap", "reason (first words)", "e.g."], rows))
            if len(ranked) > top:
                out.append(f"... and {len(ranked) - top} more reasons ({sum(len(cs) for _, cs in ranked[top:])} "
                           "cases)")
            alt = collections.Counter(generic(c.altered, words) for c in vs if c.altered)
            if alt:
                out.append(f"plans whose rank file changes the recipe's sections: {sum(alt.values())}")
                out.append(_table(["n", "what differs (first words)"], [[str(n), k] for k, n in alt.most_common(top)]))
    crashes = [c for c in all_cases if c.cls in ("crash", "timeout")]
    if crashes:
        out.append(f"\n## crashes and timeouts ({len(crashes)})")
        for c in crashes:
            out.append(f"- {c.tree} {c.variant} {c.rel}: {c.reason}")
    return "\n".join(out)


def _table(head: list[str], rows: list[list[str]]) -> str:
    width = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = ["| " + " | ".join(h.ljust(w) for h, w in zip(head, width)) + " |",
            "|" + "|".join("-" * (w + 2) for w in width) + "|"]
    return "\n".join(line + ["| " + " | ".join(c.ljust(w) for c, w in zip(r, width)) + " |" for r in rows])


# ----------------------------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                     help="print the report of earlier runs' --json files (merged), run nothing")
    src.add_argument("--git-dir", type=Path, help="AutoModel's git dir (bare or .git); files from git archive")
    src.add_argument("--examples", type=Path, action="append",
                     help="a checkout of AutoModel holding examples/ (repeatable)")
    p.add_argument("--ref", action="append", help="with --git-dir: refs to count (default: HEAD and last-slurm)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--only", help="a regex: only the files whose path (examples/...) matches")
    p.add_argument("--nproc", type=int, default=8,
                   help="plain variant: --nproc-per-node N (default 8, one 8-GPU node; 0: this machine's default)")
    p.add_argument("--workers", type=int, default=2, help="cases at once (default 2; the machine is shared)")
    p.add_argument("--timeout", type=float, default=180.0, help="seconds per case before it is killed")
    p.add_argument("--words", type=int, default=7, help="words of a reason that group it (default 7)")
    p.add_argument("--top", type=int, default=8, help="reasons shown per variant")
    p.add_argument("--exec", action="store_true", help="run the console script per case (no fork-server)")
    p.add_argument("--json", type=Path, help="write every case here")
    p.add_argument("--keep", action="store_true", help="keep the work dir (files, logs, run dirs); print it")
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if unknown := [v for v in variants if v not in VARIANTS]:
        p.error(f"--variants: {', '.join(unknown)} unknown; choose from {', '.join(VARIANTS)}")

    if args.report:
        seen: dict[str, str] = {}
        order: list[str] = []
        done: list[Case] = []
        for path in args.report:
            data = json.loads(path.read_text())
            seen.update(data["trees"])
            order += [v for v in data["variants"] if v not in order]
            done += [Case(**c) for c in data["cases"]]
        print(report(done, [v for v in VARIANTS if v in order], seen, args.words, args.top))
        return 0
    sys.path.append(str(ROOT))  # tests.automodel_assets; automodel_hydra stays the one this Python finds first
    import automodel_hydra
    from tests.automodel_assets import make_tiny_llama

    work = Path(tempfile.mkdtemp(prefix="automodel-examples-"))
    t0 = time.monotonic()
    try:
        trees: dict[str, str] = {}
        roots: dict[str, Path] = {}
        if args.git_dir:
            for ref in args.ref or ["HEAD", "last-slurm"]:
                commit = resolve_ref(args.git_dir, ref)
                desc = git(args.git_dir, "log", "-1", "--format=%h %cs", commit)
                with contextlib.suppress(subprocess.CalledProcessError):
                    desc += " " + git(args.git_dir, "describe", "--tags", commit)
                trees[ref] = desc
                roots[ref] = export(args.git_dir, commit, work / "trees" / re.sub(r"\W", "_", ref))
        else:
            for i, d in enumerate(args.examples):
                if not (d / "examples").is_dir():
                    p.error(f"--examples {d}: no examples/ dir there")
                label = f"{d.name or d}" if len(args.examples) == 1 else f"{i}:{d.name}"
                trees[label] = str(d.resolve())
                roots[label] = Path(shutil.copytree(d / "examples", work / "trees" / str(i) / "examples")).parent
        print("making the tiny local model ...", file=sys.stderr, flush=True)
        model = make_tiny_llama(work / "tiny-llama")
        mount = work / "lustre"
        mount.mkdir()
        todo = [c for t, r in roots.items() for c in cases(t, r, variants, model, mount, args.only, args.nproc)]
        print(f"{len(todo)} cases ({len({(c.tree, c.rel) for c in todo})} files x {len(variants)} variants), "
              f"{args.workers} at once, work dir {work}", file=sys.stderr, flush=True)
        if not args.exec:
            os.environ["TMPDIR"] = str(work / "tmp")
            print("importing what the cases import ...", file=sys.stderr, flush=True)
            preload(todo)
        run_all(todo, work, max(args.workers, 1), args.timeout, args.exec, args.keep, model)
        product = Path(automodel_hydra.__file__).resolve().parents[1]
        with contextlib.suppress(subprocess.CalledProcessError, OSError):
            product_rev = subprocess.run(["git", "-C", str(product), "log", "-1", "--format=%h %s"], check=True,
                                         capture_output=True, text=True).stdout.strip()
            print(f"automodel-hydra measured: {product} at {product_rev[:100]}")
        print(report(todo, variants, trees, args.words, args.top))
        print(f"\n{len(todo)} cases in {time.monotonic() - t0:.0f} s "
              f"({'exec' if args.exec else 'fork-server'}, {args.workers} workers)")
        if args.json:
            args.json.write_text(json.dumps({"trees": trees, "variants": variants, "cases": [
                {k: v for k, v in dataclasses.asdict(c).items() if k != "log" or args.keep} for c in todo]},
                indent=1))
    finally:
        if args.keep:
            print(f"kept: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
