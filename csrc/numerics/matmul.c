/* The canonical trainer's MATMUL epilogue in one call (vtrain/numerics/native_rows.py,
 * matmul_round_norm; canonical.round_canonical_matmul).
 *
 * It runs, on the same values, the kernels the Python path calls one by one for a MATMUL whose
 * bound is the Cauchy-Schwarz norm bound (executor._norm_bound):
 *
 *   vt_row_norms32        the FP64 row norms of A [batches * m, k] and of B [batches * ncols, k],
 *   v += bias             torch's v.add_(bias.double()): one IEEE addition per element;
 *   vt_round_filter_norm  r = RN32(v) and the candidates under the Cauchy-Schwarz product;
 *   vt_row_norms1inf32,   where those are more than 1/16 of the rows of A and B: the 1- and inf-norms
 *   vt_refine_norm3       and the candidates that stay candidates under the smallest of the
 *                         Cauchy-Schwarz and the two Hoelder products (vt_round_filter_norm3's list:
 *                         fewer exact rows where rows are peaked, a softmax gradient against a wide
 *                         head); where they are few, the tight re-filter below drops the rest as
 *                         cheaply as the Hoelder norms would have (no output or log entry depends on
 *                         which bound picked a candidate: the decisions are on the exact values);
 *   vt_rows_decide        the tight re-filter and the decisions of the candidates (when every r is
 *                         finite), written into r where none needs more (vt_rows_decide_into's rule);
 *
 * so its results are theirs, bit for bit (tests/test_native_rows.py compares them). Compiled with -ffp-contract=off and without
 * -ffast-math, as every kernel of the library. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define VT_EXPORT __attribute__((visibility("default")))

/* The kernels composed here (filter.c, rows.c). */
void vt_row_norms32(const float *x, int64_t rows, int64_t k, double *out);
int64_t vt_round_filter_norm(const double *v, int64_t rows, int64_t m, int64_t ncols, const double *na,
                             const double *nb, const double *bias, double sub, double factor, double scale,
                             float *r, int64_t *idx, uint32_t *nonfinite);
void vt_row_norms1inf32(const float *x, int64_t rows, int64_t k, double *n1, double *ninf);
int64_t vt_refine_norm3(const double *v, int64_t m, int64_t ncols, const double *na, const double *nb,
                        const double *na1, const double *nai, const double *nb1, const double *nbi,
                        const double *bias, double sub, double factor, double scale, float *r, int64_t *idx,
                        int64_t count);
int64_t vt_round_filter_norm3(const double *v, int64_t rows, int64_t m, int64_t ncols, const double *na,
                              const double *nb, const double *na1, const double *nai, const double *nb1,
                              const double *nbi, const double *bias, double sub, double factor, double scale,
                              float *r, int64_t *idx, uint32_t *nonfinite);
int64_t vt_rows_decide(int32_t src, const float *a, const float *b, const float *bias, int64_t m, int64_t k,
                       int64_t ncols, const void *x, int64_t n, int64_t limit, int32_t kind, const int64_t *cand,
                       int64_t c, const double *v, const float *r, double coef, double band, int64_t *out);

enum { SRC_MATMUL = 0, KIND_MATMUL = 0, CODE_NONE = 0 };
/* status[] slots */
enum { ST_NONFINITE = 0, ST_KEPT = 1, ST_ATTENTION = 2, ST_SPILL = 3, ST_ENTRIES = 4 };
enum { CODE_EXPLICIT = 3 };

/* The decided rows' bits into r at their element indices (canonical zero), as vt_rows_decide_into. */
static void write_decided(const int64_t *o, int64_t c, int64_t kept, float *r) {
    for (int64_t j = 0; j < kept; j++) {
        uint32_t bits = (uint32_t)o[c + j];
        float f;
        memcpy(&f, &bits, sizeof f);
        r[o[j]] = f + 0.0f;
    }
}

/* Where every kept row is decided: the rows due an entry (a code) moved to the front of the
 * decisions as [index, value bits (the canonical-zero FP32 value of an explicit entry, else 0), code],
 * in order, in place; returns their count. */
static int64_t compact_entries(int64_t *o, int64_t c, int64_t kept) {
    int64_t e = 0;
    for (int64_t j = 0; j < kept; j++) {
        const int64_t code = o[2 * c + j];
        if (code == CODE_NONE) continue;
        uint32_t bits = 0;
        if (code == CODE_EXPLICIT) {
            uint32_t raw = (uint32_t)o[c + j];
            float f;
            memcpy(&f, &raw, sizeof f);
            f = f + 0.0f;
            memcpy(&bits, &f, sizeof bits);
        }
        o[e] = o[j];
        o[c + e] = bits;
        o[2 * c + e] = code;
        e++;
    }
    return e;
}

/* How many kept rows need the caller's full path: undecided, or due an entry. */
static int64_t needing_attention(const int64_t *o, int64_t c, int64_t kept) {
    int64_t attention = 0;
    for (int64_t j = 0; j < kept; j++) attention += !o[3 * c + j] || o[2 * c + j] != CODE_NONE;
    return attention;
}

/* The norm-bound epilogue's shared first steps (here and replay.c's vt_replay_matmul_norm): the FP64
 * row norms of A [batches * m, k] into na and of B [batches * ncols, k] into nb, the bias in FP64 into
 * bias64 (when given) and, with add_bias, added to v's rows (one IEEE add each). */
