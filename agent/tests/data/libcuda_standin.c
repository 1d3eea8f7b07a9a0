/* A stand-in for libcuda's checkpoint entry points, for tests on machines without a GPU.
 * Each call appends "<name> <pid> <arg>" to $CUDA_STANDIN_LOG and tracks the process state the
 * real driver would; $CUDA_STANDIN_FAIL names one call that returns an error (CUDA_ERROR_NOT_READY). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned int timeoutMs; unsigned int reserved0; unsigned long long reserved1[7]; } LockArgs;
static int state = 0; /* running, locked, checkpointed */

static int record(const char *name, int pid, unsigned long long arg) {
    const char *path = getenv("CUDA_STANDIN_LOG");
    if (path) { FILE *f = fopen(path, "a"); if (f) { fprintf(f, "%s %d %llu\n", name, pid, arg); fclose(f); } }
    const char *fail = getenv("CUDA_STANDIN_FAIL");
    return (fail && strcmp(fail, name) == 0) ? 600 : 0;
}

int cuInit(unsigned int flags) { return record("cuInit", 0, flags); }
int cuCheckpointProcessLock(int pid, LockArgs *args) {
    int rc = record("cuCheckpointProcessLock", pid, args ? args->timeoutMs : 0);
    if (!rc) state = 1;
    return rc;
}
int cuCheckpointProcessCheckpoint(int pid, void *args) {
    int rc = record("cuCheckpointProcessCheckpoint", pid, 0);
    if (!rc) state = 2;
    return rc;
}
int cuCheckpointProcessRestore(int pid, void *args) {
    int rc = record("cuCheckpointProcessRestore", pid, 0);
    if (!rc) state = 1;
    return rc;
}
int cuCheckpointProcessUnlock(int pid, void *args) {
    int rc = record("cuCheckpointProcessUnlock", pid, 0);
    if (!rc) state = 0;
    return rc;
}
int cuCheckpointProcessGetState(int pid, int *out) { *out = state; return 0; }
