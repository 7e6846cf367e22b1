"""Run the llm_finetune recipe on any launcher: ``python train.py [launcher=slurm|skypilot] [-m ...]``.

A config file of your own (an AutoModel YAML, unchanged): ``python train.py --config-dir D --config-name F``.
"""

import sys

import hydra
from omegaconf import DictConfig

from automodel_hydra import argv, config
from automodel_hydra.driver import launchable, run

config.register()  # the typed schema the recipe's config starts from (llm_finetune_schema)


@hydra.main(version_base=None, config_path="conf", config_name="llm_finetune")
@launchable
def main(cfg: DictConfig) -> object:
    return run(cfg)


if __name__ == "__main__":
    sys.argv[1:] = argv.for_user_config(sys.argv[1:])
    main()
