"""The planner's plans as hashes, to show a faster planner plans the same (issue 33).

Plans `sweep.py`'s 100,000-node fleet (`bench`) and 3,000- and 20,000-node mixed fleets under
three other policies (`mixed`: canary, growth, home placement, blackouts, windows, livepatch,
packages and kernel targets, every checkpoint engine and workload policy, owners, exposed
receivers), and prints the SHA-256 of each plan's JSON (key order kept) with its CPU seconds.
Run it from each checkout's root (the planner imported is the current directory's) and compare:

    .venv/bin/python bench/planner_hash.py bench mixed
    (cd ../other-checkout && .venv/bin/python "$OLDPWD/bench/planner_hash.py" bench mixed)
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import time
from datetime import UTC, datetime, timedelta

sys.path.insert(0, ".")  # the planner of the checkout it runs in

from campaigns.planner import PlanNode, PlanWorkload, Policy, parse_blackouts, parse_windows, plan

START = datetime(2026, 12, 1, tzinfo=UTC)


def bench_fleet(count: int) -> tuple[list[PlanNode], list[PlanNode], Policy]:
    """The fleet and policy of bench.sweep.bench_planner."""
    rng = random.Random(7)
    nodes = [
        PlanNode(id=i, name=f"n{i:05d}", cluster=f"c{i % 4}", pool=f"p{i % 20}", gpu_model="H100", gpu_count=8,
                 versions={"driver": "570.86.15" if i % 3 else "535.183.01", "cuda": "12.8"},
                 workloads=tuple(PlanWorkload(ref=f"w{i}-{j}", gpus=2, checkpoint_engine=("cuda", "signal")[j % 2])
                                 for j in range(2)),
                 target={"driver": "570.195.03" if i % 3 else "535.247.01"},
                 deadline=START + timedelta(days=rng.randint(5, 60)))
        for i in range(count)
    ]
    receivers = [PlanNode(id=count + i, name=f"r{i}", cluster=f"c{i % 4}", pool="spare", gpu_model="H100",
                          gpu_count=8, versions={"driver": "570.86.15", "cuda": "12.8"}) for i in range(count // 20)]
    policy = Policy(start=START, per_cluster="5%", per_pool="20%", cold_restart_allowed=True,
                    windows=parse_windows([{"days": [0, 1, 2, 3, 4], "start": "22:00", "end": "06:00",
                                            "tz": "Europe/Berlin"}]))
    return nodes, receivers, policy


def mixed_fleet(count: int, seed: int) -> tuple[list[PlanNode], list[PlanNode]]:
    rng = random.Random(seed)
    targets = [{"driver": "570.195.03"}, {"kernel": "6.8.0-50"}, {"livepatch": "5"}, {"packages": "x"},
               {"driver": "570.195.03", "kernel": "6.8.0-50"}, {"livepatch": "5", "packages": "y"}]
    remedies = {"kernel": "reboot", "livepatch": "livepatch", "packages": "packages"}

    def versions() -> dict[str, str]:
        return {"driver": rng.choice(["570.86.15", "535.183.01", "550.1"]), "cuda": rng.choice(["12.8", "12.4"]),
                "kernel": rng.choice(["6.8.0-40", "6.8.0-45"]), "criu": "4.0"}

    nodes = []
    for i in range(count):
        workloads = tuple(
            PlanWorkload(ref=f"w{i}-{j}", name=rng.choice(["", f"job{i}-{j}"]), gpus=rng.choice([0, 1, 2, 4]),
                         policy=rng.choice(["checkpoint", "checkpoint", "checkpoint", "wait", "cold_restart"]),
                         checkpoint_engine=rng.choice(["cuda", "signal", "criu"]),
                         inference_engine=rng.choice(["", "", "triton"]), engine_version=rng.choice(["", "24.1"]),
                         model_name=rng.choice(["", "llama"]), owner=rng.choice(["", "", "slurm", "k8s-deploy"]),
                         requires=rng.choice([(), (("nccl", "2.21"),)]))
            for j in range(rng.randint(0, 4)))
        target = dict(rng.choice(targets))
        remedy = remedies.get(next(iter(target)), "") if rng.random() < 0.7 else ""
        nodes.append(PlanNode(
            id=i, name=f"n{i:05d}", cluster=f"c{i % 5}", pool=f"p{rng.randint(0, 7)}",
            gpu_model=rng.choice(["H100", "A100"]), gpu_count=rng.choice([4, 8]), versions=versions(),
            workloads=workloads, target=target, remedy=remedy, last=rng.random() < 0.05,
            deadline=rng.choice([None, START + timedelta(days=rng.randint(1, 90))])))
    receivers = [PlanNode(id=count + i, name=f"r{i:04d}", cluster=f"c{i % 5}", pool="spare",
                          gpu_model=rng.choice(["H100", "A100"]), gpu_count=8, versions=versions(),
                          exposed_to=rng.choice([(), (), ("CVE-1",), ("CVE-1", "CVE-2")]))
                 for i in range(count // 15)]
    return nodes, receivers


def policies() -> list[Policy]:
    return [
        Policy(start=START, per_cluster="3%", canary="auto", soak_s=3600, growth="exponential", growth_step=2,
               deadline=START + timedelta(days=20), restarters={"c1": "slurm"},
               blackouts=parse_blackouts([{"start": "2026-12-03T00:00:00+00:00",
                                           "end": "2026-12-05T00:00:00+00:00"}])),
        Policy(start=START, per_cluster="10", per_pool="25%", canary="7", growth="linear", growth_step=3,
               placement="home", cold_restart_allowed=True, node_seconds=900,
               windows=parse_windows([{"days": [5, 6], "start": "01:00", "end": "09:00",
                                       "tz": "America/New_York"}])),
        Policy(start=START, per_cluster="20%", per_pool="2", cold_restart_allowed=True,
               restarters={"c0": "k8s", "c3": "slurm"}, deadline=START + timedelta(days=3)),
    ]


def report(label: str, scope: list[PlanNode], receivers: list[PlanNode], policy: Policy) -> None:
    began = time.process_time()
    result = plan(scope, receivers, policy)
    cpu = time.process_time() - began
    digest = hashlib.sha256(json.dumps(result).encode()).hexdigest()[:16]
    print(f"{label} {digest} {cpu:.2f} CPU s", flush=True)


def main() -> None:
    which = sys.argv[1:] or ["bench", "mixed"]
    if "bench" in which:
        report("bench100k", *bench_fleet(100_000))
    if "mixed" in which:
        for count in (3000, 20000):
            scope, receivers = mixed_fleet(count, count)
            for number, policy in enumerate(policies()):
                report(f"mixed{count}-p{number}", scope, receivers, policy)


if __name__ == "__main__":
    main()
