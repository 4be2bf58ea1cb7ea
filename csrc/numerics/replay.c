/* The replay's tight MATMUL bound at a few elements (vtrain/numerics/native_replay.py).
 *
 * A checked replay filters with the cheap Cauchy-Schwarz bound and reads the tight bound
 * d' = 1.01 g(n) (fl(S) + n 2^-149) only at the candidates and entries: fl(S) = np.abs(t).sum()
 * of the element's exact FP64 terms (canonical._terms: products of FP32 values, a bias as the last
 * term), numpy's pairwise summation from 0, the operations of rows.c's np_sum in the same order
 * (compiled with -ffp-contract=off), so the same bits as the numpy reference. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define VT_EXPORT __attribute__((visibility("default")))

/* numpy's pairwise summation of |a_i| (PW_BLOCKSIZE 128), as rows.c's pw_sum with absval. */
static double pw_abs_sum(const double *a, int64_t n) {
    if (n < 8) {
        double res = -0.0;
        for (int64_t i = 0; i < n; i++) res += fabs(a[i]);
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = fabs(a[j]);
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += fabs(a[i + j]);
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += fabs(a[i]);
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pw_abs_sum(a, n2) + pw_abs_sum(a + n2, n - n2);
}

/* rounding._near_midpoint_np of one element: whether a midpoint next to r = RN32(v) lies within
 * reach = (2.0 * d) * slack of v (numpy's minimum/maximum: a NaN stays NaN, and compares false). */
static uint8_t near_midpoint(double v, float r, double d, double slack) {
    const double reach = (2.0 * d) * slack;
    const double r64 = (double)r;
    double hi = (double)nextafterf(r, INFINITY), lo = (double)nextafterf(r, -INFINITY);
    if (!isnan(hi) && !(hi < 0x1p128)) hi = 0x1p128;
    if (!isnan(lo) && !(lo > -0x1p128)) lo = -0x1p128;
    return (uint8_t)((((r64 + hi) * 0.5 - v) <= reach) | ((v - (r64 + lo) * 0.5) <= reach));
}

/* out[i] = fl(S) of MATMUL element idx[i] (a [.., m, k], b [.., ncols, k], bias [ncols] or NULL;
 * `total` elements). Returns 0, -2 for an index outside [0, total), -1 when scratch is not allocated. */
VT_EXPORT int vt_replay_matmul_abs_sums(const float *a, const float *b, const float *bias, int64_t m, int64_t k,
                                        int64_t ncols, int64_t total, const int64_t *idx, int64_t c, double *out) {
    for (int64_t i = 0; i < c; i++)
        if (idx[i] < 0 || idx[i] >= total) return -2;
    double *t = malloc((size_t)(k + 1) * sizeof(double));
    if (!t) return -1;
    for (int64_t i = 0; i < c; i++) {
        int64_t j = idx[i] % ncols, row = idx[i] / ncols, batch = row / m;
        const float *ar = a + row * k;
        const float *br = b + (batch * ncols + j) * k;
        for (int64_t q = 0; q < k; q++) t[q] = (double)ar[q] * (double)br[q];
        if (bias) t[k] = (double)bias[j];
        out[i] = 0.0 + pw_abs_sum(t, k + (bias != NULL));
    }
    free(t);
    return 0;
}

/* The values the rounding-log entries give and, with bounds `di` (NULL: not checking), which entries
 * are far from the replayed value: rounding._apply_entries_np entry by entry, the same IEEE operations
 * in the same order (nextafterf is numpy's np.nextafter on float32). Per entry i at element idx[i]
 * (codes 1 down, 2 up, 3 explicit, checked by the caller; indices in range):
 *     m_hi, m_lo = (r + next(r, +-inf)) / 2 in FP64,  take_hi = (m_hi - v) <= (v - m_lo),
 *     applied = explicit ? value : down ? (take_hi ? r : prev) : (take_hi ? next : r),
 *     far  = !explicit && (|v - (take_hi ? m_hi : m_lo)| > far_reach d || exact_op),
 *     wild = explicit && ((v - c_hi) > d || (c_lo - v) > d), c_hi, c_lo the midpoints around value.
 * Returns the number of entries flagged (bad[i] = far | wild), or -2 (nothing written) for an index
 * outside [0, n). */
VT_EXPORT int64_t vt_replay_apply_entries(const double *v, const float *r, int64_t n, int64_t c, const int64_t *idx,
                                          const uint8_t *code, const float *value, const double *di,
                                          double far_reach, int32_t exact_op, float *applied, uint8_t *bad) {
    for (int64_t i = 0; i < c; i++)
        if (idx[i] < 0 || idx[i] >= n) return -2;
    int64_t flagged = 0;
    for (int64_t i = 0; i < c; i++) {
        const double vi = v[idx[i]];
        const float ri = r[idx[i]];
        const float hi_n = nextafterf(ri, INFINITY), lo_n = nextafterf(ri, -INFINITY);
        const double r64 = (double)ri;
        /* next to +-FLT_MAX the neighbour is the virtual +-2^128 (the contract's): the midpoint is
           +-(2^128 - 2^103); a NaN stays NaN (numpy's minimum/maximum) */
        double hi64 = (double)hi_n, lo64 = (double)lo_n;
        if (hi64 > 0x1p128) hi64 = 0x1p128;
        if (lo64 < -0x1p128) lo64 = -0x1p128;
        const double m_hi = (r64 + hi64) * 0.5;
        const double m_lo = (r64 + lo64) * 0.5;
        const int take_hi = (m_hi - vi) <= (vi - m_lo);
        const int explicit_ = code[i] == 3;
        const float directed = code[i] == 1 ? (take_hi ? ri : lo_n) : (take_hi ? hi_n : ri);
        applied[i] = explicit_ ? value[i] : directed;
        if (!di) continue;
        const double m = take_hi ? m_hi : m_lo;
        const int far = !explicit_ && ((fabs(vi - m) > far_reach * di[i]) || exact_op);
        const float cv = value[i];
        const double c64 = (double)cv;
        const double c_hi = (c64 + (double)nextafterf(cv, INFINITY)) * 0.5;
        const double c_lo = (c64 + (double)nextafterf(cv, -INFINITY)) * 0.5;
        const int wild = explicit_ && (((vi - c_hi) > di[i]) || ((c_lo - vi) > di[i]));
        bad[i] = (uint8_t)(far | wild);
        flagged += far | wild;
    }
    return flagged;
}

/* The kernels composed below (filter.c, rows.c, matmul.c). */
void vt_row_norms32(const float *x, int64_t rows, int64_t k, double *out);
int64_t vt_round_filter_norm(const double *v, int64_t rows, int64_t m, int64_t ncols, const double *na,
                             const double *nb, const double *bias, double sub, double factor, double scale,
                             float *r, int64_t *idx, uint32_t *nonfinite);
int64_t vt_round_filter_norm3(const double *v, int64_t rows, int64_t m, int64_t ncols, const double *na,
                              const double *nb, const double *na1, const double *nai, const double *nb1,
                              const double *nbi, const double *bias, double sub, double factor, double scale,
                              float *r, int64_t *idx, uint32_t *nonfinite);
void vt_row_norms1inf32(const float *x, int64_t rows, int64_t k, double *n1, double *ninf);
int vt_grid_row(const double *t, int64_t n, double s_abs, int kind);
void vt_matmul_norms_bias(double *v, const float *a, const float *b, const float *bias, int64_t batches,
                          int64_t m, int64_t k, int64_t ncols, int32_t add_bias, double *na, double *nb,
                          double *bias64);

/* The checked replay's MATMUL epilogue in one call (native_replay.matmul_norm_filter): the steps the
 * Python norm path takes one by one, on the same values in the same order, so the same bits:
 *
 *   vt_row_norms32 and vt_row_norms1inf32 of A [batches * m, k] and B [batches * ncols, k]
 *                                               (native_filter.norm_bound);
 *   v += bias with add_bias                     (executor._norm_bound's v.add_(bias.double()));
 *   vt_round_filter_norm3 at `scale`            (native_filter.round_filter of the NormBound);
 *   at the candidates idx[0..count) and then at the entries ent[0..n_ent) (the points the replay's
 *   checks read), d = np.minimum(NormBound.at, canonical.tight_bound_at):
 *       d_norm  = ((((s_ij) + |bias_j|) + sub) * factor)   (no bias: ((s_ij) + sub) * factor), s_ij the
 *                 smallest of na_i nb_j, na1_i nbi_j, nai_i nb1_j (native_filter.norm_products)
 *       d_tight = coef * ((0.0 + pw_abs_sum(t)) + subn)          (t: the exact FP64 terms, bias last)
 *     NaN where either is NaN (numpy's minimum), NaN at an entry index outside [0, total) (the
 *     caller's index check raises before any d is read);
 *   and there grid[p], the exact-grid rule of the terms (rows.c's vt_rows_grid: canonical.grid_elements);
 *   at the candidates near[p] = rounding._near_midpoint_np(v, r, 2.0 * d * slack) with that d.
 * Writes r and idx (capacity batches * m * ncols); the bounds into d_at, the rule into grid and the
 * near-tie flags into near (capacity `cap` each) when count + n_ent <= cap. status[0]: whether some r is not finite; status[1]: whether d_at was written.
 * Returns the candidate count, or -1 when scratch memory cannot be had. */
VT_EXPORT int64_t vt_replay_matmul_norm(double *v, const float *a, const float *b, const float *bias,
                                        int64_t batches, int64_t m, int64_t k, int64_t ncols, int32_t add_bias,
                                        double sub, double factor, double scale, double coef, double subn,
                                        double slack, float *r, int64_t *idx, const int64_t *ent, int64_t n_ent,
                                        int64_t cap, double *d_at, uint8_t *grid, uint8_t *near,
                                        int64_t *status) {
    const int64_t rows = batches * m, brows = batches * ncols, total = rows * ncols;
    const size_t ra = (size_t)(rows > 0 ? rows : 1), rb = (size_t)(brows > 0 ? brows : 1);
    double *norms = malloc((3 * ra + 3 * rb) * sizeof(double));
    double *bias64 = bias ? malloc((size_t)(ncols > 0 ? ncols : 1) * sizeof(double)) : NULL;
    double *t = malloc((size_t)(k + 1) * sizeof(double));
    int64_t count = -1;
    status[0] = 0;
    status[1] = 0;
    if (!norms || !t || (bias && !bias64)) goto done;
    double *na = norms, *na1 = na + ra, *nai = na1 + ra, *nb = nai + ra, *nb1 = nb + rb, *nbi = nb1 + rb;
    vt_matmul_norms_bias(v, a, b, bias, batches, m, k, ncols, add_bias, na, nb, bias64);
    vt_row_norms1inf32(a, rows, k, na1, nai);
    vt_row_norms1inf32(b, brows, k, nb1, nbi);
    uint32_t nonfinite = 0;
    count = vt_round_filter_norm3(v, rows, m, ncols, na, nb, na1, nai, nb1, nbi, bias64, sub, factor, scale, r, idx,
                                  &nonfinite);
    status[0] = nonfinite;
    if (count + n_ent > cap) goto done;
    for (int64_t p = 0; p < count + n_ent; p++) {
        const int64_t at = p < count ? idx[p] : ent[p - count];
        if (at < 0 || at >= total) {
            d_at[p] = NAN;
            grid[p] = 0;
            continue;
        }
        const int64_t j = at % ncols, row = at / ncols, batch = row / m;
        const int64_t col = batch * ncols + j;
        const double s2 = na[row] * nb[col], s1 = na1[row] * nbi[col], si = nai[row] * nb1[col];
        const double s12 = s2 < s1 ? s2 : s1;
        double s = s12 < si ? s12 : si;
        if (bias) s = s + fabs(bias64[j]);
        const double dn = (s + sub) * factor;
        const float *ar = a + row * k;
        const float *br = b + (batch * ncols + j) * k;
        for (int64_t q = 0; q < k; q++) t[q] = (double)ar[q] * (double)br[q];
        if (bias) t[k] = (double)bias[j];
        const int64_t nt = k + (bias != NULL);
        const double s_abs = 0.0 + pw_abs_sum(t, nt);
        const double dt = coef * (s_abs + subn);
        grid[p] = (uint8_t)vt_grid_row(t, nt, s_abs, 0);
        d_at[p] = (isnan(dn) || isnan(dt)) ? NAN : (dt < dn ? dt : dn);
        if (p < count) near[p] = near_midpoint(v[at], r[at], d_at[p], slack);
    }
    status[1] = 1;
done:
    free(norms);
    free(bias64);
    free(t);
    return count;
}

int64_t vt_sum_values_filter(const float *x, int64_t rows, int64_t n, int32_t mean, double factor, double scale,
                             double *v, double *d, float *r, int64_t *idx, uint32_t *nonfinite);

/* The checked replay's SUM/MEAN pass (native_replay.sum_values_grid): vt_sum_values_filter (filter.c:
 * v, d, r and the candidates of the rows of an FP32 x [rows, n]), then at each candidate row grid[i],
 * the exact-grid rule of its terms (rows.c's vt_rows_grid on the rows of x: canonical.grid_elements),
 * which the replay's checks ask of its unlogged near-ties, and near[i] = rounding._near_midpoint_np(v, r,
 * 2.0 * d * slack). Returns the candidate count, or -1 when scratch memory cannot be had (nothing usable
 * written then). */
VT_EXPORT int64_t vt_replay_sum_values(const float *x, int64_t rows, int64_t n, int32_t mean, double factor,
                                       double scale, double slack, double *v, double *d, float *r, int64_t *idx,
                                       uint32_t *nonfinite, uint8_t *grid, uint8_t *near) {
    const int64_t count = vt_sum_values_filter(x, rows, n, mean, factor, scale, v, d, r, idx, nonfinite);
    if (count <= 0) return count;
    double *t = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    if (!t) return -1;
    for (int64_t i = 0; i < count; i++) {
        const float *xr = x + idx[i] * n;
        for (int64_t q = 0; q < n; q++) t[q] = (double)xr[q];
        grid[i] = (uint8_t)vt_grid_row(t, n, 0.0 + pw_abs_sum(t, n), mean ? 2 : 1);
        near[i] = near_midpoint(v[idx[i]], r[idx[i]], d[idx[i]], slack);
    }
    free(t);
    return count;
}
