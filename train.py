"""Run the llm_finetune recipe on any launcher: ``python train.py [launcher=slurm|skypilot] [-m ...]``."""

import hydra
from omegaconf import DictConfig

import automodel_hydra.config  # noqa: F401  (registers the typed schemas)


@hydra.main(version_base=None, config_path="conf", config_name="llm_finetune")
def main(cfg: DictConfig) -> object:
    from automodel_hydra.driver import run

    return run(cfg)


if __name__ == "__main__":
    main()
