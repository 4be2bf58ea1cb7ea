/* Native decisions of candidate rows (vtrain/numerics/native_rows.py): the canonical decision of
 * MATMUL/SUM/MEAN candidate elements from their exact FP64 terms, in one call per op.
 *
 * The reference is the numpy path of vtrain/numerics/canonical.py, and every operation here is
 * the one it performs, in the same order (compiled with -ffp-contract=off, no -ffast-math):
 *
 *   _terms              products of FP32 values in FP64 (exact), a MATMUL bias as the last term;
 *   s_abs               np.abs(t).sum(axis=1): numpy's pairwise summation (pw_sum below) from 0;
 *   _tight_candidates   the MATMUL re-filter with the tight bound (midpoint_candidates_np);
 *   grid_exact          the exact-grid rule, and the grid rows' exact sum (t.sum(axis=1) / scale);
 *   _dd_sum, _decide_dd the pairwise TwoSum tree (same pairing, zero padding of odd widths, the
 *                       error terms of each level summed by numpy's pairwise sum) and the decision;
 *   is_exact_rounding   the double-double comparison of a claimed value with its two midpoints.
 *
 * Rows are independent (numpy's operations are elementwise per row), so doing one row at a time
 * gives the same bits. Terms come from a source: a MATMUL's FP32 operands, the rows of an FP32
 * tensor (SUM/MEAN), or given FP64 term rows. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "parallel.h"

#define VT_EXPORT __attribute__((visibility("default")))

#define U 0x1p-53
enum { KIND_MATMUL = 0, KIND_SUM = 1, KIND_MEAN = 2 };
enum { SRC_MATMUL = 0, SRC_ROWS32 = 1, SRC_TERMS64 = 2 };
enum { CODE_NONE = 0, CODE_DOWN = 1, CODE_UP = 2, CODE_EXPLICIT = 3 };
/* verdicts of vt_rows_is_rn32 */
enum { V_NO = 0, V_YES = 1, V_UNDECIDED = 2 };

/* Where the terms of a row come from. */
typedef struct {
    int32_t src;        /* SRC_* */
    int32_t has_bias;   /* SRC_MATMUL: a bias term follows the K products */
    const float *a;     /* SRC_MATMUL: [.., M, K] */
    const float *b;     /* SRC_MATMUL: [.., N, K] */
    const float *bias;  /* SRC_MATMUL: [N] */
    int64_t m, k, ncols;
    const float *x;     /* SRC_ROWS32: [.., n] */
    const double *t;    /* SRC_TERMS64: [C, n] */
    int64_t n;          /* SRC_ROWS32 / SRC_TERMS64: terms per row */
} Src;

static int64_t n_terms(const Src *s) { return s->src == SRC_MATMUL ? s->k + (s->has_bias != 0) : s->n; }

/* The terms of element `idx` (for SRC_TERMS64: row `idx`) into out[0..n). */
static void fill_terms(const Src *s, int64_t idx, double *out) {
    if (s->src == SRC_MATMUL) {
        int64_t j = idx % s->ncols, row = idx / s->ncols, batch = row / s->m;
        const float *ar = s->a + row * s->k;
        const float *br = s->b + (batch * s->ncols + j) * s->k;
        for (int64_t i = 0; i < s->k; i++) out[i] = (double)ar[i] * (double)br[i];
        if (s->has_bias) out[s->k] = (double)s->bias[j];
    } else if (s->src == SRC_ROWS32) {
        const float *xr = s->x + idx * s->n;
        for (int64_t i = 0; i < s->n; i++) out[i] = (double)xr[i];
    } else {
        memcpy(out, s->t + idx * s->n, (size_t)s->n * sizeof(double));
    }
}

/* numpy's pairwise summation of a contiguous float64 run (numpy/_core/src/umath/loops_utils.h.src,
 * PW_BLOCKSIZE 128), of |a_i| when `absval`; a reduction adds it to the identity 0.0. */
