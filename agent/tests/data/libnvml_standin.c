/* A stand-in for libnvidia-ml (no GPU here), with the signatures NVML documents for the calls the
 * agent's gpus health check makes. GPUs and driver come from the environment:
 * NVML_STANDIN_COUNT (default 2), NVML_STANDIN_DRIVER (default 570.195.03), NVML_STANDIN_FAIL_INIT. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int nvmlReturn_t;
typedef struct { unsigned int index; } device_t;
typedef device_t *nvmlDevice_t;
static device_t devices[16];

nvmlReturn_t nvmlInit_v2(void) { return getenv("NVML_STANDIN_FAIL_INIT") ? 9 /* DRIVER_NOT_LOADED */ : 0; }
nvmlReturn_t nvmlShutdown(void) { return 0; }

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    const char *env = getenv("NVML_STANDIN_COUNT");
    *count = env ? (unsigned int)atoi(env) : 2;
    return 0;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (index >= 16) return 2; /* INVALID_ARGUMENT */
    devices[index].index = index;
    *device = &devices[index];
    return 0;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    (void)device;
    snprintf(name, length, "NVIDIA H100 80GB HBM3");
    return 0;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    snprintf(uuid, length, "GPU-00000000-0000-4000-8000-%012u", device->index);
    return 0;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *env = getenv("NVML_STANDIN_DRIVER");
    snprintf(version, length, "%s", env ? env : "570.195.03");
    return 0;
}
