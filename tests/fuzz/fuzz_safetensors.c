/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser and the fetch layout built on it.
 * Input: 8 bytes little-endian claimed file size, then the header JSON (what a remote hands fetch). Any
 * input must parse or be refused with a message; an accepted header must hold only disjoint tensors inside
 * the data region, with shapes whose element counts and byte sizes do not overflow. */
#include <stdint.h>
#include <string.h>
#include "common/util.h"
#include "install/fetch_plan.h"
#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    uint64_t file_size = 0;
    for (int i = 7; i >= 0; i--) file_size = file_size << 8 | data[i];
    const char *json = (const char *)data + 8;
    uint64_t hl = size - 8;
    st_file f;
    df_error err = {0};
    if (st_header_parse(&f, "fuzz.safetensors", json, hl, file_size, &err)) {
        DF_ASSERT(err.code && err.msg[0]);
        return 0;
    }
    uint64_t data_len = file_size - 8 - hl, covered = 0;
    for (int i = 0; i < f.n_tensors; i++) {
        const st_tensor *t = &f.tensors[i];
        DF_ASSERT(t->begin <= t->end && t->end <= data_len && !t->data);
        covered += t->end - t->begin;
        df_tensor v;
        if (!st_tensor_view(&f, t, &v, &err)) {
            int64_t n = tensor_numel(&v);   /* UBSan: no signed overflow */
            DF_ASSERT(n >= 0 && (uint64_t)n * (uint64_t)t->elem_size == t->end - t->begin);
            if (v.ndim == 2) (void)tensor_row_bytes(&v);
        }
    }
    DF_ASSERT(covered == f.covered && covered <= data_len);
    st_file_close(&f);
    fplan_layout L;
    DF_ASSERT(!fplan_layout_parse(&L, "fuzz.safetensors", json, hl, file_size, &err));
    uint64_t end = 0;   /* runs and holes: disjoint, inside the file, the header run first */
    DF_ASSERT(L.n_runs >= 1 && L.runs[0].off == 0 && L.runs[0].len >= 8 + hl);
    for (int i = 0, r = 0, h = 0; i < L.n_runs + L.n_holes; i++) {
        int take_run = h == L.n_holes || (r < L.n_runs && L.runs[r].off < L.holes[h].span.off);
        dc_span s = take_run ? L.runs[r++] : L.holes[h++].span;
        DF_ASSERT(s.off >= end && s.len > 0 && s.off + s.len <= file_size);
        end = s.off + s.len;
    }
    fplan_layout_free(&L);
    return 0;
}