static double pw_sum(const double *a, int64_t n, int absval) {
    if (n < 8) {
        double res = -0.0;
        for (int64_t i = 0; i < n; i++) res += absval ? fabs(a[i]) : a[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = absval ? fabs(a[j]) : a[j];
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8)
            for (int j = 0; j < 8; j++) r[j] += absval ? fabs(a[i + j]) : a[i + j];
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += absval ? fabs(a[i]) : a[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pw_sum(a, n2, absval) + pw_sum(a + n2, n - n2, absval);
}

static double np_sum(const double *a, int64_t n, int absval) { return 0.0 + pw_sum(a, n, absval); }

static double np_max(double a, double b) { return (a != a || b != b) ? NAN : (a >= b ? a : b); }

static void two_sum(double x, double y, double *s, double *e) {
    double ss = x + y;
    double bp = ss - x;
    *s = ss;
    *e = (x - (ss - bp)) + (y - bp);
}

/* _dd_sum of one row: `x` (capacity n + 1) is overwritten, `e` needs n / 2 + 1. */
static void dd_sum(double *x, int64_t n, double *e, double *hi, double *lo, double *bound) {
    double errs = 0.0, abs_errs = 0.0;
    int64_t w = n;
    if (w == 0) x[w++] = 0.0;
    while (w > 1) {
        if (w & 1) x[w++] = 0.0;
        int64_t h = w / 2;
        for (int64_t i = 0; i < h; i++) {
            double s, er;
            two_sum(x[2 * i], x[2 * i + 1], &s, &er);
            e[i] = er;
            x[i] = s;
        }
        errs = errs + np_sum(e, h, 0);
        abs_errs = abs_errs + np_sum(e, h, 1);
        w = h;
    }
    two_sum(x[0], errs, hi, lo);
    int64_t nn = n > 2 ? n : 2;
    *bound = (abs_errs * ((double)(4 * nn) * U) + fabs(*lo) * (4 * U)) + 0x1p-1070;
}

/* grid_exact of one row (s_abs its np.abs(t).sum()). */
static int grid_row(const double *t, int64_t n, double s_abs, int kind) {
    if (kind == KIND_MEAN && (n & (n - 1))) return 0;
    if (n == 0) return 1;
    int ex;
    (void)frexp(s_abs, &ex);
    double unit = ldexp(1.0, ex - 53);
    if (!isfinite(s_abs) || !(unit > 0)) return 0;
    const int m = ex - 53; /* unit = 2^m */
    if (m >= -1023 && m <= 1074) {
        /* q = t / 2^m as t * 2^-m, 2^-m a finite double here: both are the correctly rounded t 2^-m,
         * the same q (a multiplication instead of a division per term) */
        const double inv = ldexp(1.0, -m);
        for (int64_t i = 0; i < n; i++) {
            const double q = t[i] * inv;
            if (!(q == trunc(q))) return 0;
            if (!(q != 0 || t[i] == 0)) return 0;
        }
        return 1;
    }
    for (int64_t i = 0; i < n; i++) {
        double q = t[i] / unit;
        if (!(q == trunc(q))) return 0;
        if (!(q != 0 || t[i] == 0)) return 0;
    }
    return 1;
}

/* grid_row for the other kernels of the library (replay.c); not exported. */
int vt_grid_row(const double *t, int64_t n, double s_abs, int kind) { return grid_row(t, n, s_abs, kind); }

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* midpoint_candidates_np of one element with reach `reach`: 1 when it stays a candidate. */
static int still_candidate(double v, float r, double reach) {
    int32_t ri = (int32_t)f32_bits(r);
    int32_t a = (ri & 0x7FFFFFFF) - 1;
    a = (a > 0 ? a : 0) & 0x7F800000;
    double h = (double)bits_f32((uint32_t)a) * 0x1p-24;
    h = h > 0x1p-150 ? h : 0x1p-150;
    double margin = (h - fabs(v - (double)r)) - reach;
    return !(margin > 0);
}

/* _decide_dd of one row whose terms are in x (capacity n + 1, overwritten). */
static void decide_dd(double *x, double *e, int64_t n, double s_abs, int kind, int64_t *bits_out,
                      int64_t *code_out, int *decided_out) {
    double scale = kind == KIND_MEAN ? (double)n : 1.0;
    double hi, lo, err;
    dd_sum(x, n, e, &hi, &lo, &err);
    double s_rel = 2 * (double)n * U;
    double nu = (double)n * U;
    double g = nu / (1.0 - nu);
    double dc, big;
    if (kind == KIND_MATMUL) {
        dc = g * s_abs;
        big = (1.25 * g) * (s_abs + (double)n * 0x1p-149);
    } else if (kind == KIND_SUM) {
        dc = g * s_abs;
        big = 1.25 * dc;
    } else {
        dc = ((g + 2 * U) * s_abs) / (double)n;
        big = 1.25 * dc;
    }
    double est = (hi + lo) / scale;
    float c32 = (float)est;
    float lo_n = nextafterf(c32, -INFINITY), hi_n = nextafterf(c32, INFINITY);
    double c64 = (double)c32, lo64 = (double)lo_n, hi64 = (double)hi_n;
    double m_lo = (c64 + lo64) * 0.5;
    double m_hi = (c64 + hi64) * 0.5;
    double d_lo = (hi - m_lo * scale) + lo;
    double d_hi = (m_hi * scale - hi) - lo;
    double derr = err + (4 * U) * (np_max(fabs(d_lo), fabs(d_hi)) + fabs(lo));
    double reach = (2 * big) * scale;
    double slack = reach * (s_rel + 0x1p-40);
    double margin = derr + slack;
    int inside = (d_lo > margin) & (d_hi > margin);
    int near_lo = d_lo <= reach;
    int near_hi = d_hi <= reach;
    int clear = (fabs(d_lo - reach) > margin) & (fabs(d_hi - reach) > margin);
    double spacing = near_hi ? hi64 - c64 : c64 - lo64;
    int dir_ok = (16 * big <= spacing * (1 - 0x1p-30)) & (big <= (2 * dc) * (1 - 0x1p-30));
    int dir_clear = (fabs(16 * big - spacing) > (16 * big) * 0x1p-29) & (fabs(big - 2 * dc) > big * 0x1p-29);
    *decided_out = inside & clear & dir_clear & (isfinite(c32) != 0);
    int64_t code = CODE_NONE;
    if (near_lo & near_hi) code = CODE_EXPLICIT;
    if (near_lo ^ near_hi) code = dir_ok ? (near_hi ? CODE_DOWN : CODE_UP) : CODE_EXPLICIT;
    *code_out = code;
    *bits_out = (int64_t)f32_bits(c32 + 0.0f);
}

typedef struct {
    double *t, *x, *e;
} Scratch;

static int scratch_new(Scratch *w, int64_t n) {
    size_t cap = (size_t)n + 2;
    w->t = malloc(cap * sizeof(double));
    w->x = malloc(cap * sizeof(double));
    w->e = malloc(cap * sizeof(double));
    return (w->t && w->x && w->e) ? 0 : -1;
}

static void scratch_free(Scratch *w) {
    free(w->t);
    free(w->x);
    free(w->e);
}

static int64_t index_of(const int64_t *cand, int64_t i) { return cand ? cand[i] : i; }

/* 1 when a candidate index is outside [0, limit) (the op's element count): the caller gets -2. */
static int out_of_range(const int64_t *cand, int64_t c, int64_t limit) {
    if (!cand) return 0;
    for (int64_t i = 0; i < c; i++)
        if (cand[i] < 0 || cand[i] >= limit) return 1;
    return 0;
}

/* The term source from the exported functions' leading arguments: `src` (SRC_*), a MATMUL's `a`
 * [.., M, K], `b` [.., N, K] and optional `bias` [N] (`m`, `k`, `ncols`), or `x`: FP32 rows
 * (SRC_ROWS32) or FP64 term rows (SRC_TERMS64) of `n` terms; `limit`: the number of elements (rows)
 * the source holds, which every candidate index must be below (else the functions return -2). */
#define SRC_ARGS int32_t src, const float *a, const float *b, const float *bias, int64_t m, int64_t k, \
                 int64_t ncols, const void *x, int64_t n, int64_t limit
static Src make_src(int32_t src, const float *a, const float *b, const float *bias, int64_t m, int64_t k,
                    int64_t ncols, const void *x, int64_t n) {
    Src s = {src, bias != NULL, a, b, bias, m, k, ncols, (const float *)x, (const double *)x, n};
    return s;
}

typedef struct {
    Src s;
    int32_t kind;
    const int64_t *cand;
    int64_t c;
    const double *v;
    const float *r;
    double coef, band;
    int64_t *out;
    int64_t kept[64];
} decide_job;

/* One part of vt_rows_decide: candidates [lo, hi), the kept rows written from position lo of each of
 * out's four rows (kept[part]: how many, -1 when its scratch cannot be had). */
static void decide_part(void *p, int part, int64_t lo, int64_t hi) {
    decide_job *d = p;
    const Src *s = &d->s;
    const int64_t nt = n_terms(s), c = d->c;
    Scratch w;
    if (scratch_new(&w, nt)) {
        scratch_free(&w);
        d->kept[part] = -1;
        return;
    }
    int64_t *o_idx = d->out, *o_bits = d->out + c, *o_code = d->out + 2 * c, *o_ok = d->out + 3 * c;
    const double scale = d->kind == KIND_MEAN ? (double)nt : 1.0;
    int64_t j = lo;
    for (int64_t i = lo; i < hi; i++) {
        int64_t idx = index_of(d->cand, i);
        fill_terms(s, idx, w.t);
        double s_abs = np_sum(w.t, nt, 1);
        if (d->v && !still_candidate(d->v[idx], d->r[idx], (d->coef * (s_abs + (double)nt * 0x1p-149)) * d->band))
            continue;
        o_idx[j] = idx;
        o_code[j] = CODE_NONE;
        if (grid_row(w.t, nt, s_abs, d->kind)) {
            float g32 = (float)(np_sum(w.t, nt, 0) / scale);
            if (isfinite(g32)) {
                o_bits[j] = (int64_t)f32_bits(g32 + 0.0f);
                o_ok[j++] = 1;
                continue;
            }
        }
        memcpy(w.x, w.t, (size_t)nt * sizeof(double));
        int ok;
        decide_dd(w.x, w.e, nt, s_abs, d->kind, &o_bits[j], &o_code[j], &ok);
        o_ok[j++] = ok;
    }
    scratch_free(&w);
    d->kept[part] = j - lo;
}

/* The canonical decision of each candidate (round_canonical's vectorised part), compacted: `out`
 * [4, c] receives, for each row the tight filter keeps, its element index (cand, or the row's
 * position), bits, code and decided flag; returns how many rows were kept, or -1 when scratch memory
 * cannot be had (-2: an index out of range). With `v` and `r` (the FP64 values and FP32 outputs of the whole op) the MATMUL
 * tight re-filter runs first, with the bound d = coef (s_abs + n 2^-149) and reach d * band.
 * Then exact-grid rows (decided, code NONE), then the double-double decision. Many candidates run
 * in parts on several threads (parallel.c), their kept rows moved together in order. */
VT_EXPORT int64_t vt_rows_decide(SRC_ARGS, int32_t kind, const int64_t *cand, int64_t c, const double *v,
                                 const float *r, double coef, double band, int64_t *out) {
    if (out_of_range(cand, c, limit)) return -2;
    decide_job d = {.s = make_src(src, a, b, bias, m, k, ncols, x, n), .kind = kind, .cand = cand, .c = c, .v = v,
                    .r = r, .coef = coef, .band = band, .out = out};
    const int parts = vt_parts(c, VT_GRAIN / (n_terms(&d.s) + 1) + 1);
    vt_run_parts(c, parts, decide_part, &d);
    int64_t kept = 0;
    for (int p = 0; p < parts; p++) {
        if (d.kept[p] < 0) return -1;
        const int64_t from = vt_part_start(c, parts, p);
        if (from != kept)
            for (int row = 0; row < 4; row++)
                memmove(out + row * c + kept, out + row * c + from, (size_t)d.kept[p] * sizeof *out);
        kept += d.kept[p];
    }
    return kept;
}

/* vt_rows_decide's common case for the trainer (canonical._round_canonical_at), in the same call:
 * where every kept row is decided with code NONE, writes each one's bits (canonical zero, as
 * `bits.view(float32) + 0.0f`) into r_out at its element index and returns 0; otherwise writes
 * nothing and returns how many kept rows need the full path (undecided, or a code), which the caller
 * then takes from the start. -1 / -2 as vt_rows_decide. `r` and `r_out` may be one array: every
 * read of `r` comes before the first write. */
VT_EXPORT int64_t vt_rows_decide_into(SRC_ARGS, int32_t kind, const int64_t *cand, int64_t c, const double *v,
                                      const float *r, double coef, double band, float *r_out) {
    int64_t *o = malloc((size_t)(c > 0 ? c : 1) * 4 * sizeof(int64_t));
    if (!o) return -1;
    int64_t kept = vt_rows_decide(src, a, b, bias, m, k, ncols, x, n, limit, kind, cand, c, v, r, coef, band, o);
    int64_t attention = 0;
    for (int64_t j = 0; j < kept; j++) attention += !o[3 * c + j] || o[2 * c + j] != CODE_NONE;
    if (kept >= 0 && !attention)
        for (int64_t j = 0; j < kept; j++) {
            uint32_t bits = (uint32_t)o[c + j];
            float f;
            memcpy(&f, &bits, sizeof f);
            r_out[o[j]] = f + 0.0f;
        }
    free(o);
    return kept < 0 ? kept : attention;
}

/* is_exact_rounding's double-double comparison for one element whose n exact terms are in x (capacity
 * n + 1, overwritten; e: scratch of n / 2 + 1), the value their sum divided by `scale` (MEAN: n, else 1):
 * whether the FP32 bits `claimed` are RN32 of it: V_YES, V_NO, or V_UNDECIDED (too close to call in
 * FP64, or not finite). For vt_rows_is_rn32 and replay.c's checked replay; not exported. */
int vt_rn32_verdict(double *x, int64_t n, double *e, double scale, uint32_t claimed) {
    double hi, lo, err;
    dd_sum(x, n, e, &hi, &lo, &err);
    float c32 = bits_f32(claimed);
    float lo_n = nextafterf(c32, -INFINITY), hi_n = nextafterf(c32, INFINITY);
    double c64 = (double)c32;
    double d_lo = (hi - ((c64 + (double)lo_n) * 0.5) * scale) + lo;
    double d_hi = (((c64 + (double)hi_n) * 0.5) * scale - hi) - lo;
    double derr = err + (4 * U) * (np_max(fabs(d_lo), fabs(d_hi)) + fabs(lo));
    int yes = (d_lo > derr) & (d_hi > derr);
    int no = (d_lo < -derr) | (d_hi < -derr);
    return yes ? V_YES : (no ? V_NO : V_UNDECIDED);
}

/* is_exact_rounding's double-double comparison: whether `claimed[i]` (FP32 bits) is RN32 of the
 * element's exact value: V_YES, V_NO, or V_UNDECIDED (too close to call in FP64, or not finite). */
VT_EXPORT int vt_rows_is_rn32(SRC_ARGS, int32_t kind, const int64_t *cand, int64_t c, const uint32_t *claimed,
                              uint8_t *verdict) {
    if (out_of_range(cand, c, limit)) return -2;
    Src s = make_src(src, a, b, bias, m, k, ncols, x, n);
    int64_t nt = n_terms(&s);
    Scratch w;
    if (scratch_new(&w, nt)) {
        scratch_free(&w);
        return -1;
    }
    double scale = kind == KIND_MEAN ? (double)nt : 1.0;
    for (int64_t i = 0; i < c; i++) {
        fill_terms(&s, index_of(cand, i), w.x);
        verdict[i] = (uint8_t)vt_rn32_verdict(w.x, nt, w.e, scale, claimed[i]);
    }
    scratch_free(&w);
    return 0;
}

/* grid_exact of each candidate's terms (grid_elements). */
VT_EXPORT int vt_rows_grid(SRC_ARGS, int32_t kind, const int64_t *cand, int64_t c, uint8_t *grid) {
    if (out_of_range(cand, c, limit)) return -2;
    Src s = make_src(src, a, b, bias, m, k, ncols, x, n);
    int64_t nt = n_terms(&s);
    Scratch w;
    if (scratch_new(&w, nt)) {
        scratch_free(&w);
        return -1;
    }
    for (int64_t i = 0; i < c; i++) {
        fill_terms(&s, index_of(cand, i), w.t);
        grid[i] = (uint8_t)grid_row(w.t, nt, np_sum(w.t, nt, 1), kind);
    }
    scratch_free(&w);
    return 0;
}

/* pw_sum(t, n, 0) of the squares t = x^2 of FP32 values x (exact in FP64), without writing t: the same
 * blocking, pairing and order, so the same bits. */
static double pw_sumsq32(const float *x, int64_t n) {
    if (n < 8) {
        double res = -0.0;
        for (int64_t i = 0; i < n; i++) res += (double)x[i] * (double)x[i];
        return res;
    }
    if (n <= 128) {
        double r[8];
        for (int j = 0; j < 8; j++) r[j] = (double)x[j] * (double)x[j];
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8) {
            double d[8];
            for (int j = 0; j < 8; j++) d[j] = (double)x[i + j];
            for (int j = 0; j < 8; j++) r[j] += d[j] * d[j];
        }
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        for (; i < n; i++) res += (double)x[i] * (double)x[i];
        return res;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    return pw_sumsq32(x, n2) + pw_sumsq32(x + n2, n - n2);
}

/* Row norms for MATMUL's Cauchy-Schwarz bound (executor._norm_bound, native_filter.row_norms):
 * out[i] = sqrt(0.0 + pw_sum(x[i, :]^2)), the bits of numpy's np.sqrt((x * x).sum(axis=-1)) on the
 * C-contiguous FP64 values [rows, k] of FP32 numbers (their squares are exact in FP64), read as
 * FP64 (vt_row_norms) or as the FP32 numbers themselves (vt_row_norms32). vt_row_norms returns 0,
 * or -1 when its scratch row cannot be allocated. */
VT_EXPORT int vt_row_norms(const double *x, int64_t rows, int64_t k, double *out) {
    double *sq = malloc((size_t)(k > 0 ? k : 1) * sizeof(double));
    if (!sq) return -1;
    for (int64_t i = 0; i < rows; i++) {
        const double *xr = x + i * k;
        for (int64_t j = 0; j < k; j++) sq[j] = xr[j] * xr[j];
        out[i] = sqrt(np_sum(sq, k, 0));
    }
    free(sq);
    return 0;
}

typedef struct {
    const float *x;
    int64_t k;
    double *out, *n1, *ninf;
} norms_job;

static void norms2_part(void *p, int part, int64_t lo, int64_t hi) {
    const norms_job *j = p;
    (void)part;
    for (int64_t i = lo; i < hi; i++) j->out[i] = sqrt(0.0 + pw_sumsq32(j->x + i * j->k, j->k));
}

/* (rows in parts on several threads where there are many: each row's norm is computed alone) */
VT_EXPORT void vt_row_norms32(const float *x, int64_t rows, int64_t k, double *out) {
    norms_job j = {.x = x, .k = k, .out = out};
    vt_run_parts(rows, vt_parts(rows, VT_GRAIN / (k > 0 ? k : 1) + 1), norms2_part, &j);
}

/* The Hoelder row norms of FP32 rows [rows, k] for the trainer's MATMUL filter (matmul.c):
 * n1[i] = sum_k |x_ik| in FP64 and ninf[i] = max_k |x_ik| (exact). The sum: 16 partial sums, lane l
 * taking the elements j = l mod 16, then the lanes' in order (any order is within (k - 1) u
 * relative, which the bound's factor covers, as for the Euclidean norms); the AVX2 loop keeps the
 * same lanes, so the same bits. */
#define N1_LANES 16
static void norms1inf_tail(const float *xr, int64_t j, int64_t k, double *s, float *mx, double *n1, double *ninf) {
    for (int l = 0; j < k; j++, l++) {
        const float ax = fabsf(xr[j]);
        s[l] += (double)ax;
        mx[l] = ax > mx[l] ? ax : mx[l];
    }
    double t = 0.0;
    float m = 0.0f;
    for (int l = 0; l < N1_LANES; l++) {
        t += s[l];
        m = mx[l] > m ? mx[l] : m;
    }
    *n1 = t;
    *ninf = (double)m;
}

static void norms1inf_base(const float *x, int64_t rows, int64_t k, double *n1, double *ninf) {
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * k;
        double s[N1_LANES] = {0};
        float mx[N1_LANES] = {0};
        int64_t j = 0;
        for (; j + N1_LANES <= k; j += N1_LANES)
            for (int l = 0; l < N1_LANES; l++) {
                const float ax = fabsf(xr[j + l]);
                s[l] += (double)ax;
                mx[l] = ax > mx[l] ? ax : mx[l];
            }
        norms1inf_tail(xr, j, k, s, mx, n1 + i, ninf + i);
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx2"))) static void norms1inf_avx2(const float *x, int64_t rows, int64_t k, double *n1,
                                                            double *ninf) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (int64_t i = 0; i < rows; i++) {
        const float *xr = x + i * k;
        __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0;
        __m256 m0 = _mm256_setzero_ps(), m1 = m0;
        int64_t j = 0;
        for (; j + N1_LANES <= k; j += N1_LANES) {
            const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xr + j), absmask);
            const __m256 b = _mm256_and_ps(_mm256_loadu_ps(xr + j + 8), absmask);
            m0 = _mm256_max_ps(a, m0);
            m1 = _mm256_max_ps(b, m1);
            s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(a)));
            s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(a, 1)));
            s2 = _mm256_add_pd(s2, _mm256_cvtps_pd(_mm256_castps256_ps128(b)));
            s3 = _mm256_add_pd(s3, _mm256_cvtps_pd(_mm256_extractf128_ps(b, 1)));
        }
        double s[N1_LANES];
        float mx[N1_LANES];
        _mm256_storeu_pd(s, s0);
        _mm256_storeu_pd(s + 4, s1);
        _mm256_storeu_pd(s + 8, s2);
        _mm256_storeu_pd(s + 12, s3);
        _mm256_storeu_ps(mx, m0);
        _mm256_storeu_ps(mx + 8, m1);
        norms1inf_tail(xr, j, k, s, mx, n1 + i, ninf + i);
    }
}
#endif

