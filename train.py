"""Run the llm_finetune recipe on any launcher: ``python train.py [launcher=slurm|skypilot] [-m ...]``.

A config file of your own (an AutoModel YAML, unchanged): ``python train.py --config-dir D --config-name F``.
"""

import sys

import hydra
from omegaconf import DictConfig

from automodel_hydra import argv, config, errors
from automodel_hydra.driver import launchable, refuse_unselected_sections, run

config.register()  # the typed schema the recipe's config starts from (llm_finetune_schema)
CONFIG_PATH, CONFIG_NAME = "conf", "llm_finetune"


@hydra.main(version_base=None, config_path=CONFIG_PATH, config_name=CONFIG_NAME)
@launchable
def main(cfg: DictConfig) -> object:
    return run(cfg)


if __name__ == "__main__":
    sys.argv[1:] = argv.for_user_config(sys.argv[1:])
    refuse_unselected_sections(__file__, CONFIG_PATH, CONFIG_NAME)  # `slurm.nodes=4` without launcher=slurm: one line
    errors.run_hydra_main(main)  # an unknown key or a wrong type while Hydra composes: one line
