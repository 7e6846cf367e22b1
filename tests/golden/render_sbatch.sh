#!/bin/bash
#SBATCH --job-name=llm_finetune
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=8
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=12
#SBATCH --mem=512G
#SBATCH --time=240
#SBATCH --signal=USR2@300
#SBATCH --requeue
#SBATCH --array=0-9%4
#SBATCH --output=/scratch/sweep/slurm/%A_%a_0.out
#SBATCH --open-mode=append
#SBATCH --partition=batch
#SBATCH --account=my_account
#SBATCH --constraint="h100|a100"
#SBATCH --comment="lr sweep \"v2\" # 10 points"

# setup
export PYTHONPATH=/src/automodel-hydra
export AUTOMODEL_JOB_DIR="${job_dirs[$SLURM_ARRAY_TASK_ID]}"

# command
srun --kill-on-bad-exit=1 --export=ALL --output /scratch/sweep/slurm/%A_%a_%t.out python -u -m automodel_hydra.worker "$AUTOMODEL_JOB_DIR"/launch/job.yaml
