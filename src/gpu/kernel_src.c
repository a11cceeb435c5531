/* kernel_src.c — the embedded CUDA source of the GPU kernels (generated from kernels.cu at build time by
 * scripts/embed-cu.sh into $(B)/gen/gpu_kernels.inc) and the names of the kernels the backend uses. */
#include <string.h>
#include "kcache.h"
#include "gpu_kernels.inc"

const char *const gpu_kernel_names[] = {
    "k_matmul", "k_add", "k_sigmoid", "k_mul_sigmoid", "k_glu", "k_copy2d", "k_embed", "k_rmsnorm",
    "k_gated_norm", "k_kda_conv", "k_kda_conv_hist", "k_kda_gate", "k_l2norm", "k_kda_recur", "k_mla_qlat",
    "k_mla_attn", "k_mla_uv", "k_route", "k_moe_gate_up", "k_moe_down", "k_moe_sum", "k_attn_res", "k_read", "k_mla_append", "k_matmul1",
};
const int gpu_kernel_count = (int)(sizeof gpu_kernel_names / sizeof *gpu_kernel_names);

const char *gpu_kernel_source(size_t *len) {
    if (len) *len = sizeof gpu_kernels_cu - 1;
    return gpu_kernels_cu;
}
