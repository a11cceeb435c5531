/* kernels.c — ISA selection and the pooled entry points the model calls. */
#include <stdlib.h>
#include <string.h>
#include "kernels.h"
#include "../common/util.h"

const df_kernels *const *kern_available(void) {
    static const df_kernels *list[8];
    int n = 0;
    list[n++] = kern_scalar();
    list[n] = NULL;
    return list;
}

int kern_init(df_kern *kc, int n_threads, const char *isa) {
    memset(kc, 0, sizeof *kc);
    if (!isa) isa = getenv("DELTAFIN_ISA");
    const df_kernels *const *av = kern_available();
    kc->k = av[0];
    if (isa && *isa) {
        kc->k = NULL;
        for (int i = 0; av[i]; i++)
            if (!strcmp(av[i]->isa, isa)) kc->k = av[i];
        if (!kc->k) return -1;
    }
    kc->n_threads = n_threads > 0 ? n_threads : 1;
    return 0;
}

void kern_free(df_kern *kc) { memset(kc, 0, sizeof *kc); }

void kern_matmul(df_kern *kc, const df_tensor *w, const float *x, int n, float *y) {
    DF_ASSERT(w->ndim == 2);
    kc->k->matmul_rows(w, 0, w->shape[0], x, n, y, w->shape[0]);
}

void kern_matmul_t(df_kern *kc, const df_tensor *w, const float *x, int n, float *y) {
    (void)kc;
    DF_ASSERT(w->ndim == 2);
    int64_t rows = w->shape[0], cols = w->shape[1];
    float *row = xmalloc(cols * sizeof(float));
    memset(y, 0, (size_t)n * cols * sizeof(float));
    for (int64_t r = 0; r < rows; r++) {
        tensor_row_f32(w, r, row);
        for (int i = 0; i < n; i++) {
            float a = x[(int64_t)i * rows + r];
            float *yi = y + (int64_t)i * cols;
            for (int64_t c = 0; c < cols; c++) yi[c] += a * row[c];
        }
    }
    free(row);
}
