"""Pluggable recipes: what a job's ``recipe:`` resolves to, the user function contract, and AutoModel's adapter
config (stop signals, ``${VAR}`` meaning). The slow tests run a user function on 2 gloo ranks under real torchrun."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import typing as tp
from pathlib import Path
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf

from automodel_hydra.automodel.recipe import recipe_sections, with_stop_signals
from automodel_hydra.recipes import BUNDLED, Recipe, RecipeError, recipe_target, resolve, run_recipe
from tests.automodel_assets import CPU_STANDIN, rank_env

STANDIN = CPU_STANDIN / "worker_standin.py"

#: A user's recipe package, written into the test's tmp dir and put on sys.path / PYTHONPATH.
USER_MODULE = textwrap.dedent('''
    import json, os, time
    from pathlib import Path

    CONSTANT = 3

    class NotARecipe:
        pass

    def two_args(cfg, dist):
        return {}

    def returns_int(cfg, dist, should_stop):
        return 7

    def main(cfg, dist, should_stop):
        """Counts steps; all ranks agree on stopping; checkpoints a JSON file per rank."""
        import torch
        import torch.distributed as td

        assert td.is_initialized() == (dist.world_size > 1), "called after the process group is initialised"
        ckpt = Path(cfg.out_dir) / f"ckpt.rank{dist.rank}.json"
        step = json.loads(ckpt.read_text())["step"] if ckpt.exists() else 0
        total = torch.tensor([float(dist.rank + 1)])
        if dist.world_size > 1:
            td.all_reduce(total)
        deadline = time.monotonic() + float(cfg.get("max_seconds", 120))
        while step < int(cfg.steps) and time.monotonic() < deadline:
            time.sleep(float(cfg.get("step_seconds", 0.0)))
            step += 1
            if cfg.get("ready_at") is not None and step == int(cfg.ready_at):
                (Path(cfg.out_dir) / f"ready.rank{dist.rank}").write_text("")
            stop = torch.tensor([int(should_stop())])
            if dist.world_size > 1:
                td.all_reduce(stop, op=td.ReduceOp.MAX)
            if stop.item():
                ckpt.write_text(json.dumps({"step": step}))
                return {"loss": 1.0 / step, "step": step, "stopped_early": True, "rank_sum": total.item()}
        ckpt.write_text(json.dumps({"step": step}))
        return {"loss": 1.0 / max(step, 1), "step": step, "rank_sum": total.item(), "cfg_type": type(cfg).__name__}
''')


#: A module whose own import fails with something other than ImportError, as triton's does on a host without a GPU
#: driver (AutoModel's speculative-decoding recipes import it at module level).
NEEDS_GPU_MODULE = 'raise RuntimeError("0 active drivers ([]). There should only be one.")\n'


@pytest.fixture
def user_pkg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``my_recipes.train`` (:data:`USER_MODULE`) importable from ``tmp_path / "src"``."""
    pkg = tmp_path / "src" / "my_recipes"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text(USER_MODULE)
    (pkg / "needs_gpu.py").write_text(NEEDS_GPU_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    for name in ("my_recipes", "my_recipes.train", "my_recipes.needs_gpu"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    return tmp_path / "src"


ONE_RANK = SimpleNamespace(rank=0, local_rank=0, world_size=1, device="cpu")


# ------------------------------------------------------------------------------------------------ resolution (fast)


def test_no_recipe_is_the_bundled_one() -> None:
    from automodel_hydra.recipes import llm_finetune

    recipe = resolve(None)
    assert (recipe.kind, recipe.target, recipe.obj) == ("bundled", BUNDLED, llm_finetune.train)
    assert resolve(BUNDLED).kind == "bundled"  # named explicitly, it still gets the validated TrainConfig


@pytest.mark.parametrize("spec", ["my_recipes.train:main", "my_recipes.train.main", " my_recipes.train:main ",
                                  {"_target_": "my_recipes.train:main"}, {"_target_": "my_recipes.train.main"}])
def test_user_function_forms(user_pkg: Path, spec: tp.Any) -> None:
    import my_recipes.train  # type: ignore[import-not-found]

    recipe = resolve(spec)
    assert recipe.kind == "callable" and recipe.obj is my_recipes.train.main


def test_mapping_from_omegaconf(user_pkg: Path) -> None:
    assert resolve(OmegaConf.create({"_target_": "my_recipes.train:main"})).kind == "callable"


@pytest.mark.parametrize(("spec", "expected"), [
    (42, "recipe=42 is not a recipe name"),
    ("", "recipe='' is not a recipe name"),
    ({"name": "x"}, "recipe=a mapping without _target_ is not a recipe name"),
    (["my_recipes.train:main"], "is not a recipe name"),
    ("no_such_pkg_xyz.train:main", "cannot import module 'no_such_pkg_xyz.train'"),
    ("my_recipes.needs_gpu:main", "recipe='my_recipes.needs_gpu:main': importing module 'my_recipes.needs_gpu' "
                                  "failed here (RuntimeError: 0 active drivers ([]). There should only be one.)"),
    ("my_recipes.train:nope", "module 'my_recipes.train' has no attribute 'nope'"),
    ("my_recipes.train.nope", "module 'my_recipes.train' has no attribute 'nope'"),
    ("my_recipes.train:", "is not module:attr or module.attr"),
    ("my_recipes.train:two_args", "takes (cfg, dist); a recipe function is called as fn(cfg, dist, should_stop)"),
    ("my_recipes.train:NotARecipe", "is a class without setup() and run_train_validation_loop()"),
    ("my_recipes.train:CONSTANT", "is a int, not a class or function"),
])
def test_bad_recipe_values_fail_in_one_line(user_pkg: Path, spec: tp.Any, expected: str) -> None:
    with pytest.raises(RecipeError) as err:
        resolve(spec)
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_recipe_target_is_pure() -> None:
    assert recipe_target(None) is None
    assert recipe_target({"_target_": " a.b "}) == "a.b"
    assert "no_such_pkg_xyz" not in sys.modules
    assert recipe_target("no_such_pkg_xyz.f") == "no_such_pkg_xyz.f"  # named, not imported


def test_bare_name_without_automodel_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nemo_automodel", None)  # import fails as if not installed
    monkeypatch.setitem(sys.modules, "nemo_automodel.cli.utils", None)
    with pytest.raises(RecipeError, match=r"nemo_automodel is not installed \(pip install 'automodel-hydra\["
                                          r"automodel\]'\)"):
        resolve("TrainFinetuneRecipeForNextTokenPrediction")


# ------------------------------------------------------------------------------------------ run_recipe (fast)


def test_function_gets_a_dictconfig_and_result_gets_stopped_early(user_pkg: Path, tmp_path: Path) -> None:
    recipe = resolve("my_recipes.train:main")
    out = run_recipe(recipe, {"out_dir": str(tmp_path), "steps": 3}, tp.cast(tp.Any, ONE_RANK))
    assert out["step"] == 3 and out["cfg_type"] == "DictConfig" and out["stopped_early"] is False
    assert json.loads((tmp_path / "ckpt.rank0.json").read_text()) == {"step": 3}
    # run again: the function resumes from its own checkpoint
    assert run_recipe(recipe, OmegaConf.create({"out_dir": str(tmp_path), "steps": 5}),
                      tp.cast(tp.Any, ONE_RANK))["step"] == 5


def test_function_stops_on_should_stop(user_pkg: Path, tmp_path: Path) -> None:
    calls = iter(range(1, 100))
    out = run_recipe(resolve("my_recipes.train:main"), {"out_dir": str(tmp_path), "steps": 50},
                     tp.cast(tp.Any, ONE_RANK), should_stop=lambda: next(calls) >= 4)
    assert out["stopped_early"] is True and out["step"] == 4


def test_function_result_defaults(user_pkg: Path) -> None:
    none_fn = Recipe("callable", "t:none", lambda cfg, dist, stop: None)
    assert run_recipe(none_fn, {}, tp.cast(tp.Any, ONE_RANK)) == {"stopped_early": False}
    assert run_recipe(none_fn, {}, tp.cast(tp.Any, ONE_RANK), should_stop=lambda: True) == {"stopped_early": True}
    with pytest.raises(RecipeError, match=r"returned a int; a recipe function returns its final metrics as a dict"):
        run_recipe(resolve("my_recipes.train:returns_int"), {}, tp.cast(tp.Any, ONE_RANK))


# ------------------------------------------------------------------------------- AutoModel adapter config (fast)


@pytest.mark.parametrize(("given", "expected"), [
    ({}, ["SIGTERM", "SIGUSR2"]),  # AutoModel's default (SIGTERM) plus Slurm's time-limit warning
    ({"preemption_signal": "SIGTERM"}, ["SIGTERM", "SIGUSR2"]),
    ({"preemption_signal": "SIGUSR2"}, ["SIGUSR2", "SIGTERM"]),
    ({"preemption_signal": [15, "SIGINT"]}, [15, "SIGINT", "SIGUSR2"]),
    ({"preemption_signal": "usr2"}, ["usr2", "SIGTERM"]),
    ({"preemption_signal": None}, None),  # explicit null: AutoModel installs no handler; we add none
])
def test_stop_signals_added_to_automodel_preemption_signal(given: dict[str, tp.Any], expected: tp.Any) -> None:
    sections = {"step_scheduler": {"max_steps": 5, **given}}
    out = with_stop_signals(sections)
    assert out["step_scheduler"]["preemption_signal"] == expected
    assert out["step_scheduler"]["max_steps"] == 5
    assert sections == {"step_scheduler": {"max_steps": 5, **given}}  # input untouched


def test_recipe_sections_drop_launcher_keys_and_keep_env_references() -> None:
    cfg = OmegaConf.create({"recipe": "TrainFinetuneRecipeForNextTokenPrediction", "slurm": {"nodes": 2},
                            "hydra": {"run": {"dir": "x"}}, "dry_run": False, "launcher": "slurm",
                            "model": {"pretrained_model_name_or_path": "${MODEL_DIR,/models/llama}"}})
    assert recipe_sections(cfg) == {"recipe": "TrainFinetuneRecipeForNextTokenPrediction",
                                    "model": {"pretrained_model_name_or_path": "${MODEL_DIR,/models/llama}"}}


@pytest.mark.automodel
def test_build_config_keeps_automodel_meaning_of_env_references(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nemo_automodel")
    from automodel_hydra.automodel.recipe import build_config

    monkeypatch.delenv("AMH_TEST_DIR", raising=False)
    sections = {"model": {"path": "${AMH_TEST_DIR,/models/default}", "lr": "1e-5"},
                "wandb": {"enable": False, "project": "p"}}
    node = build_config(sections)
    assert node.model.path == "/models/default" and node.model.lr == 1e-5
    assert node.get("wandb", None) is None  # enable: false drops the block, as AutoModel's CLI does
    assert list(node.step_scheduler.preemption_signal) == ["SIGTERM", "SIGUSR2"]
    monkeypatch.setenv("AMH_TEST_DIR", "/data/from-env")
    assert build_config(sections).model.path == "/data/from-env"


@pytest.mark.automodel
def test_bare_automodel_names_resolve_as_automodel_does() -> None:
    pytest.importorskip("nemo_automodel")
    fq = "nemo_automodel.recipes.llm.train_ft.TrainFinetuneRecipeForNextTokenPrediction"
    for spec in ("TrainFinetuneRecipeForNextTokenPrediction", fq, {"_target_": fq},
                 {"_target_": "TrainFinetuneRecipeForNextTokenPrediction"}):
        recipe = resolve(spec)
        assert (recipe.kind, recipe.target) == ("automodel", fq)
    with pytest.raises(RecipeError, match=r"recipe='TrainFinetuneRecipeForNextTokenPredictio' is not one of NeMo "
                                          r"AutoModel's recipe classes; did you mean "
                                          r"TrainFinetuneRecipeForNextTokenPrediction"):
        resolve("TrainFinetuneRecipeForNextTokenPredictio")


# ------------------------------------------------------------------------ a user function on 2 gloo ranks (slow)


def _torchrun(args: list[str], out_dir: Path, pythonpath: Path, **popen: tp.Any) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(STANDIN), *args, "--result-dir", str(out_dir)]
    return subprocess.Popen(cmd, env=rank_env([pythonpath]), cwd=out_dir, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, **popen)


def _results(out_dir: Path) -> list[dict[str, tp.Any]]:
    return [json.loads((out_dir / f"result.rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
def test_user_function_on_two_gloo_ranks(user_pkg: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"recipe: my_recipes.train:main\nout_dir: {tmp_path}\nsteps: 4\nslurm: {{nodes: 1}}\n")
    proc = _torchrun([str(job)], tmp_path, user_pkg)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out[-3000:]
    results = _results(tmp_path)
    assert [r["kind"] for r in results] == ["callable", "callable"]
    assert [r["rank_sum"] for r in results] == [3.0, 3.0]  # all_reduce of rank+1 over the real gloo group
    assert all(r["step"] == 4 and r["stopped_early"] is False for r in results)


@pytest.mark.slow
def test_user_function_stops_on_sigusr2_on_every_rank(user_pkg: Path, tmp_path: Path) -> None:
    job = tmp_path / "job.yaml"
    job.write_text(f"recipe: my_recipes.train.main\nout_dir: {tmp_path}\nsteps: 100000\nstep_seconds: 0.05\n"
                   "ready_at: 3\nmax_seconds: 120\n")
    proc = _torchrun([str(job)], tmp_path, user_pkg)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready.rank1").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "ranks never reached step 3"
        time.sleep(0.2)
    os.kill(int((tmp_path / "pid.rank1").read_text()), signal.SIGUSR2)  # one rank is signalled; both stop
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode != 0, "a stopped rank exits 143 (the worker's EXIT_STOPPED)"
    results = _results(tmp_path)
    assert all(r["stopped_early"] is True for r in results), out[-3000:]
    assert results[0]["step"] == results[1]["step"] >= 3
    assert json.loads((tmp_path / "ckpt.rank0.json").read_text())["step"] == results[0]["step"]



# ------------------------------------------------------- the adapter's run() around a recipe-shaped class (fast)


class FakeSignalHandler:
    def __init__(self) -> None:
        self.released = False

    def release(self) -> bool:
        self.released = True
        return True


class FakeRecipe:
    """AutoModel's recipe protocol as :func:`automodel.run` uses it: setup(), run_train_validation_loop(),
    step_scheduler.{step, epoch, sigterm_flag, sig_handler}, checkpointer.config.checkpoint_dir."""

    instances: tp.ClassVar[list[FakeRecipe]] = []

    def __init__(self, cfg: tp.Any) -> None:
        self.cfg, self.ran = cfg, False
        self.step_scheduler = SimpleNamespace(step=0, epoch=0, sigterm_flag=False, sig_handler=FakeSignalHandler())
        self.checkpointer = SimpleNamespace(config=SimpleNamespace(checkpoint_dir=cfg["checkpoint"]["checkpoint_dir"]))
        FakeRecipe.instances.append(self)

    def setup(self) -> None:
        """What AutoModel's setup_logging() does to the process's logging."""
        root = logging.getLogger()
        root.setLevel(logging.DEBUG)
        for h in root.handlers:
            h.setFormatter(logging.Formatter("\x1b[32m%(message)s"))
            h.addFilter(lambda record: False)
        logging.getLogger("automodel_hydra.worker").addFilter(lambda record: False)
        logging.disable(logging.CRITICAL)

    def run_train_validation_loop(self) -> None:
        self.ran = True
        if self.cfg["step_scheduler"].get("fail"):
            raise RuntimeError("rank failed")
        sched = self.step_scheduler
        sched.step = self.cfg["step_scheduler"].get("stop_at") or self.cfg["step_scheduler"]["max_steps"]
        sched.sigterm_flag = bool(self.cfg["step_scheduler"].get("stop_at"))
        ckpt = Path(self.checkpointer.config.checkpoint_dir)
        (ckpt / "training.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5.0 - s}) + "\n"
                                                     for s in range(sched.step)))
        (ckpt / "validation.jsonl").write_text(json.dumps({"step": sched.step - 1, "val_loss": 4.5}) + "\n")


@pytest.fixture
def fake_automodel(monkeypatch: pytest.MonkeyPatch) -> tp.Iterator[None]:
    """run() without AutoModel's loader: the config object is the plain sections (signals added)."""
    from automodel_hydra.automodel import recipe as automodel

    monkeypatch.setattr(automodel, "build_config", lambda sections: with_stop_signals(dict(sections)))
    logging.getLogger("automodel_hydra.worker")  # exists before the recipe runs, as in the worker
    FakeRecipe.instances.clear()
    yield


def _job(tmp_path: Path, **sched: tp.Any) -> dict[str, tp.Any]:
    return {"recipe": "FakeRecipe", "slurm": {"nodes": 2}, "checkpoint": {"checkpoint_dir": str(tmp_path)},
            "step_scheduler": {"max_steps": 4, **sched}}


def test_adapter_runs_setup_then_loop_and_reads_final_metrics(fake_automodel: None, tmp_path: Path) -> None:
    recipe = Recipe("automodel", "t.FakeRecipe", FakeRecipe)
    out = run_recipe(recipe, _job(tmp_path), tp.cast(tp.Any, ONE_RANK))
    assert out == {"step": 4, "epoch": 0, "stopped_early": False, "world_size": 1, "loss": 2.0, "val_loss": 4.5}
    [fake] = FakeRecipe.instances
    assert "slurm" not in fake.cfg and fake.cfg["step_scheduler"]["preemption_signal"] == ["SIGTERM", "SIGUSR2"]
    assert fake.step_scheduler.sig_handler.released  # the worker's own handlers are back
    other_rank = SimpleNamespace(rank=1, local_rank=1, world_size=1, device="cpu")
    assert "loss" not in run_recipe(recipe, _job(tmp_path), tp.cast(tp.Any, other_rank))  # rank 0 reports


def test_adapter_gives_the_worker_its_logging_back(fake_automodel: None, tmp_path: Path) -> None:
    root, worker_log = logging.getLogger(), logging.getLogger("automodel_hydra.worker")
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("[rank1] %(message)s"))
    root.addHandler(handler)
    try:
        level = root.level
        for job in (_job(tmp_path), _job(tmp_path, fail=True)):
            with contextlib.suppress(RuntimeError):
                run_recipe(Recipe("automodel", "t.FakeRecipe", FakeRecipe), job, tp.cast(tp.Any, ONE_RANK))
            assert logging.root.manager.disable == logging.NOTSET and root.level == level
            assert handler.formatter is not None and handler.formatter._fmt == "[rank1] %(message)s"
            assert handler.filters == [] and worker_log.filters == []
    finally:
        root.removeHandler(handler)


def test_adapter_reports_automodel_stop(fake_automodel: None, tmp_path: Path) -> None:
    out = run_recipe(Recipe("automodel", "t.FakeRecipe", FakeRecipe), _job(tmp_path, stop_at=2),
                     tp.cast(tp.Any, ONE_RANK))
    assert out["stopped_early"] is True and out["step"] == 2


def test_adapter_stops_before_training_on_an_early_signal(fake_automodel: None, tmp_path: Path) -> None:
    """A signal during imports/setup reached the worker's flag, not AutoModel's handler: no step runs."""
    out = run_recipe(Recipe("automodel", "t.FakeRecipe", FakeRecipe), _job(tmp_path), tp.cast(tp.Any, ONE_RANK),
                     should_stop=lambda: True)
    [fake] = FakeRecipe.instances
    assert not fake.ran and out["stopped_early"] is True and out["step"] == 0
    assert fake.step_scheduler.sig_handler.released
