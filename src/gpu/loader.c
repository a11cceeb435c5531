/* loader.c — finds the CUDA driver and NVRTC at run time (dlopen) and resolves the entry points of cuda_api.h,
 * so that one binary runs with or without a GPU: a machine without them gets a message saying which library
 * is missing, and the CPU path. */
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>
#include "cuda_api.h"
#include "common/util.h"

typedef struct {
    const char *name;    /* the versioned symbol the driver exports for this API */
    size_t off;
    int optional;
} sym;

#define S(field, name) {name, offsetof(cu_api, field), 0}
static const sym driver_syms[] = {
    S(cuInit, "cuInit"), S(cuDriverGetVersion, "cuDriverGetVersion"), S(cuDeviceGetCount, "cuDeviceGetCount"),
    S(cuDeviceGet, "cuDeviceGet"), S(cuDeviceGetName, "cuDeviceGetName"),
    S(cuDeviceGetAttribute, "cuDeviceGetAttribute"), S(cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
    S(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    S(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"), S(cuCtxSetCurrent, "cuCtxSetCurrent"),
    S(cuCtxSynchronize, "cuCtxSynchronize"), S(cuMemGetInfo, "cuMemGetInfo_v2"), S(cuMemAlloc, "cuMemAlloc_v2"),
    S(cuMemFree, "cuMemFree_v2"), S(cuMemcpyHtoD, "cuMemcpyHtoD_v2"), S(cuMemcpyDtoH, "cuMemcpyDtoH_v2"),
    S(cuMemcpyDtoD, "cuMemcpyDtoD_v2"), S(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    S(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"), S(cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"),
    S(cuMemsetD8, "cuMemsetD8_v2"), S(cuMemsetD8Async, "cuMemsetD8Async"),
    S(cuMemHostRegister, "cuMemHostRegister_v2"), S(cuMemHostUnregister, "cuMemHostUnregister"),
    S(cuModuleLoadData, "cuModuleLoadData"), S(cuModuleUnload, "cuModuleUnload"),
    S(cuModuleGetFunction, "cuModuleGetFunction"), S(cuFuncSetAttribute, "cuFuncSetAttribute"),
    S(cuLaunchKernel, "cuLaunchKernel"), S(cuStreamCreate, "cuStreamCreate"),
    S(cuStreamDestroy, "cuStreamDestroy_v2"), S(cuStreamSynchronize, "cuStreamSynchronize"),
    S(cuEventCreate, "cuEventCreate"), S(cuEventDestroy, "cuEventDestroy_v2"), S(cuEventRecord, "cuEventRecord"),
    S(cuEventSynchronize, "cuEventSynchronize"), S(cuEventElapsedTime, "cuEventElapsedTime_v2"),
    S(cuStreamBeginCapture, "cuStreamBeginCapture_v2"), S(cuStreamEndCapture, "cuStreamEndCapture"),
    S(cuGraphInstantiate, "cuGraphInstantiateWithFlags"), S(cuGraphLaunch, "cuGraphLaunch"),
    S(cuGraphExecDestroy, "cuGraphExecDestroy"), S(cuGraphDestroy, "cuGraphDestroy"),
    S(cuGetErrorString, "cuGetErrorString"),
};
static const sym nvrtc_syms[] = {
    S(nvrtcVersion, "nvrtcVersion"), S(nvrtcCreateProgram, "nvrtcCreateProgram"),
    S(nvrtcCompileProgram, "nvrtcCompileProgram"), S(nvrtcGetProgramLogSize, "nvrtcGetProgramLogSize"),
    S(nvrtcGetProgramLog, "nvrtcGetProgramLog"), S(nvrtcGetCUBINSize, "nvrtcGetCUBINSize"),
    S(nvrtcGetCUBIN, "nvrtcGetCUBIN"), S(nvrtcDestroyProgram, "nvrtcDestroyProgram"),
    S(nvrtcGetErrorString, "nvrtcGetErrorString"),
};
#undef S

/* dlsym returns an object pointer; POSIX guarantees it converts to a function pointer, which C11 does not
 * say, so the bytes are copied. */
static int resolve(void *lib, const char *libname, cu_api *a, const sym *tab, size_t n, df_error *err) {
    for (size_t i = 0; i < n; i++) {
        void *p = dlsym(lib, tab[i].name);
        if (!p && !tab[i].optional) {
            df_error_set(err, DF_EUNSUPPORTED, "%s has no %s (a driver older than CUDA 12?)", libname, tab[i].name);
            return DF_EUNSUPPORTED;
        }
        memcpy((char *)a + tab[i].off, &p, sizeof p);
    }
    return DF_OK;
}

int cu_api_load_driver(cu_api *a, df_error *err) {
    memset(a, 0, sizeof *a);
    const char *name = getenv("DELTAFIN_LIBCUDA");
    if (!name || !*name) name = "libcuda.so.1";
    a->cuda_lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!a->cuda_lib) {
        df_error_set(err, DF_EUNSUPPORTED, "no NVIDIA driver: %s cannot be loaded (%s)", name, dlerror());
        return DF_EUNSUPPORTED;
    }
    int rc = resolve(a->cuda_lib, name, a, driver_syms, sizeof driver_syms / sizeof *driver_syms, err);
    if (!rc && a->cuInit(0) != 0) {
        df_error_set(err, DF_EUNSUPPORTED, "the NVIDIA driver (%s) did not initialise: no usable GPU", name);
        rc = DF_EUNSUPPORTED;
    }
    if (!rc) a->cuDriverGetVersion(&a->driver_version);
    if (rc) cu_api_unload(a);
    return rc;
}

int cu_api_load_nvrtc(cu_api *a, df_error *err) {
    if (a->nvrtc_lib) return DF_OK;
    const char *env = getenv("DELTAFIN_LIBNVRTC");
    const char *names[] = {env && *env ? env : "libnvrtc.so.13", env && *env ? NULL : "libnvrtc.so.12"};
    const char *tried = names[0];
    for (int i = 0; i < 2 && !a->nvrtc_lib && names[i]; i++) a->nvrtc_lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!a->nvrtc_lib) {
        df_error_set(err, DF_EUNSUPPORTED, "no NVRTC to compile the GPU kernels: %s%s cannot be loaded", tried,
                     names[1] ? " (nor libnvrtc.so.12)" : "");
        return DF_EUNSUPPORTED;
    }
    int rc = resolve(a->nvrtc_lib, "libnvrtc", a, nvrtc_syms, sizeof nvrtc_syms / sizeof *nvrtc_syms, err);
    if (!rc) a->nvrtcVersion(&a->nvrtc_major, &a->nvrtc_minor);
    if (rc) {
        dlclose(a->nvrtc_lib);
        a->nvrtc_lib = NULL;
    }
    return rc;
}

void cu_api_unload(cu_api *a) {
    if (a->nvrtc_lib) dlclose(a->nvrtc_lib);
    if (a->cuda_lib) dlclose(a->cuda_lib);
    memset(a, 0, sizeof *a);
}

const char *cu_api_errstr(const cu_api *a, CUresult r) {
    const char *s = NULL;
    if (a->cuGetErrorString && a->cuGetErrorString(r, &s) == 0 && s) return s;
    return "unknown error";
}
