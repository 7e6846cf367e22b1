"""The Hydra app: the llm_finetune recipe on any launcher, ``python -m automodel_hydra.train [launcher=slurm|skypilot]
[-m ...]`` (what ``automodel-hydra F.yaml`` runs, and what the repository's ``train.py`` calls).

A config file of your own (an AutoModel YAML, unchanged): ``... --config-dir D --config-name F``. The configs are
the package's ``conf/`` (in a checkout a link to the repository's ``conf/``; in a wheel a copy of it), given to
Hydra as an absolute path so the same files are found however the app is started. ``--help`` lists every section
a user can set and its keys as the schema has them (:func:`help_keys`), so the list cannot drift from the config.
"""

from __future__ import annotations

import dataclasses
import gc
import sys
import textwrap
import typing as tp
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from automodel_hydra import argv, config, errors, quiet, streams, version_line
from automodel_hydra.driver import fail, launchable, refuse_unselected_sections, run
from automodel_hydra.sections import NOT_SET_BY_USERS

CONFIG_PATH, CONFIG_NAME = str(Path(__file__).resolve().parent / "conf"), "llm_finetune"


def settable_sections() -> dict[str, list[str]]:
    """Every section a user can set and its keys, read from the schema (``config.TrainConfig`` and the dataclasses
    it holds): ``{"model": [...], ..., "slurm": [...], "slurm.tunnel": [...], "": [top-level keys]}``, in the
    schema's order. A section inside a section is its own entry (``slurm.tunnel``, ``profile.nsys``); AutoModel's
    alias names (:data:`automodel_hydra.config.ALIASES`) and the keys a user does not set
    (:data:`automodel_hydra.sections.NOT_SET_BY_USERS`) are left out."""
    aliases = {(section, alias) for section, alias, _, _ in config.ALIASES}
    out: dict[str, list[str]] = {"": []}

    def walk(schema: type, prefix: str) -> None:
        hints = tp.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            if not prefix and f.name in NOT_SET_BY_USERS or (prefix, f.name) in aliases:
                continue
            inner = [a for a in (hints[f.name], *tp.get_args(hints[f.name])) if dataclasses.is_dataclass(a)]
            if inner:
                out.setdefault(f"{prefix}.{f.name}".lstrip("."), [])
                walk(tp.cast(type, inner[0]), f"{prefix}.{f.name}".lstrip("."))
            else:
                out.setdefault(prefix, []).append(f.name)

    walk(config.TrainConfig, "")
    return {name: keys for name, keys in out.items() if keys or not name}


def help_keys() -> str:
    """``python train.py --help``'s list of every section and its keys (:func:`settable_sections`), one entry per
    section, wrapped at 118 columns: what Hydra's help template (conf/hydra/help/automodel.yaml) shows through
    ``${automodel_help_keys:}``."""
    lines = []
    sections = settable_sections()
    for name, keys in [*((n, k) for n, k in sections.items() if n), ("", sections[""])]:
        lines += textwrap.wrap(", ".join(keys), 118, initial_indent=f"  {name:<17}" if name else "  ",
                               subsequent_indent=" " * 19 if name else "  ", break_on_hyphens=False)
    return "\n".join(lines)


config.register()  # the typed schema the recipe's config starts from (llm_finetune_schema)
if not OmegaConf.has_resolver("automodel_help_keys"):  # --help's list of sections and keys
    OmegaConf.register_new_resolver("automodel_help_keys", help_keys)


@hydra.main(version_base=None, config_path=CONFIG_PATH, config_name=CONFIG_NAME)
@launchable
def main(cfg: DictConfig) -> object:
    return run(cfg)


def cli(app_file: str | None = None) -> None:
    """Run the app on ``sys.argv``, read by the one command-line parser (:func:`automodel_hydra.argv.parse`): a
    user's config file gets our launcher and dirs (:func:`automodel_hydra.argv.for_user_config`), Hydra's flags go
    first, and a launcher key set without its ``launcher=`` choice or two of Hydra's modes fail in one line.
    ``--version`` prints this package's version line (:func:`automodel_hydra.version_line`), not Hydra's."""
    streams.best_effort()  # a terminal or pipe that goes away never fails the launch (automodel_hydra.streams)
    quiet.install()  # before anything imports torch (a model check, AutoModel's recipes): no dependency's noise
    errors.one_line_warnings()
    line = argv.parse(sys.argv[1:])
    if line.given("--version") is not None:  # Hydra's own --version would answer with Hydra's version
        print(version_line())
        raise SystemExit(0)
    problem = line.usage_problem()  # `-m --cfg job`: Hydra would answer with a traceback
    if problem is not None:
        fail(problem)
    sys.argv[1:] = argv.hydra_flags_first(argv.for_user_config(sys.argv[1:]))
    refuse_unselected_sections(app_file or __file__, CONFIG_PATH, CONFIG_NAME)  # `slurm.nodes=4` alone: one line
    _refuse_dry_run_over_a_run(line)
    try:
        # an unknown key or a wrong type while Hydra composes: one line
        errors.run_hydra_main(main, argv.user_file(sys.argv[1:]))
    finally:
        gc.freeze()  # the command is over: skip the interpreter's final collection of Hydra's and OmegaConf's objects


def _refuse_dry_run_over_a_run(line: argv.CommandLine) -> None:
    """``dry_run=true`` with the literal dir of a submitted run or sweep on the command line: one line (status 2)
    before Hydra writes its ``.hydra/`` there (:func:`automodel_hydra.records.refuse_dry_run_over`; a dir that
    comes from a config file is refused by the launch, before any launch file is written)."""
    from automodel_hydra import paths, records
    from automodel_hydra.plan import JobSpec
    from automodel_hydra.schema import UserError

    sweep = line.given("--multirun") is not None
    where = records.dry_run_dir(line.overrides, sweep)
    if where is None or paths.too_long(where) is not None:  # (no run can be in a dir that cannot be made: the
        return  # launch's own check of paths built from names says which key, in one line)
    jobs = [] if sweep else [JobSpec(job_dir=where, job_name="")]
    try:
        records.refuse_if_busy(jobs)  # (a dir whose job has not ended: that line first, as the launch says it)
        records.refuse_dry_run_over(jobs, where if sweep else None)
    except UserError as e:
        fail(str(e))
    except OSError:  # a dir this user cannot read holds no run of theirs; Hydra's own dir creation says why
        return


if __name__ == "__main__":
    cli()