void vt_matmul_norms_bias(double *v, const float *a, const float *b, const float *bias, int64_t batches,
                          int64_t m, int64_t k, int64_t ncols, int32_t add_bias, double *na, double *nb,
                          double *bias64) {
    const int64_t rows = batches * m;
    vt_row_norms32(a, rows, k, na);
    vt_row_norms32(b, batches * ncols, k, nb);
    if (bias) {
        for (int64_t j = 0; j < ncols; j++) bias64[j] = (double)bias[j];
        if (add_bias)
            for (int64_t i = 0; i < rows; i++) {
                double *vr = v + i * ncols;
                for (int64_t j = 0; j < ncols; j++) vr[j] = vr[j] + bias64[j];
            }
    }
}

/* v [batches * m, ncols] (C-contiguous FP64, the products A B^T without the bias), a [batches * m, k],
 * b [batches * ncols, k], bias [ncols] or NULL (FP32, C-contiguous). With `add_bias`, v += bias first.
 * Writes r (RN32(v), canonical zeros, then the decided bits) and the candidates' element indices into
 * idx (room for every element), returns their count (-1: a scratch allocation failed).
 * status[ST_NONFINITE]: whether some r is not finite (then nothing is decided: kept = -1);
 * status[ST_KEPT]: the rows the tight re-filter keeps, whose decisions are as [4, count]
 * (vt_rows_decide's layout: index, bits, code, decided) in o where count <= cap, else in a buffer
 * of this library's malloc whose address is status[ST_SPILL] (the caller copies it out and frees it
 * with vt_free), or -1 where they were not kept (not finite); status[ST_ATTENTION]: how many of them
 * need the full path (0: every decided bit is already in r, and nothing is spilled); status[ST_ENTRIES]:
 * where every kept row is decided and some are due an entry, their count (every decided bit is then in
 * r too, and the decisions hold the entries alone, compact_entries' layout), else -1. */
VT_EXPORT int64_t vt_matmul_round_norm(double *v, const float *a, const float *b, const float *bias,
                                       int64_t batches, int64_t m, int64_t k, int64_t ncols, int32_t add_bias,
                                       double sub, double factor, double band, double coef, float *r,
                                       int64_t *idx, int64_t cap, int64_t *o, int64_t *status) {
    const int64_t rows = batches * m, brows = batches * ncols;
    const size_t ra = (size_t)(rows > 0 ? rows : 1), rb = (size_t)(brows > 0 ? brows : 1);
    double *norms = malloc((3 * ra + 3 * rb) * sizeof(double));
    double *bias64 = bias ? malloc((size_t)(ncols > 0 ? ncols : 1) * sizeof(double)) : NULL;
    int64_t count = -1;
    status[ST_NONFINITE] = 0;
    status[ST_KEPT] = -1;
    status[ST_ATTENTION] = 0;
    status[ST_SPILL] = 0;
    status[ST_ENTRIES] = -1;
    if (!norms || (bias && !bias64)) goto done;
    double *na = norms, *na1 = na + ra, *nai = na1 + ra, *nb = nai + ra, *nb1 = nb + rb, *nbi = nb1 + rb;
    vt_matmul_norms_bias(v, a, b, bias, batches, m, k, ncols, add_bias, na, nb, bias64);
    uint32_t nonfinite = 0;
    count = vt_round_filter_norm(v, rows, m, ncols, na, nb, bias64, sub, factor, band, r, idx, &nonfinite);
    if (count * 16 > rows + brows) { /* Hoelder's norms (a row: k adds) cost less than the exact rows they
                                         may spare (a candidate: k exact products and sums, ~16x more) */
        vt_row_norms1inf32(a, rows, k, na1, nai);
        vt_row_norms1inf32(b, brows, k, nb1, nbi);
        count = vt_refine_norm3(v, m, ncols, na, nb, na1, nai, nb1, nbi, bias64, sub, factor, band, r, idx, count);
    }
    status[ST_NONFINITE] = nonfinite;
    if (count == 0 || nonfinite) goto done;
    int64_t *dec = count <= cap ? o : malloc((size_t)count * 4 * sizeof(int64_t));
    if (!dec) {
        count = -1;
        goto done;
    }
    const int64_t kept = vt_rows_decide(SRC_MATMUL, a, b, bias, m, k, ncols, NULL, 0, rows * ncols, KIND_MATMUL,
                                        idx, count, v, r, coef, band, dec);
    if (kept < 0) {
        count = -1;
    } else {
        const int64_t attention = needing_attention(dec, count, kept);
        int64_t undecided = 0;
        for (int64_t j = 0; j < kept; j++) undecided += !dec[3 * count + j];
        if (!undecided) write_decided(dec, count, kept, r);
        if (!undecided && attention) status[ST_ENTRIES] = compact_entries(dec, count, kept);
        status[ST_KEPT] = kept;
        status[ST_ATTENTION] = attention;
        if (dec != o && attention) {
            status[ST_SPILL] = (int64_t)(intptr_t)dec; /* handed over: the caller frees it */
            dec = o;
        }
    }
    if (dec != o) free(dec);
done:
    free(norms);
    free(bias64);
    return count;
}

/* Frees a buffer this library handed over (vt_matmul_round_norm's spilled decisions). */
VT_EXPORT void vt_free(void *p) { free(p); }
