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
#include <string.h>

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

/* One rounding-log entry as rounding._apply_entries_np applies it, the same IEEE operations in the same
 * order (nextafterf is numpy's np.nextafter on float32): at an element with FP64 value v and FP32
 * r = RN32(v), an entry of code 1 (down), 2 (up) or 3 (explicit, with `value`) gives
 *     m_hi, m_lo = (r + next(r, +-inf)) / 2 in FP64,  take_hi = (m_hi - v) <= (v - m_lo),
 *     applied = explicit ? value : down ? (take_hi ? r : prev) : (take_hi ? next : r),
 * and, `checking` with bound d, *bad = far | wild:
 *     far  = !explicit && (|v - (take_hi ? m_hi : m_lo)| > far_reach d || exact_op),
 *     wild = explicit && ((v - c_hi) > d || (c_lo - v) > d), c_hi, c_lo the midpoints around value. */
static float apply_entry(double vi, float ri, uint8_t code, float value, int checking, double di, double far_reach,
                         int32_t exact_op, uint8_t *bad) {
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
    const int explicit_ = code == 3;
    const float directed = code == 1 ? (take_hi ? ri : lo_n) : (take_hi ? hi_n : ri);
    if (!checking) return explicit_ ? value : directed;
    const double m = take_hi ? m_hi : m_lo;
    const int far = !explicit_ && ((fabs(vi - m) > far_reach * di) || exact_op);
    const double c64 = (double)value;
    const double c_hi = (c64 + (double)nextafterf(value, INFINITY)) * 0.5;
    const double c_lo = (c64 + (double)nextafterf(value, -INFINITY)) * 0.5;
    const int wild = explicit_ && (((vi - c_hi) > di) || ((c_lo - vi) > di));
    *bad = (uint8_t)(far | wild);
    return explicit_ ? value : directed;
}

/* The values the entries idx/code/value give (apply_entry; codes checked by the caller) and, with bounds
 * `di` (NULL: not checking), which are far or wild (bad[i]). Returns the number flagged, or -2 (nothing
 * written) for an index outside [0, n). */
VT_EXPORT int64_t vt_replay_apply_entries(const double *v, const float *r, int64_t n, int64_t c, const int64_t *idx,
                                          const uint8_t *code, const float *value, const double *di,
                                          double far_reach, int32_t exact_op, float *applied, uint8_t *bad) {
    for (int64_t i = 0; i < c; i++)
        if (idx[i] < 0 || idx[i] >= n) return -2;
    int64_t flagged = 0;
    for (int64_t i = 0; i < c; i++) {
        uint8_t b = 0;
        applied[i] = apply_entry(v[idx[i]], r[idx[i]], code[i], value[i], di != NULL, di ? di[i] : 0.0, far_reach,
                                 exact_op, &b);
        if (!di) continue;
        bad[i] = b;
        flagged += b;
    }
    return flagged;
}

/* rows.c's double-double RN32 verdict of one element from its exact terms (V_YES: 1). */
int vt_rn32_verdict(double *x, int64_t n, double *e, double scale, uint32_t claimed);
enum { V_YES = 1 };

/* How far a checked replay's native pass may settle an op by itself (the `mode` of the kernels below):
 * REPLAY_OFF:        none (the caller's full path for every op: tests compare it with the others);
 * REPLAY_CANDIDATES: only an op without entries (no suspect candidate, every r finite);
 * REPLAY_ENTRIES:    also one with entries, each applied and checked as rounding._apply_log_checked
 *                    does (not far or wild at d = the checks' bound, no unlogged suspect), with a
 *                    finite value; the checks without a resolver (the caller's `violations` only);
 * REPLAY_VERDICTS:   as REPLAY_ENTRIES, and each applied value must be RN32(e) by the double-double
 *                    verdict of vt_rows_is_rn32 (not -0): what the auditor's exact resolver upholds
 *                    unchanged (protocol/auditor.py, exact_resolver), so it need not be called. */
enum { REPLAY_OFF = -1, REPLAY_CANDIDATES = 0, REPLAY_ENTRIES = 1, REPLAY_VERDICTS = 2 };