static int norms_avx2 = -1; /* -1: the CPU decides */

/* Tests: 0 forces the base loop of vt_row_norms1inf32, 1 the AVX2 one where the CPU has it; returns
 * whether the AVX2 loop is in use. */
VT_EXPORT int vt_norms_set_simd(int on) {
#if defined(__x86_64__) && defined(__GNUC__)
    norms_avx2 = on && __builtin_cpu_supports("avx2");
#else
    (void)on;
    norms_avx2 = 0;
#endif
    return norms_avx2;
}

static void norms1inf_part(void *p, int part, int64_t lo, int64_t hi) {
    const norms_job *j = p;
    (void)part;
#if defined(__x86_64__) && defined(__GNUC__)
    if (norms_avx2) {
        norms1inf_avx2(j->x + lo * j->k, hi - lo, j->k, j->n1 + lo, j->ninf + lo);
        return;
    }
#endif
    norms1inf_base(j->x + lo * j->k, hi - lo, j->k, j->n1 + lo, j->ninf + lo);
}

VT_EXPORT void vt_row_norms1inf32(const float *x, int64_t rows, int64_t k, double *n1, double *ninf) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (norms_avx2 < 0) norms_avx2 = __builtin_cpu_supports("avx2") != 0;
#endif
    norms_job j = {.x = x, .k = k, .n1 = n1, .ninf = ninf};
    vt_run_parts(rows, vt_parts(rows, VT_GRAIN / (k > 0 ? k : 1) + 1), norms1inf_part, &j);
}
