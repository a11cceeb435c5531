/* cuda_api.h — the few CUDA driver and NVRTC types, constants and entry points the GPU backend uses, declared
 * here so that the binary builds without a CUDA toolkit: both libraries are found at run time (dlopen) and
 * their functions resolved by name into a cu_api table (loader.c). The values are those of the driver API's
 * cuda.h and nvrtc.h (ABI-stable: the driver keeps old entry points for old binaries). */
#ifndef DF_CUDA_API_H
#define DF_CUDA_API_H

#include <stddef.h>
#include "deltafin.h"

typedef int CUresult;             /* CUDA_SUCCESS = 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
typedef int nvrtcResult;          /* NVRTC_SUCCESS = 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

enum {
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_STREAM_NON_BLOCKING = 1,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CU_EVENT_DEFAULT = 0,
    CU_MEMHOSTREGISTER_PORTABLE = 1,
};

/* The resolved entry points; NULL members were not found (only optional ones may be). */
typedef struct cu_api {
    void *cuda_lib, *nvrtc_lib;
    int driver_version;            /* cuDriverGetVersion, e.g. 13000 */
    int nvrtc_major, nvrtc_minor;
    CUresult (*cuInit)(unsigned flags);
    CUresult (*cuDriverGetVersion)(int *v);
    CUresult (*cuDeviceGetCount)(int *n);
    CUresult (*cuDeviceGet)(CUdevice *d, int ordinal);
    CUresult (*cuDeviceGetName)(char *name, int len, CUdevice d);
    CUresult (*cuDeviceGetAttribute)(int *v, int attrib, CUdevice d);
    CUresult (*cuDeviceTotalMem)(size_t *bytes, CUdevice d);
    CUresult (*cuDevicePrimaryCtxRetain)(CUcontext *ctx, CUdevice d);
    CUresult (*cuDevicePrimaryCtxRelease)(CUdevice d);
    CUresult (*cuCtxSetCurrent)(CUcontext ctx);
    CUresult (*cuCtxSynchronize)(void);
    CUresult (*cuMemGetInfo)(size_t *free_b, size_t *total_b);
    CUresult (*cuMemAlloc)(CUdeviceptr *p, size_t bytes);
    CUresult (*cuMemFree)(CUdeviceptr p);
    CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void *src, size_t bytes);
    CUresult (*cuMemcpyDtoH)(void *dst, CUdeviceptr src, size_t bytes);
    CUresult (*cuMemcpyDtoD)(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
    CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr dst, const void *src, size_t bytes, CUstream s);
    CUresult (*cuMemcpyDtoHAsync)(void *dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s);
    CUresult (*cuMemsetD8)(CUdeviceptr p, unsigned char v, size_t n);
    CUresult (*cuMemsetD8Async)(CUdeviceptr p, unsigned char v, size_t n, CUstream s);
    CUresult (*cuMemHostRegister)(void *p, size_t bytes, unsigned flags);
    CUresult (*cuMemHostUnregister)(void *p);
    CUresult (*cuModuleLoadData)(CUmodule *m, const void *image);
    CUresult (*cuModuleUnload)(CUmodule m);
    CUresult (*cuModuleGetFunction)(CUfunction *f, CUmodule m, const char *name);
    CUresult (*cuFuncSetAttribute)(CUfunction f, int attrib, int value);
    CUresult (*cuLaunchKernel)(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                               unsigned bz, unsigned shared, CUstream s, void **params, void **extra);
    CUresult (*cuStreamCreate)(CUstream *s, unsigned flags);
    CUresult (*cuStreamDestroy)(CUstream s);
    CUresult (*cuStreamSynchronize)(CUstream s);
    CUresult (*cuEventCreate)(CUevent *e, unsigned flags);
    CUresult (*cuEventDestroy)(CUevent e);
    CUresult (*cuEventRecord)(CUevent e, CUstream s);
    CUresult (*cuEventSynchronize)(CUevent e);
    CUresult (*cuEventElapsedTime)(float *ms, CUevent a, CUevent b);
    CUresult (*cuStreamBeginCapture)(CUstream s, int mode);
    CUresult (*cuStreamEndCapture)(CUstream s, CUgraph *g);
    CUresult (*cuGraphInstantiate)(CUgraphExec *e, CUgraph g, unsigned long long flags);
    CUresult (*cuGraphLaunch)(CUgraphExec e, CUstream s);
    CUresult (*cuGraphExecDestroy)(CUgraphExec e);
    CUresult (*cuGraphDestroy)(CUgraph g);
    CUresult (*cuGetErrorString)(CUresult r, const char **s);
    nvrtcResult (*nvrtcVersion)(int *major, int *minor);
    nvrtcResult (*nvrtcCreateProgram)(nvrtcProgram *p, const char *src, const char *name, int n_headers,
                                      const char *const *headers, const char *const *include_names);
    nvrtcResult (*nvrtcCompileProgram)(nvrtcProgram p, int n_opts, const char *const *opts);
    nvrtcResult (*nvrtcGetProgramLogSize)(nvrtcProgram p, size_t *n);
    nvrtcResult (*nvrtcGetProgramLog)(nvrtcProgram p, char *log);
    nvrtcResult (*nvrtcGetCUBINSize)(nvrtcProgram p, size_t *n);
    nvrtcResult (*nvrtcGetCUBIN)(nvrtcProgram p, char *cubin);
    nvrtcResult (*nvrtcDestroyProgram)(nvrtcProgram *p);
    const char *(*nvrtcGetErrorString)(nvrtcResult r);
} cu_api;

/* Where the libraries are looked for: $DELTAFIN_LIBCUDA (a path) or libcuda.so.1; $DELTAFIN_LIBNVRTC or
 * libnvrtc.so.13, then libnvrtc.so.12. */
int cu_api_load_driver(cu_api *a, df_error *err);
/* NVRTC, once the driver is loaded (a compile needs it only when the kernel cache misses). */
int cu_api_load_nvrtc(cu_api *a, df_error *err);
void cu_api_unload(cu_api *a);
/* The driver's message for r ("unknown" when it has none). */
const char *cu_api_errstr(const cu_api *a, CUresult r);

#endif
