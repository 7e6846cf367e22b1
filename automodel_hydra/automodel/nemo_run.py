"""NeMo AutoModel's ``nemo_run:`` section (its NeMo-Run launcher, ``nemo_automodel/components/launcher/nemo_run``),
read with AutoModel's meaning where it maps onto a launcher of ours, refused in one line where it does not.

AutoModel's section (``NemoRunConfig``): ``executor`` (default ``local``: NeMo-Run's ``LocalExecutor``; any other
value names an entry of ``EXECUTOR_MAP`` in the Python file ``executors_file``, default
``$NEMORUN_HOME/executors.py``), ``job_name``, ``detach``, ``tail_logs``, ``job_dir``, and every other key an
attribute set on the executor (``setattr``: ``nodes``, ``ntasks_per_node``, ``partition``, ``time``,
``container_image``, ``env_vars`` ...). Its CLI pops the section before the recipe sees the config.

What it becomes here (:func:`translate`, pure; called by :func:`automodel_hydra.config.load`):

* ``executor: local`` (or absent) -> our interactive launcher (torchrun on this node, which is what NeMo-Run's
  ``LocalExecutor`` with its torchrun launcher runs): ``ntasks_per_node`` -> ``interactive.nproc_per_node``.
  ``job_name``, ``detach``, ``tail_logs``, ``job_dir`` and ``executors_file`` are accepted and have no effect
  (a local run is always waited for and prints its log, as NeMo-Run forces ``detach=False`` for it; the run dir
  keeps the config and logs; the file is not read for ``local``). Any other key is refused, naming it.
* a named executor -> refused in one line: the executor is a Python object (``run.SlurmExecutor(...)``, its
  account, partition and SSH tunnel) that only executing the user's ``executors.py`` with NeMo-Run installed
  would give. The line names the ``slurm:`` keys to write instead, with the values the file's section sets.
"""

from __future__ import annotations

import typing as tp

from automodel_hydra.schema import ConfigError

#: AutoModel's ``NemoRunConfig`` keys that are the launcher's own, not executor attributes (``_LAUNCHER_KEYS``).
LAUNCHER_KEYS = ("executor", "job_name", "detach", "tail_logs", "executors_file", "job_dir")
#: ``LocalExecutor`` attributes -> our key.
LOCAL_KEYS = {"ntasks_per_node": ("interactive", "nproc_per_node")}
#: ``SlurmExecutor`` attribute names -> ``slurm:`` keys, for the line that refuses a named executor.
SLURM_KEYS = {"account": "account", "partition": "partition", "nodes": "nodes", "ntasks_per_node": "ntasks_per_node",
              "gpus_per_node": "gpus_per_node", "time": "time", "container_image": "container_image",
              "container_mounts": "extra_mounts", "env_vars": "env_vars", "mem": "mem", "qos": "qos",
              "job_name": "job_name", "exclusive": "sbatch_args.exclusive", "cpus_per_task": "cpus_per_task"}


def translate(section: tp.Any, others: tp.Iterable[str] = ()) -> dict[str, dict[str, tp.Any]]:
    """Our sections for AutoModel's ``nemo_run:`` ``section`` (a mapping): ``{"interactive": {...}}`` for a local
    executor. ``others``: the launcher sections the file also has (``slurm``, ``skypilot``).

    Raises
    ------
    ConfigError
        naming the key: a named executor (the ``slurm:`` keys to write instead), a key a local run cannot honour,
        another launcher section beside it, or a section that is not a mapping.
    """
    if not isinstance(section, tp.Mapping):
        raise ConfigError("nemo_run", section, "AutoModel's nemo_run: section, a mapping (executor: local, ...)")
    both = [o for o in others]
    if both:
        raise ConfigError(f"nemo_run/{both[0]}", "both set", f"a config routes to one launcher: keep either the "
                          f"nemo_run: or the {both[0]}: section")
    executor = section.get("executor", "local")
    overrides = {str(k): v for k, v in section.items() if k not in LAUNCHER_KEYS}
    if executor != "local":
        given = ", ".join(f"slurm.{SLURM_KEYS[k]}={v}" for k, v in overrides.items() if k in SLURM_KEYS)
        where = section.get("executors_file", "$NEMORUN_HOME/executors.py")
        raise ConfigError("nemo_run.executor", executor, f"'local' here: a named NeMo-Run executor is a Python "
                          f"object in {where} that is not read; write the job's Slurm settings as a slurm: section "
                          f"(account, partition, nodes, ntasks_per_node, gpus_per_node, time, container_image, "
                          f"extra_mounts, env_vars{'; from this file: ' + given if given else ''}) or a skypilot: "
                          "section, and remove nemo_run:")
    out: dict[str, dict[str, tp.Any]] = {"interactive": {}}
    for key, value in overrides.items():
        if key not in LOCAL_KEYS:
            raise ConfigError(f"nemo_run.{key}", value, f"one of {', '.join(LOCAL_KEYS)} with executor: local (a "
                              "local run is torchrun on this node); for Slurm write a slurm: section, for a "
                              "cloud a skypilot: section")
        target_section, target = LOCAL_KEYS[key]
        out[target_section][target] = str(value)
    return out
