"""The Hydra app: the llm_finetune recipe on any launcher, ``python -m automodel_hydra.train [launcher=slurm|skypilot]
[-m ...]`` (what ``automodel-hydra F.yaml`` runs, and what the repository's ``train.py`` calls).

A config file of your own (an AutoModel YAML, unchanged): ``... --config-dir D --config-name F``. The configs are
the package's ``conf/`` (in a checkout a link to the repository's ``conf/``; in a wheel a copy of it), given to
Hydra as an absolute path so the same files are found however the app is started.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

if __name__ == "__main__":  # torchrun's agent starts now, beside Hydra's start-up (automodel_hydra.prestart)
    from automodel_hydra import prestart

    prestart.start(sys.argv[1:])

import hydra
from omegaconf import DictConfig

from automodel_hydra import argv, config, errors, version_line
from automodel_hydra.driver import launchable, refuse_unselected_sections, run

config.register()  # the typed schema the recipe's config starts from (llm_finetune_schema)
CONFIG_PATH, CONFIG_NAME = str(Path(__file__).resolve().parent / "conf"), "llm_finetune"


@hydra.main(version_base=None, config_path=CONFIG_PATH, config_name=CONFIG_NAME)
@launchable
def main(cfg: DictConfig) -> object:
    return run(cfg)


def cli(app_file: str | None = None) -> None:
    """Run the app on ``sys.argv``: an AutoModel-style ``--config F.yaml`` becomes Hydra's shape
    (:mod:`automodel_hydra.argv`), and a launcher key set without its ``launcher=`` choice fails in one line.
    ``--version`` prints this package's version line (:func:`automodel_hydra.version_line`), not Hydra's."""
    errors.one_line_warnings()
    if "--version" in sys.argv[1:]:  # Hydra's own --version would answer with Hydra's version
        print(version_line())
        raise SystemExit(0)
    sys.argv[1:] = argv.hydra_flags_first(argv.for_user_config(sys.argv[1:]))
    refuse_unselected_sections(app_file or __file__, CONFIG_PATH, CONFIG_NAME)  # `slurm.nodes=4` alone: one line
    try:
        # an unknown key or a wrong type while Hydra composes: one line
        errors.run_hydra_main(main, argv.user_file(sys.argv[1:]))
    finally:
        gc.freeze()  # the command is over: skip the interpreter's final collection of Hydra's and OmegaConf's objects


if __name__ == "__main__":
    cli()
