/* The canonical trainer's SUM/MEAN over the last axis in one call (vtrain/numerics/native_filter.py,
 * sum_round_decide; canonical.round_canonical_sum).
 *
 * It runs, on the same values, the two kernels the Python path calls one after the other:
 *
 *   vt_sum_round_filter   the rows' pairwise FP64 sums (MEAN: / n), r = RN32 and the candidates;
 *   vt_rows_decide_into   where every r is finite: the candidates' exact decisions, written into r
 *                         where every one is decided with no entry due;
 *
 * so its results are theirs, bit for bit (tests/test_native_filter.py compares them). */
#include <stdint.h>

#define VT_EXPORT __attribute__((visibility("default")))

/* The kernels composed here (filter.c, rows.c). */
int64_t vt_sum_round_filter(const float *x, int64_t rows, int64_t n, int32_t mean, double factor, double scale,
                            float *r, int64_t *idx, uint32_t *nonfinite);
int64_t vt_rows_decide_into(int32_t src, const float *a, const float *b, const float *bias, int64_t m, int64_t k,
                            int64_t ncols, const void *x, int64_t n, int64_t limit, int32_t kind, const int64_t *cand,
                            int64_t c, const double *v, const float *r, double coef, double band, float *r_out);

enum { SRC_ROWS32 = 1, KIND_SUM = 1, KIND_MEAN = 2 };

/* x [rows, n] FP32 (C-contiguous). Writes r [rows] and the candidates' row indices into idx (room for
 * every row); returns their count, -1 where a scratch row cannot be allocated. status[0]: whether some r
 * is not finite (then nothing is decided); status[1]: -1 where the candidates were not decided (none,
 * or some r not finite), else how many need the caller's full path (0: their decided bits are in r,
 * which is final; more: nothing was written, as vt_rows_decide_into). */
VT_EXPORT int64_t vt_sum_round_decide(const float *x, int64_t rows, int64_t n, int32_t mean, double factor,
                                      double scale, float *r, int64_t *idx, int64_t *status) {
    uint32_t nonfinite = 0;
    status[0] = 0;
    status[1] = -1;
    const int64_t count = vt_sum_round_filter(x, rows, n, mean, factor, scale, r, idx, &nonfinite);
    status[0] = nonfinite != 0;
    if (count <= 0 || nonfinite) return count;
    const int64_t attention = vt_rows_decide_into(SRC_ROWS32, 0, 0, 0, 0, 0, 0, x, n, rows, mean ? KIND_MEAN : KIND_SUM,
                                                  idx, count, 0, 0, 0.0, 0.0, r);
    if (attention < 0) return -1; /* (-2, an index outside: never, the filter's own rows) */
    status[1] = attention;
    return count;
}
