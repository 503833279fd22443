/* A stand-in for NVIDIA's libnvidia-ml.so.1, for tests on machines without a GPU.
 *
 * Each call reads the state the test writes into the file named by FAKE_NVML_STATE,
 * one line per GPU: "sm_mhz mem_mhz power_mw temp_c util_pct reasons", and counts the
 * reads in FAKE_NVML_STATE.reads, so a test can wait until its state was sampled.
 * Only the entry points profiler/gpu_state.py uses, with NVML's signatures.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
enum { SUCCESS = 0, INVALID_ARGUMENT = 2, NOT_FOUND = 6, UNKNOWN = 999 };
#define MAX_GPUS 8

static int read_state(unsigned int gpu, unsigned long long v[6]) {
    const char *path = getenv("FAKE_NVML_STATE");
    if (!path) return UNKNOWN;
    FILE *f = fopen(path, "r");
    if (!f) return UNKNOWN;
    int found = NOT_FOUND;
    for (unsigned int i = 0; i <= gpu; i++) {
        if (fscanf(f, "%llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6) break;
        if (i == gpu) found = SUCCESS;
    }
    fclose(f);
    return found;
}

static void count_read(void) {
    char reads[4096];
    const char *path = getenv("FAKE_NVML_STATE");
    if (!path || snprintf(reads, sizeof reads, "%s.reads", path) >= (int)sizeof reads) return;
    FILE *f = fopen(reads, "a");
    if (f) { fputc('.', f); fclose(f); }
}

int nvmlInitWithFlags(unsigned int flags) { (void)flags; return getenv("FAKE_NVML_STATE") ? SUCCESS : UNKNOWN; }
int nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
int nvmlShutdown(void) { return SUCCESS; }
const char *nvmlErrorString(int r) { return r == NOT_FOUND ? "Not Found" : "Unknown Error"; }

int nvmlDeviceGetCount_v2(unsigned int *n) {
    unsigned long long v[6];
    unsigned int i = 0;
    while (i < MAX_GPUS && read_state(i, v) == SUCCESS) i++;
    *n = i;
    return SUCCESS;
}

int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
    unsigned long long v[6];
    if (read_state(i, v) != SUCCESS) return INVALID_ARGUMENT;
    *h = (void *)(unsigned long)(i + 1);
    return SUCCESS;
}

static int field(void *h, int k, unsigned long long *out) {
    unsigned long long v[6];
    int r = read_state((unsigned int)(unsigned long)h - 1, v);
    if (r == SUCCESS) *out = v[k];
    return r;
}

int nvmlDeviceGetClockInfo(void *h, int type, unsigned int *mhz) {  /* 1: SM, 2: memory */
    unsigned long long v = 0;
    int r = field(h, type == 2 ? 1 : 0, &v);
    *mhz = (unsigned int)v;
    return r;
}

int nvmlDeviceGetPowerUsage(void *h, unsigned int *mw) {
    unsigned long long v = 0;
    int r = field(h, 2, &v);
    *mw = (unsigned int)v;
    return r;
}

int nvmlDeviceGetTemperature(void *h, int sensor, unsigned int *c) {
    unsigned long long v = 0;
    int r = field(h, 3, &v);
    (void)sensor;
    *c = (unsigned int)v;
    return r;
}

int nvmlDeviceGetUtilizationRates(void *h, nvmlUtilization_t *u) {
    unsigned long long v = 0;
    int r = field(h, 4, &v);
    u->gpu = (unsigned int)v;
    u->memory = 0;
    return r;
}

int nvmlDeviceGetCurrentClocksEventReasons(void *h, unsigned long long *bits) {
    int r = field(h, 5, bits);
    count_read();  /* the last figure of a sample */
    return r;
}
