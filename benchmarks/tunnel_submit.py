"""Submit time of a 200-point sweep through ``slurm.tunnel`` next to the same sweep submitted here.

    .venv/bin/python benchmarks/tunnel_submit.py [--points 200] [--rounds 2] [--json out.json]

Needs root and the packages of ``scripts/install-slurm-deps`` (the test cluster and openssh-server). It brings the
test cluster up (``scripts/slurm-cluster up --accounting``, left as it was found), starts the tests' sshd on
loopback (``tests/ssh_server.py``), and times, from command start to exit, ``train.py -m x=range(0,N)`` of a
one-function recipe in a fresh git repo with ``slurm.detach=true`` and the jobs held (``sbatch --hold``, cancelled
after each round, so no job runs and loads the machine):

* ``local``: sbatch of this machine (``SLURM_CONF`` set);
* ``tunnel``: a shell with no Slurm client and no ``SLURM_CONF``, through the sshd (ssh, one ControlMaster
  connection: the probe, one tar stream with 200 jobs' launch files and the snapshot, one sbatch).

Rounds alternate the order (local, tunnel, then tunnel, local). Prints ``name=value`` lines and the medians.

Measured while building this (2 shared CPUs, load average 4-6 from other users' tests; 2 rounds; root's
``~/.bashrc`` here runs ``pyenv init``, which adds ~0.3 s to every remote command)::

    submit_200_local_s=3.40      # 3.45, 3.36
    submit_200_tunnel_s=7.75     # 7.87, 7.64
    tunnel_submit_ratio=2.278
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests import ssh_server  # noqa: E402
from tests.test_slurm_tunnel import JOB, local_env, user_repo  # noqa: E402


def run(argv: list[str], env: dict[str, str], cwd: Path) -> float:
    began = time.monotonic()
    proc = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=900)
    took = time.monotonic() - began
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed ({proc.returncode}):\n{proc.stdout[-2000:]}"
                         f"{proc.stderr[-2000:]}")
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    cluster_env = {**os.environ}
    subprocess.run([str(ROOT / "scripts" / "slurm-cluster"), "up", "--accounting"], env=cluster_env, check=True,
                   capture_output=True, timeout=300)
    state = Path(os.environ.get("SLURM_CLUSTER_DIR") or ROOT / ".slurm-cluster").resolve()
    conf = state / "etc" / "slurm.conf"
    work = Path(tempfile.mkdtemp(prefix="tunnel-bench-"))
    (work / "sshd").mkdir()
    server, proc = ssh_server.start(work / "sshd")
    times: dict[str, list[float]] = {"local": [], "tunnel": []}
    try:
        repo = user_repo(work)
        assert (repo / "job.yaml").read_text() == JOB
        sweep = ["-m", f"x=range(0,{args.points})", "+slurm.detach=true", "+slurm.sbatch_args.hold=null"]
        base = [sys.executable, str(ROOT / "train.py"), "--config-dir", str(repo), "--config-name", "job"]
        envs = {"local": {**os.environ, "SLURM_CONF": str(conf), "PYTHONPATH": str(repo)},
                "tunnel": {**local_env(work), "PYTHONPATH": str(repo)}}
        for r in range(args.rounds):
            for kind in (("local", "tunnel") if r % 2 == 0 else ("tunnel", "local")):
                out = f"multirun/{kind}-{r}"
                extra = server.overrides(work / "remote") if kind == "tunnel" else []
                took = run([*base, *sweep, *extra, f"hydra.sweep.dir={out}"], envs[kind], repo)
                times[kind].append(took)
                print(f"round {r} {kind}: {took:.2f} s", file=sys.stderr, flush=True)
                subprocess.run(["scancel", "--user", str(os.geteuid() and os.environ.get("USER") or "root")],
                               env={**os.environ, "SLURM_CONF": str(conf)}, capture_output=True)
                shutil.rmtree(repo / out, ignore_errors=True)
    finally:
        ssh_server.stop(proc)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"submit_{args.points}_local_s={med['local']:.2f}")
    print(f"submit_{args.points}_tunnel_s={med['tunnel']:.2f}")
    print(f"tunnel_submit_ratio={med['tunnel'] / med['local']:.3f}")
    if args.json:
        args.json.write_text(json.dumps({"points": args.points, "runs": times, "median": med}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
