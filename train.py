"""Run the llm_finetune recipe on any launcher: ``python train.py [launcher=slurm|skypilot] [-m ...]``.

A config file of your own (an AutoModel YAML, unchanged): ``python train.py --config-dir D --config-name F``.
The app itself is :mod:`automodel_hydra.train` (what an installed ``automodel-hydra F.yaml`` runs); this file
calls it.
"""

from automodel_hydra.train import cli, main

__all__ = ["main"]

if __name__ == "__main__":
    cli(__file__)
