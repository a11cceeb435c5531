/* gpu.h — the CUDA backend of the model's seam (model/backend.h), found at run time: the engine asks for it
 * with a device selection ("auto", "off" or an ordinal), and it either takes over the model's operations (every
 * weight copied to device memory, states and activations there, the kernels of kernels.cu) or says why not. */
#ifndef DF_GPU_H
#define DF_GPU_H

#include <stdint.h>
#include "deltafin.h"
#include "model/model.h"

typedef struct gpu_probe {
    int n_devices;             /* 0 when the driver is absent or sees none */
    char reason[256];          /* why no device is usable, when none is */
} gpu_probe;

/* Whether a selection asks for a GPU at all: NULL and "off" do not. */
int gpu_selection_wants(const char *sel);
/* Loads the driver and counts devices (cheap; nothing is kept). */
void gpu_probe_devices(gpu_probe *p);

/* Moves the model onto a GPU: sel "auto" (device 0) or a device ordinal; mem_budget 0 = the device's free memory
 * less a reserve; state_bytes: what the sessions' states are budgeted (counted in the budget). On success the
 * model's ops and backend context are the GPU's; on failure nothing changed and err says why (no driver, no
 * NVRTC, no such device, architecture too old, the model does not fit: both sizes named). */
int gpu_backend_open(df_model *m, const char *sel, uint64_t mem_budget, uint64_t state_bytes, df_error *err);
/* Releases the device copy; the model is back on the CPU ops. Sessions must be freed first. */
void gpu_backend_close(df_model *m);
/* One line for `deltafin info`: the device, its memory, the plan (weights, working memory, states, budget). */
void gpu_backend_describe(const df_model *m, char *buf, size_t cap);

/* The device's memory read rate in GB/s, measured now (a few passes over a buffer many times its L2, the best);
 * 0 when it cannot be measured. */
double gpu_backend_read_gbps(df_model *m);
/* The weight bytes one decode token reads on the device (spine matrices but the embedding table, top-k experts). */
uint64_t gpu_backend_decode_bytes(const df_model *m);

#endif
