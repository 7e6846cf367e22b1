"""Run the llm_finetune recipe on any launcher: ``python train.py [launcher=slurm|skypilot] [-m ...]``."""

import hydra
from omegaconf import DictConfig

from automodel_hydra import config
from automodel_hydra.driver import launchable, run

config.register()  # the typed schema the recipe's config starts from (llm_finetune_schema)


@hydra.main(version_base=None, config_path="conf", config_name="llm_finetune")
@launchable
def main(cfg: DictConfig) -> object:
    return run(cfg)


if __name__ == "__main__":
    main()
