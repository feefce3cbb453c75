/* A fake NVML: the handful of entry points coexec's GPU telemetry calls,
 * answering for two devices with fixed readings, so that a test can load it
 * as the driver's `libnvidia-ml.so.1` and check what reaches /metrics.
 * Device 0 is a whole GPU; device 1 a MIG instance, which (like a real one)
 * does not report utilisation. The readings are those the test expects. */
#include <stdio.h>
#include <string.h>

enum { OK = 0, INVALID_ARGUMENT = 2, NOT_SUPPORTED = 3, NOT_FOUND = 6 };

typedef struct {
    const char *uuid, *name;
    int has_utilization;
    unsigned gpu, memory; /* percent */
    unsigned long long total, free, used; /* bytes */
    unsigned milliwatts, celsius, sm_mhz;
} fake_gpu;

static fake_gpu gpus[2] = {
    {"GPU-fake-a", "Fake H200", 1, 37, 12, 4ULL << 30, 3ULL << 30, 1ULL << 30, 123456, 61, 1755},
    {"MIG-fake-b", "Fake H200 MIG 1g.18gb", 0, 0, 0, 18ULL << 30, 16ULL << 30, 2ULL << 30, 234567, 62, 1980},
};

typedef struct { unsigned gpu, memory; } utilization;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } memory_v2;

int nvmlInit_v2(void) { return OK; }
int nvmlShutdown(void) { return OK; }
const char *nvmlErrorString(int code) { (void)code; return "fake NVML error"; }
int nvmlDeviceGetCount_v2(unsigned *n) { *n = 2; return OK; }

int nvmlDeviceGetHandleByIndex_v2(unsigned i, void **device) {
    if (i >= 2) return INVALID_ARGUMENT;
    *device = &gpus[i];
    return OK;
}

int nvmlDeviceGetHandleByUUID(const char *uuid, void **device) {
    for (int i = 0; i < 2; i++)
        if (strcmp(uuid, gpus[i].uuid) == 0) {
            *device = &gpus[i];
            return OK;
        }
    return NOT_FOUND;
}

int nvmlDeviceGetUUID(void *device, char *out, unsigned length) {
    snprintf(out, length, "%s", ((fake_gpu *)device)->uuid);
    return OK;
}

int nvmlDeviceGetName(void *device, char *out, unsigned length) {
    snprintf(out, length, "%s", ((fake_gpu *)device)->name);
    return OK;
}

int nvmlDeviceGetUtilizationRates(void *device, utilization *u) {
    fake_gpu *g = device;
    if (!g->has_utilization) return NOT_SUPPORTED;
    u->gpu = g->gpu;
    u->memory = g->memory;
    return OK;
}

int nvmlDeviceGetMemoryInfo_v2(void *device, memory_v2 *m) {
    fake_gpu *g = device;
    m->total = g->total;
    m->reserved = 0;
    m->free = g->free;
    m->used = g->used;
    return OK;
}

int nvmlDeviceGetPowerUsage(void *device, unsigned *milliwatts) {
    *milliwatts = ((fake_gpu *)device)->milliwatts;
    return OK;
}

int nvmlDeviceGetTemperature(void *device, int sensor, unsigned *celsius) {
    if (sensor != 0 /* NVML_TEMPERATURE_GPU */) return INVALID_ARGUMENT;
    *celsius = ((fake_gpu *)device)->celsius;
    return OK;
}

int nvmlDeviceGetClockInfo(void *device, int clock, unsigned *mhz) {
    if (clock != 1 /* NVML_CLOCK_SM */) return NOT_SUPPORTED;
    *mhz = ((fake_gpu *)device)->sm_mhz;
    return OK;
}
