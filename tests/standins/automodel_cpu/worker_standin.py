"""STAND-IN for tests only: what ``automodel_hydra.worker`` will do for a pluggable recipe, until it is wired in.

Run by torchrun, one process per rank::

    torchrun --nproc-per-node 2 tests/standins/automodel_cpu/worker_standin.py CONFIG.yaml [KEY=VALUE ...] \
        [--recipe SPEC] [--result-dir DIR]

It reads CONFIG.yaml as AutoModel's CLI does (``yaml.safe_load``, so ``${VAR}`` stays a string), applies dotted
``KEY=VALUE`` overrides (values read as AutoModel reads ``--key=value``: ``translate_value`` when AutoModel is
installed, else YAML scalars), installs the worker's stop flag (SIGUSR2/SIGTERM), initialises the process group with
the real bootstrap, resolves the recipe (``--recipe``, else the YAML's ``recipe:``) and calls ``run_recipe``.
Each rank writes ``DIR/result.rank<R>.json`` and its pid to ``DIR/pid.rank<R>``; a stopped run exits 143.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import typing as tp
from pathlib import Path

import yaml

from automodel_hydra.bootstrap import DistEnv, init_distributed
from automodel_hydra.recipes import resolve, run_recipe
from automodel_hydra.worker import EXIT_STOPPED, StopFlag


def read_value(text: str) -> tp.Any:
    try:
        from nemo_automodel.components.config.loader import translate_value
    except ImportError:
        return yaml.safe_load(text)
    return translate_value(text)


def apply_overrides(cfg: dict[str, tp.Any], overrides: tp.Sequence[str]) -> dict[str, tp.Any]:
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"override {item!r} is not KEY=VALUE")
        node = cfg
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = read_value(value)
    return cfg


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--recipe", default=None)
    parser.add_argument("--result-dir", default=".")
    args = parser.parse_args(argv)
    out = Path(args.result_dir)
    stop = StopFlag().install()
    cfg = apply_overrides(yaml.safe_load(Path(args.config).read_text()) or {}, args.overrides)
    env = DistEnv.from_environ()
    (out / f"pid.rank{env.rank}").write_text(str(os.getpid()))
    recipe = resolve(args.recipe if args.recipe is not None else cfg.get("recipe"))
    with init_distributed(env) as dist:
        result = run_recipe(recipe, cfg, dist, stop)
    (out / f"result.rank{env.rank}.json").write_text(json.dumps({"kind": recipe.kind, **result}, default=str))
    sys.stdout.flush()
    if result.get("stopped_early"):
        raise SystemExit(EXIT_STOPPED)


if __name__ == "__main__":
    main()
