"""A test workload: holds MB of state in memory and appends a step counter to a log.

usage: counter.py LOG MEGABYTES [INTERVAL]

Every step checks one byte of the state against its expected value (so a restore that lost or
mangled memory shows as BAD lines) and appends "<step> ok" to LOG. For the signal engine it also
saves itself: on SIGUSR1 it writes its step to $GPUSWEEP_CHECKPOINT_DIR/state.json and
acknowledges with .gpusweep-ack; started with $GPUSWEEP_RESTORE_DIR it continues from the saved step.
With $COUNTER_STDOUT set it prints each step line to its standard output too (a job's output file).
"""

import json
import os
import signal
import sys
import time

log_path, megabytes = sys.argv[1], int(sys.argv[2])
interval = float(sys.argv[3]) if len(sys.argv) > 3 else 0.02
size = megabytes * 1024 * 1024
# Real data in every page, so a checkpoint has to carry all of it.
state = bytearray(bytes(range(256)) * (size // 256))
step = 0
restore_dir = os.environ.get("GPUSWEEP_RESTORE_DIR")
if restore_dir:
    with open(os.path.join(restore_dir, "state.json")) as fh:
        step = json.load(fh)["step"]
save_requested = False


def on_usr1(signum, frame):
    global save_requested
    save_requested = True


signal.signal(signal.SIGUSR1, on_usr1)
log = open(log_path, "a", buffering=1)
echo = bool(os.environ.get("COUNTER_STDOUT"))
while True:
    if save_requested:
        folder = os.environ["GPUSWEEP_CHECKPOINT_DIR"]
        with open(os.path.join(folder, "state.json"), "w") as fh:
            json.dump({"step": step}, fh)
        with open(os.path.join(folder, ".gpusweep-ack"), "w") as fh:
            json.dump({"step": step}, fh)
        save_requested = False
        time.sleep(3600)  # the agent stops us once it has the state
    step += 1
    index = (step * 4096 * 7919) % len(state)
    line = f"{step} {'ok' if state[index] == index % 256 else 'BAD'}\n"
    log.write(line)
    if echo:
        sys.stdout.write(line)
        sys.stdout.flush()
    time.sleep(interval)
