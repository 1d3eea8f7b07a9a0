"""Holds a GPU as a CUDA process does, for tests on machines without one: opens DEVICE (a stand-in
file the node agent is configured to treat as a GPU device, its ``gpu_devices`` setting) and becomes
COMMAND (exec, same pid) with the descriptor still open, so the agent's /proc scan finds COMMAND
holding the GPU and a checkpoint engine saves and restores it with the descriptor.

usage: gpu_holder.py DEVICE COMMAND [ARG...]
"""

import os
import sys

if __name__ == "__main__":
    descriptor = os.open(sys.argv[1], os.O_RDONLY)
    os.set_inheritable(descriptor, True)
    os.execvp(sys.argv[2], sys.argv[2:])
