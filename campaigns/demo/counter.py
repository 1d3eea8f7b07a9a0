"""A demo workload that counts steps: `counter.py LOG [INTERVAL]`.

Appends "<step>" to LOG every INTERVAL seconds. It saves itself for the agent's signal engine: on
SIGUSR1 it writes its step to $GPUSWEEP_CHECKPOINT_DIR/state.json and acknowledges with
.gpusweep-ack; started with $GPUSWEEP_RESTORE_DIR it continues from the saved step. So after a
move, the log on the new node goes on from where the old one stopped. Standard library only.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from types import FrameType

log_path = sys.argv[1]
interval = float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
step = 0
restore_dir = os.environ.get("GPUSWEEP_RESTORE_DIR")
if restore_dir:
    with open(os.path.join(restore_dir, "state.json")) as fh:
        step = json.load(fh)["step"]
save_requested = False


def on_usr1(signum: int, frame: FrameType | None) -> None:
    global save_requested
    save_requested = True


signal.signal(signal.SIGUSR1, on_usr1)
with open(log_path, "a", buffering=1) as log:
    while True:
        if save_requested:
            folder = os.environ["GPUSWEEP_CHECKPOINT_DIR"]
            for name in ("state.json", ".gpusweep-ack"):
                with open(os.path.join(folder, name), "w") as fh:
                    json.dump({"step": step}, fh)
            save_requested = False
            time.sleep(3600)  # the agent stops us once it has the state
        step += 1
        log.write(f"{step}\n")
        time.sleep(interval)