/* Whether the entries let the op be settled natively: `mode` settles anything (and takes entries where
 * there are some), every index is in [0, total) and above the one before (sorted, unique: what the full
 * path's binary searches read), every code 1-3. */
static int entries_well_formed(int32_t mode, const int64_t *ent, const uint8_t *code, int64_t n_ent, int64_t total) {
    if (mode <= REPLAY_OFF) return 0;
    if (!n_ent) return 1;
    if (mode < REPLAY_ENTRIES) return 0;
    for (int64_t i = 0; i < n_ent; i++)
        if (ent[i] < 0 || ent[i] >= total || (i && ent[i] <= ent[i - 1]) || code[i] < 1 || code[i] > 3) return 0;
    return 1;
}

/* Whether a candidate (sorted cand[0..count), near-tie flag near[p], exact-grid rule grid[p]) is a
 * suspect of the full path: near a midpoint, off the exact grid, and no entry (ent sorted, unique). */
static int unlogged_suspect(const int64_t *cand, const uint8_t *near, const uint8_t *grid, int64_t count,
                            const int64_t *ent, int64_t n_ent) {
    int64_t q = 0;
    for (int64_t p = 0; p < count; p++) {
        if (!near[p] || grid[p]) continue;
        while (q < n_ent && ent[q] < cand[p]) q++;
        if (q == n_ent || ent[q] != cand[p]) return 1;
    }
    return 0;
}

/* One well-formed entry at an element with FP64 value vi, FP32 ri = RN32(vi) and bound di: the value it
 * gives into *applied (apply_entry) and whether it settles the element without the full path: not far
 * or wild, finite and, with terms (t: the element's nt exact terms, capacity nt + 1, overwritten; e:
 * scratch of nt / 2 + 1; scale: MEAN's n, else 1), not -0 and RN32(e) by the double-double verdict. */
static int entry_settled(double vi, float ri, uint8_t code, float value, double di, double far_reach, double *t,
                         int64_t nt, double *e, double scale, float *applied) {
    uint8_t bad = 0;
    const float a = apply_entry(vi, ri, code, value, 1, di, far_reach, 0, &bad);
    *applied = a;
    if (bad || !isfinite(a)) return 0;
    if (!t) return 1;
    uint32_t bits;
    memcpy(&bits, &a, sizeof bits);
    return bits != 0x80000000u && vt_rn32_verdict(t, nt, e, scale, bits) == V_YES;
}

/* The settled entries' values into r (canonical zeros, as the full path writes them). */
static void write_applied(float *r, const int64_t *ent, const float *applied, int64_t n_ent) {
    for (int64_t i = 0; i < n_ent; i++) r[ent[i]] = applied[i] + 0.0f;
}

/* The kernels composed below (filter.c, rows.c, matmul.c). */
void vt_row_norms32(const float *x, int64_t rows, int64_t k, double *out);
int64_t vt_round_filter_norm(const double *v, int64_t rows, int64_t m, int64_t ncols, const double *na,
                             const double *nb, const double *bias, double sub, double factor, double scale,
                             float *r, int64_t *idx, uint32_t *nonfinite);
