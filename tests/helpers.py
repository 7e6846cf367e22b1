"""Helpers shared by tests: compose the project's real configs, run train.py as a user would."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import socket
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import setup_globals
from omegaconf import DictConfig, open_dict

from automodel_hydra import config

ROOT = Path(__file__).resolve().parents[1]
#: why a test needing ``sky`` in-process skips: scripts/setup puts SkyPilot in .venv-sky beside the automodel extra
#: (they cannot share an environment), and CI runs these tests there too (.ci/run)
SKY_ELSEWHERE = "skypilot is not installed in this environment (CI runs these tests in .venv-sky)"
CONF = ROOT / "conf"

config.register()  # the typed schema the project's configs compose with


#: compose_cfg's compositions: (cwd, overrides) -> Hydra's config, for the ConfigStore they were composed with
_composed: dict[tuple[str, ...], DictConfig] = {}
_composed_with: list[ConfigStore] = []


def compose_cfg(overrides: tp.Sequence[str] = (), output_dir: str | Path = "/tmp/automodel-test") -> DictConfig:
    """The composed ``llm_finetune`` config with Hydra's config set, as inside a job.

    Hydra composes each set of overrides once per working dir and ConfigStore (a composition is ~0.1 s, and the
    fast tier asked for the same one up to 19 times); each call gets a deep copy of it. The composition reads only
    the config files, the overrides, the ConfigStore and the working dir (``hydra.runtime.cwd``): interpolations
    (``${oc.env:...}``, ``${now:...}``, ``${hydra:...}``) are resolved when read, after the copy."""
    store = ConfigStore.instance()
    if _composed_with != [store]:
        _composed.clear()
        _composed_with[:] = [store]
    key = (os.getcwd(), *overrides)
    if key not in _composed:
        with initialize_config_dir(config_dir=str(CONF), version_base=None):
            _composed[key] = compose("llm_finetune", overrides=list(overrides), return_hydra_config=True)
    setup_globals()  # Hydra's resolvers (hydra:, now:), as Hydra's start registers them
    cfg = copy.deepcopy(_composed[key])
    with open_dict(cfg):
        cfg.hydra.runtime.output_dir = str(output_dir)
        cfg.hydra.job.name = "train"
    HydraConfig.instance().set_config(cfg)
    return cfg


def train_py(*args: str, env: tp.Mapping[str, str] | None = None, timeout: float = 300,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``python train.py ARGS`` in a subprocess; returns the completed process (stdout+stderr merged)."""
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *args], env={**os.environ, **(env or {})},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"train.py {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    return proc


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (the kernel's choice: another process may take it before
    the test uses it, as with any free port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


T = tp.TypeVar("T")


def wait_for(cond: tp.Callable[[], T], timeout: float, what: str, *, poll: float = 0.1,
             proc: subprocess.Popen[tp.Any] | None = None, output: tp.Callable[[], str] | None = None) -> T:
    """Poll ``cond`` every ``poll`` s until it returns a true value, and return that value. Fails the test
    (AssertionError naming ``what``) after ``timeout`` s, or as soon as ``proc`` has ended, when one is given (the
    process that should bring it about); the message ends with ``output()`` (the last 4000 characters)."""
    def tail() -> str:
        return f":\n{output()[-4000:]}" if output is not None else ""

    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"process {proc.pid} ended (exit {proc.returncode}) before {what}{tail()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}{tail()}")
        time.sleep(poll)


def metrics(run_dir: Path) -> list[dict[str, tp.Any]]:
    """The rows of ``run_dir/metrics.jsonl``."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]


def broken_model_dir(parent: Path) -> Path:
    """A model dir that passes the plan-time check (it has a ``config.json``) but that no rank can load: a job
    with it fails in its ranks, the way a corrupt or incompatible checkpoint does."""
    path = Path(parent) / "broken-model"
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "no-such-architecture"}')
    return path


def worker_pids(head: int) -> list[int]:
    """The ranks below process ``head`` (``python -u -m automodel_hydra.worker ...``), parents first."""
    from automodel_hydra.stops import tree

    found = []
    for pid in tree(head):
        with contextlib.suppress(OSError):
            if b"automodel_hydra.worker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                found.append(pid)
    return found


def git(repo: Path, *args: str) -> str:
    """``git -C repo ARGS`` with a throw-away identity; its stdout, stripped. Raises CalledProcessError."""
    return subprocess.run(["git", "-C", str(repo), "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          check=True, capture_output=True, text=True).stdout.strip()


#: A user's job file for :func:`user_repo`: ``my_pkg.train:main`` on one task of the test cluster's debug partition
#: (append more ``slurm:`` keys indented by two spaces).
USER_JOB = """recipe: my_pkg.train:main
x: 0
slurm:
  nodes: 1
  ntasks_per_node: 1
  gpus_per_node: 0
  partition: debug
  time: "00:10:00"
"""


def user_repo(tmp_path: Path, recipe: str, job: str, version: str = "submitted") -> Path:
    """A user's own repo under ``tmp_path/repo``: ``my_pkg/train.py`` (``recipe`` formatted with
    ``version="committed"``) and ``job.yaml``, one commit, then an uncommitted edit of the recipe to ``version``
    (the tree is dirty)."""
    repo = tmp_path / "repo"
    (repo / "my_pkg").mkdir(parents=True)
    (repo / "my_pkg" / "__init__.py").write_text("")
    (repo / "my_pkg" / "train.py").write_text(recipe.format(version="committed"))
    (repo / "job.yaml").write_text(job)
    git(repo, "init", "-q")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "recipe")
    (repo / "my_pkg" / "train.py").write_text(recipe.format(version=version))
    return repo
