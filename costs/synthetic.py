"""A second trace in the openb format, generated from a seed: a busier, smaller fleet than the
Alibaba one, to check that what the simulator shows is not a property of one trace.

`nodes_csv(seed)` is a fleet of `sn,cpu_milli,memory_mib,gpu,model` rows (T4 x 4, V100M32 x 8, A10 x 1);
`pods_csv(seed)` is tasks over `days` days: arrivals at a steady rate, durations log-normal (a
median of 6 h), 1 to 4 GPUs or a share of one, a tenth of them services (qos LS, running to the
end), a quarter constrained to GPU models (gpu_spec). The same seed gives the same bytes
(tests/costs/fixtures holds seed 7).
"""

from __future__ import annotations

import math
import random

MODELS = (("T4", 4), ("V100M32", 8), ("A10", 1))
NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
              "scheduled_time")


def nodes_csv(seed: int = 7, count: int = 48) -> str:
    rng = random.Random(seed)
    rows = [NODE_HEADER]
    for i in range(count):
        model, gpus = MODELS[rng.randrange(len(MODELS))]
        rows.append(f"synth-node-{i:04d},64000,262144,{gpus},{model}")
    return "\n".join(rows) + "\n"


def pods_csv(seed: int = 7, count: int = 1500, days: float = 60.0) -> str:
    rng = random.Random(seed)
    end = int(days * 86400)
    rows = [POD_HEADER]
    for i in range(count):
        created = int(rng.uniform(0, end * 0.95))
        scheduled = created + int(rng.expovariate(1 / 600))
        service = rng.random() < 0.1
        deleted = end if service else min(end, scheduled + int(math.exp(rng.gauss(math.log(6 * 3600), 1.0))))
        shared = rng.random() < 0.3
        gpus, milli = (1, rng.choice((250, 500))) if shared else (rng.choice((1, 1, 2, 4)), 1000)
        spec = "|".join(sorted(rng.sample([m for m, _g in MODELS], 2))) if rng.random() < 0.25 else ""
        rows.append(f"synth-pod-{i:05d},4000,16384,{gpus},{milli},{spec},{'LS' if service else 'BE'},"
                    f"{'Running' if service else 'Succeeded'},{created},{deleted},{scheduled}")
    return "\n".join(rows) + "\n"