int64_t vt_refine_norm3(const double *v, int64_t m, int64_t ncols, const double *na, const double *nb,
                        const double *na1, const double *nai, const double *nb1, const double *nbi,
                        const double *bias, double sub, double factor, double scale, float *r, int64_t *idx,
                        int64_t count);
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
 *   vt_round_filter_norm3 at `scale`            (native_filter.round_filter of the NormBound: its list
 *                                               as vt_round_filter_norm then vt_refine_norm3 give it);
 *   at the candidates idx[0..count) and then at the entries ent[0..n_ent) (the points the replay's
 *   checks read), d = np.minimum(NormBound.at, canonical.tight_bound_at):
 *       d_norm  = ((((s_ij) + |bias_j|) + sub) * factor)   (no bias: ((s_ij) + sub) * factor), s_ij the
 *                 smallest of na_i nb_j, na1_i nbi_j, nai_i nb1_j (native_filter.norm_products)
 *       d_tight = coef * ((0.0 + pw_abs_sum(t)) + subn)          (t: the exact FP64 terms, bias last)
 *     NaN where either is NaN (numpy's minimum), NaN at an entry index outside [0, total) (the
 *     caller's index check raises before any d is read);
 *   and there grid[p], the exact-grid rule of the terms (rows.c's vt_rows_grid: canonical.grid_elements);
 *   at the candidates near[p] = rounding._near_midpoint_np(v, r, 2.0 * d * slack) with that d;
 *   then, as `mode` allows (REPLAY_*), whether the op is settled here: every r finite, no unlogged
 *   suspect candidate, every entry (codes `code`, explicit values `value`) well formed and settled
 *   (entry_settled at that d, far reach `far_reach`). Then the entries' values are written into r.
 * Writes r and idx (capacity batches * m * ncols); the bounds into d_at, the rule into grid and the
 * near-tie flags into near (capacity `cap` each) when count + n_ent <= cap. status[0]: whether some r
 * is not finite; status[1]: whether d_at was written; status[2]: whether the op is settled (r final:
 * rounding.apply_log would return it as it is, with every resolver call, if the mode has one, upholding).
 * Returns the candidate count, or -1 when scratch memory cannot be had. */
VT_EXPORT int64_t vt_replay_matmul_norm(double *v, const float *a, const float *b, const float *bias,
                                        int64_t batches, int64_t m, int64_t k, int64_t ncols, int32_t add_bias,
                                        double sub, double factor, double scale, double coef, double subn,
                                        double slack, float *r, int64_t *idx, const int64_t *ent, const uint8_t *code,
                                        const float *value, int64_t n_ent, int32_t mode, double far_reach,
                                        int64_t cap, double *d_at, uint8_t *grid, uint8_t *near, int64_t *status) {
    const int64_t rows = batches * m, brows = batches * ncols, total = rows * ncols;
    const size_t ra = (size_t)(rows > 0 ? rows : 1), rb = (size_t)(brows > 0 ? brows : 1);
    double *norms = malloc((3 * ra + 3 * rb) * sizeof(double));
    double *bias64 = bias ? malloc((size_t)(ncols > 0 ? ncols : 1) * sizeof(double)) : NULL;
    double *t = malloc((size_t)(k + 2) * sizeof(double));
    double *e = malloc((size_t)(k + 2) * sizeof(double));
    float *applied = malloc((size_t)(n_ent > 0 ? n_ent : 1) * sizeof(float));
    int64_t count = -1;
    status[0] = 0;
    status[1] = 0;
    status[2] = 0;
    if (!norms || !t || !e || !applied || (bias && !bias64)) goto done;
    double *na = norms, *na1 = na + ra, *nai = na1 + ra, *nb = nai + ra, *nb1 = nb + rb, *nbi = nb1 + rb;
    vt_matmul_norms_bias(v, a, b, bias, batches, m, k, ncols, add_bias, na, nb, bias64);
    uint32_t nonfinite = 0;
    /* vt_round_filter_norm3's list as matmul.c takes it: the one-product filter, then the three-product
     * re-test of its candidates (exactly that list, r the same), the Hoelder norms computed only where a
     * point reads them */
    count = vt_round_filter_norm(v, rows, m, ncols, na, nb, bias64, sub, factor, scale, r, idx, &nonfinite);
    if (count + n_ent > 0) {
        vt_row_norms1inf32(a, rows, k, na1, nai);
        vt_row_norms1inf32(b, brows, k, nb1, nbi);
        if (count > 0)
            count = vt_refine_norm3(v, m, ncols, na, nb, na1, nai, nb1, nbi, bias64, sub, factor, scale, r, idx, count);
    }
    status[0] = nonfinite;
    if (count + n_ent > cap) goto done;
    int settled = !nonfinite && entries_well_formed(mode, ent, code, n_ent, total);
    const int verdicts = mode >= REPLAY_VERDICTS;
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
        if (p < count) {
            near[p] = near_midpoint(v[at], r[at], d_at[p], slack);
        } else if (settled) {  /* t is read no more: the verdict may overwrite it */
            const int64_t i = p - count;
            settled = entry_settled(v[at], r[at], code[i], value[i], d_at[p], far_reach, verdicts ? t : NULL, nt, e,
                                    1.0, &applied[i]);
        }
    }
    status[1] = 1;
    if (settled && !unlogged_suspect(idx, near, grid, count, ent, n_ent)) {
        write_applied(r, ent, applied, n_ent);
        status[2] = 1;
    }
done:
    free(norms);
    free(bias64);
    free(t);
    free(e);
    free(applied);
    return count;
}

int64_t vt_sum_values_filter(const float *x, int64_t rows, int64_t n, int32_t mean, double factor, double scale,
                             double *v, double *d, float *r, int64_t *idx, uint32_t *nonfinite);

/* The checked replay's SUM/MEAN pass (native_replay.sum_values_grid): vt_sum_values_filter (filter.c:
 * v, d, r and the candidates of the rows of an FP32 x [rows, n]), then at each candidate row grid[i],
 * the exact-grid rule of its terms (rows.c's vt_rows_grid on the rows of x: canonical.grid_elements),
 * which the replay's checks ask of its unlogged near-ties, and near[i] = rounding._near_midpoint_np(v, r,
 * 2.0 * d * slack); then, as `mode` allows, whether the op is settled here (vt_replay_matmul_norm's rule,
 * the entries ent/code/value read at d: the checks' bound), and if so the entries' values written into r
 * and *settled = 1 (else 0). Returns the candidate count, or -1 when scratch memory cannot be had
 * (nothing usable written then). */
VT_EXPORT int64_t vt_replay_sum_values(const float *x, int64_t rows, int64_t n, int32_t mean, double factor,
                                       double scale, double slack, double *v, double *d, float *r, int64_t *idx,
                                       uint32_t *nonfinite, uint8_t *grid, uint8_t *near, const int64_t *ent,
                                       const uint8_t *code, const float *value, int64_t n_ent, int32_t mode,
                                       double far_reach, int64_t *settled_out) {
    *settled_out = 0;
    const int64_t count = vt_sum_values_filter(x, rows, n, mean, factor, scale, v, d, r, idx, nonfinite);
    if (count < 0) return count;
    if (count == 0 && n_ent == 0) {
        *settled_out = !*nonfinite && mode > REPLAY_OFF;
        return count;
    }
    double *t = malloc((size_t)(n + 2) * sizeof(double));
    double *e = malloc((size_t)(n + 2) * sizeof(double));
    float *applied = malloc((size_t)(n_ent > 0 ? n_ent : 1) * sizeof(float));
    int64_t got = -1;
    if (!t || !e || !applied) goto done;
    for (int64_t i = 0; i < count; i++) {
        const float *xr = x + idx[i] * n;
        for (int64_t q = 0; q < n; q++) t[q] = (double)xr[q];
        grid[i] = (uint8_t)vt_grid_row(t, n, 0.0 + pw_abs_sum(t, n), mean ? 2 : 1);
        near[i] = near_midpoint(v[idx[i]], r[idx[i]], d[idx[i]], slack);
    }
    got = count;
    int settled = !*nonfinite && entries_well_formed(mode, ent, code, n_ent, rows) &&
                  !unlogged_suspect(idx, near, grid, count, ent, n_ent);
    const int verdicts = mode >= REPLAY_VERDICTS;
    for (int64_t i = 0; settled && i < n_ent; i++) {
        const int64_t at = ent[i];
        if (verdicts) {
            const float *xr = x + at * n;
            for (int64_t q = 0; q < n; q++) t[q] = (double)xr[q];
        }
        settled = entry_settled(v[at], r[at], code[i], value[i], d[at], far_reach, verdicts ? t : NULL, n, e,
                                mean ? (double)n : 1.0, &applied[i]);
    }
    if (settled) {
        write_applied(r, ent, applied, n_ent);
        *settled_out = 1;
    }
done:
    free(t);
    free(e);
    free(applied);
    return got;
}
