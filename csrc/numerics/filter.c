/* Fused FP32 rounding and midpoint-candidate filter (vtrain/numerics/native_filter.py).
 *
 * One pass per element of a C-contiguous FP64 array v: writes r = RN32(v) with canonical zero
 * (+0.0 for -0.0) and appends the flat index of every element where
 *
 *     !( fl( fl(h - |v - r|) - reach ) > 0 )
 *
 * h being the smaller half gap of r to its FP32 neighbours, from r's bits (rounding.min_half_spacing):
 * exactly the IEEE binary64 operations of rounding.midpoint_candidates_np, so the candidate set is
 * the numpy reference's (NaN/Inf always candidates: an empty set proves every element finite).
 * `reach` is computed inline by one of three forms, each the FP64 operation sequence of the Python
 * path it replaces:
 *   dense:    reach = d[i] * scale
 *   relative: reach = (c * |v[i]|) * scale            (EXP/LOG/TANH: d = 4u |v|; ERF: 8u |v|)
 *   scaled32: reach = (((double)s[i] + sub) * factor) * scale
 *             (MATMUL's tight bound from the FP32 |A| @ |B| (+ |bias|): the FP64 copy never exists)
 *   norm:     reach = ((((s) + |bias[j]|) + sub) * factor) * scale, s the smallest of the
 *             Cauchy-Schwarz and the two Hoelder products of row norms (MATMUL's norm bound,
 *             executor._norm_bound; the [M, N] array never exists)
 * and vt_sum_round_filter computes the FP64 values of SUM/MEAN rows itself (numpy's pairwise sums).
 * Compiled with -ffp-contract=off and without -ffast-math: no FMA, no reassociation, x + 0.0f kept. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "parallel.h"

#define VT_EXPORT __attribute__((visibility("default")))

/* RN32(x) with canonical zero into *out; returns 1 where x is a candidate under `reach`, else 0.
 * Branch-free, so the block loops below vectorize. */
static inline uint8_t vt_round_cand(double x, double reach, float *out) {
    float f = (float)x + 0.0f; /* round to nearest even, then -0 -> +0 */
    int32_t bits;
    memcpy(&bits, &f, sizeof bits);
    *out = f;
    int32_t a = (bits & 0x7FFFFFFF) - 1; /* the FP32 number just below |r| (|r| at zero) */
    a = a < 0 ? 0 : a;
    a &= 0x7F800000; /* its exponent: 2^E */
    float pe;
    memcpy(&pe, &a, sizeof pe);
    double h = (double)pe * 0x1p-24;
    h = h < 0x1p-150 ? 0x1p-150 : h; /* h is never NaN (inf for a NaN r) */
    double margin = (h - fabs(x - (double)f)) - reach;
    return (uint8_t)!(margin > 0);
}

#define VT_BLOCK 512
#define VT_INLINE static inline __attribute__((always_inline))

/* The per-block mask loops (mask[i] = candidate, r written), branch-free so that they vectorize.
 * Each is compiled twice, for the base ISA and for AVX2 (chosen at run time): the same IEEE
 * operations lane by lane (no FMA either way), so the same bits; tests compare the two. */
VT_INLINE uint8_t vt_mask_dense(const double *v, const double *d, int64_t len, double scale,
                                float *r, uint8_t *mask) {
    uint8_t any = 0;
    for (int64_t i = 0; i < len; i++) {
        mask[i] = vt_round_cand(v[i], d[i] * scale, &r[i]);
        any |= mask[i];
    }
    return any;
}

VT_INLINE uint8_t vt_mask_relative(const double *v, int64_t len, double c, double scale, float *r,
                                   uint8_t *mask) {
    uint8_t any = 0;
    for (int64_t i = 0; i < len; i++) {
        const double x = v[i];
        mask[i] = vt_round_cand(x, (c * fabs(x)) * scale, &r[i]);
        any |= mask[i];
    }
    return any;
}

/* The norm form with the Hoelder pairs too: s = min(a2 b2_j, a1 binf_j, ainf b1_j) >= sum_k |a_k b_k|
 * (Cauchy-Schwarz and Hoelder's 1/inf inequalities); dd = (((s + |bias_j|) + sub) * factor), reach = dd * scale. */
VT_INLINE uint8_t vt_mask_norm3(const double *v, int64_t len, double a2, double a1, double ai, const double *b2,
                                const double *b1, const double *bi, const double *bias, double sub, double factor,
                                double scale, float *r, uint8_t *mask) {
    uint8_t any = 0;
    if (bias) {
        for (int64_t j = 0; j < len; j++) {
            const double s2 = a2 * b2[j], s1 = a1 * bi[j], si = ai * b1[j];
            const double s12 = s2 < s1 ? s2 : s1;
            const double dd = (((s12 < si ? s12 : si) + fabs(bias[j])) + sub) * factor;
            mask[j] = vt_round_cand(v[j], dd * scale, &r[j]);
            any |= mask[j];
        }
    } else {
        for (int64_t j = 0; j < len; j++) {
            const double s2 = a2 * b2[j], s1 = a1 * bi[j], si = ai * b1[j];
            const double s12 = s2 < s1 ? s2 : s1;
            const double dd = ((s12 < si ? s12 : si) + sub) * factor;
            mask[j] = vt_round_cand(v[j], dd * scale, &r[j]);
            any |= mask[j];
        }
    }
    return any;
}

/* vt_mask_norm3 with its three products one (Cauchy-Schwarz alone): the same bits, a third of the work. */
VT_INLINE uint8_t vt_mask_norm1(const double *v, int64_t len, double a2, const double *b2, const double *bias,
                                double sub, double factor, double scale, float *r, uint8_t *mask) {
    uint8_t any = 0;
    if (bias) {
        for (int64_t j = 0; j < len; j++) {
            const double dd = (((a2 * b2[j]) + fabs(bias[j])) + sub) * factor;
            mask[j] = vt_round_cand(v[j], dd * scale, &r[j]);
            any |= mask[j];
        }
    } else {
        for (int64_t j = 0; j < len; j++) {
            const double dd = ((a2 * b2[j]) + sub) * factor;
            mask[j] = vt_round_cand(v[j], dd * scale, &r[j]);
            any |= mask[j];
        }
    }
    return any;
}

VT_INLINE uint8_t vt_mask_scaled32(const double *v, const float *s, int64_t len, double sub, double factor,
                                   double scale, float *r, uint8_t *mask) {
    uint8_t any = 0;
    for (int64_t i = 0; i < len; i++) {
        const double dd = ((double)s[i] + sub) * factor;
        mask[i] = vt_round_cand(v[i], dd * scale, &r[i]);
        any |= mask[i];
    }
    return any;
}

#if defined(__x86_64__) && defined(__GNUC__)
#define VT_HAVE_AVX2 1
__attribute__((target("avx2"))) static uint8_t vt_mask_scaled32_avx2(const double *v, const float *s, int64_t len,
                                                                     double sub, double factor, double scale,
                                                                     float *r, uint8_t *mask) {
    return vt_mask_scaled32(v, s, len, sub, factor, scale, r, mask);
}
__attribute__((target("avx2"))) static uint8_t vt_mask_dense_avx2(const double *v, const double *d, int64_t len,
                                                                  double scale, float *r, uint8_t *mask) {
    return vt_mask_dense(v, d, len, scale, r, mask);
}
__attribute__((target("avx2"))) static uint8_t vt_mask_relative_avx2(const double *v, int64_t len, double c,
                                                                     double scale, float *r, uint8_t *mask) {
    return vt_mask_relative(v, len, c, scale, r, mask);
}
__attribute__((target("avx2"))) static uint8_t vt_mask_norm3_avx2(
    const double *v, int64_t len, double a2, double a1, double ai, const double *b2, const double *b1,
    const double *bi, const double *bias, double sub, double factor, double scale, float *r, uint8_t *mask) {
    return vt_mask_norm3(v, len, a2, a1, ai, b2, b1, bi, bias, sub, factor, scale, r, mask);
}
__attribute__((target("avx2"))) static uint8_t vt_mask_norm1_avx2(const double *v, int64_t len, double a2,
                                                                  const double *b2, const double *bias, double sub,
                                                                  double factor, double scale, float *r,
                                                                  uint8_t *mask) {
    return vt_mask_norm1(v, len, a2, b2, bias, sub, factor, scale, r, mask);
}
#define VT_AVX512 __attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,prefer-vector-width=512"))) static
VT_AVX512 uint8_t vt_mask_scaled32_avx512(const double *v, const float *s, int64_t len,
                                                                     double sub, double factor, double scale,
                                                                     float *r, uint8_t *mask) {
    return vt_mask_scaled32(v, s, len, sub, factor, scale, r, mask);
}
VT_AVX512 uint8_t vt_mask_dense_avx512(const double *v, const double *d, int64_t len,
                                                                  double scale, float *r, uint8_t *mask) {
    return vt_mask_dense(v, d, len, scale, r, mask);
}
VT_AVX512 uint8_t vt_mask_relative_avx512(const double *v, int64_t len, double c,
                                                                     double scale, float *r, uint8_t *mask) {
    return vt_mask_relative(v, len, c, scale, r, mask);
}
VT_AVX512 uint8_t vt_mask_norm1_avx512(const double *v, int64_t len, double a2, const double *b2, const double *bias,
                                       double sub, double factor, double scale, float *r, uint8_t *mask) {
    return vt_mask_norm1(v, len, a2, b2, bias, sub, factor, scale, r, mask);
}
VT_AVX512 uint8_t vt_mask_norm3_avx512(
    const double *v, int64_t len, double a2, double a1, double ai, const double *b2, const double *b1,
    const double *bi, const double *bias, double sub, double factor, double scale, float *r, uint8_t *mask) {
    return vt_mask_norm3(v, len, a2, a1, ai, b2, b1, bi, bias, sub, factor, scale, r, mask);
}
#else
#define VT_HAVE_AVX2 0
#endif

static int vt_simd = -1; /* -1: not chosen yet; 0: base ISA; 1: AVX2; 2: AVX-512 (F, DQ, VL, BW) */

static int vt_best_simd(void) {
#if VT_HAVE_AVX2
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw"))
        return 2;
    return __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    return 0;
#endif
}

static int vt_use_simd(void) {
    if (vt_simd < 0) vt_simd = vt_best_simd();
    return vt_simd;
}

/* Tests: 0 forces the base-ISA loops, 1 the AVX2 ones, 2 the AVX-512 ones, each where the CPU has them
 * (else the best level below); returns the level in use. */
VT_EXPORT int vt_filter_set_simd(int on) {
    const int best = vt_best_simd();
    vt_simd = on < best ? (on < 0 ? 0 : on) : best;
    return vt_simd;
}

/* Appends base + i for every set mask[i]; returns the new count. */
static inline int64_t vt_append(const uint8_t *mask, int64_t len, int64_t base, int64_t *idx, int64_t k) {
    for (int64_t i = 0; i < len; i += 8) {
        uint64_t w = 0;
        memcpy(&w, mask + i, 8); /* mask is padded to a multiple of 8 with zeros */
        if (!w) continue;
        for (int64_t j = i; j < i + 8 && j < len; j++) {
            idx[k] = base + j;
            k += mask[j];
        }
    }
    return k;
}

/* Whether any candidate's r is not finite (a NaN/Inf is always a candidate: checking those suffices). */
static uint32_t vt_any_nonfinite(const float *r, const int64_t *idx, int64_t k) {
    for (int64_t i = 0; i < k; i++) {
        uint32_t bits;
        memcpy(&bits, &r[idx[i]], sizeof bits);
        if ((bits & 0x7F800000u) == 0x7F800000u) return 1;
    }
    return 0;
}

/* The filters below run in parts on several threads (parallel.c) where the array is large: part p
 * writes its candidates from idx + (its first element), in its own share of idx (a part never has more
 * candidates than elements), and the parts' lists are then moved together in order, so idx is the
 * one-thread list. */
enum { F_DENSE = 0, F_RELATIVE = 1, F_SCALED32 = 2 };

typedef struct {
    int kind;
    const double *v, *d;
    const float *s;
    double c, sub, factor, scale;
    float *r;
    int64_t *idx;
    int64_t count[64];
} vt_flat_filter;

/* One part of a flat filter: elements [lo, hi), candidates from idx + lo. */
static void vt_flat_part(void *p, int part, int64_t lo, int64_t hi) {
    vt_flat_filter *f = p;
    uint8_t mask[VT_BLOCK + 8] = {0};
    const int simd = vt_use_simd();
    int64_t *idx = f->idx + lo;
    int64_t k = 0;
    for (int64_t at = lo; at < hi; at += VT_BLOCK) {
        const int64_t len = hi - at < VT_BLOCK ? hi - at : VT_BLOCK;
        const double *v = f->v + at;
        float *r = f->r + at;
        uint8_t any;
#if VT_HAVE_AVX2
        switch (f->kind) {
        case F_DENSE:
            any = simd == 2 ? vt_mask_dense_avx512(v, f->d + at, len, f->scale, r, mask)
                  : simd    ? vt_mask_dense_avx2(v, f->d + at, len, f->scale, r, mask)
                            : vt_mask_dense(v, f->d + at, len, f->scale, r, mask);
            break;
        case F_RELATIVE:
            any = simd == 2 ? vt_mask_relative_avx512(v, len, f->c, f->scale, r, mask)
                  : simd    ? vt_mask_relative_avx2(v, len, f->c, f->scale, r, mask)
                            : vt_mask_relative(v, len, f->c, f->scale, r, mask);
            break;
        default:
            any = simd == 2 ? vt_mask_scaled32_avx512(v, f->s + at, len, f->sub, f->factor, f->scale, r, mask)
                  : simd    ? vt_mask_scaled32_avx2(v, f->s + at, len, f->sub, f->factor, f->scale, r, mask)
                            : vt_mask_scaled32(v, f->s + at, len, f->sub, f->factor, f->scale, r, mask);
        }
#else
        (void)simd;
        any = f->kind == F_DENSE      ? vt_mask_dense(v, f->d + at, len, f->scale, r, mask)
              : f->kind == F_RELATIVE ? vt_mask_relative(v, len, f->c, f->scale, r, mask)
                                      : vt_mask_scaled32(v, f->s + at, len, f->sub, f->factor, f->scale, r, mask);
#endif
        if (any) {
            k = vt_append(mask, len, at, idx, k);
            memset(mask, 0, sizeof mask);
        }
    }
    f->count[part] = k;
}

/* The parts' candidate lists (part p's from idx + (its first item) * stride) moved together in order;
 * returns their total. */
static int64_t vt_gather_parts(int64_t *idx, int64_t items, int parts, int64_t stride, const int64_t *count) {
    int64_t k = count[0];
    for (int p = 1; p < parts; p++) {
        const int64_t *from = idx + vt_part_start(items, parts, p) * stride;
        if (from != idx + k) memmove(idx + k, from, (size_t)count[p] * sizeof *idx);
        k += count[p];
    }
    return k;
}

static int64_t vt_flat_run(vt_flat_filter *f, int64_t n, uint32_t *nonfinite) {
    (void)vt_use_simd(); /* (chosen here, before the parts' threads read it) */
    const int parts = vt_parts(n, VT_GRAIN);
    vt_run_parts(n, parts, vt_flat_part, f);
    const int64_t k = vt_gather_parts(f->idx, n, parts, 1, f->count);
    *nonfinite = vt_any_nonfinite(f->r, f->idx, k);
    return k;
}

/* reach = d[i] * scale. Returns the number of candidates written to idx (capacity n). */
VT_EXPORT int64_t vt_round_filter_dense(const double *v, const double *d, int64_t n, double scale,
                                        float *r, int64_t *idx, uint32_t *nonfinite) {
    vt_flat_filter f = {.kind = F_DENSE, .v = v, .d = d, .scale = scale, .r = r, .idx = idx};
    return vt_flat_run(&f, n, nonfinite);
}

/* reach = (c * |v[i]|) * scale. */
VT_EXPORT int64_t vt_round_filter_relative(const double *v, int64_t n, double c, double scale,
                                           float *r, int64_t *idx, uint32_t *nonfinite) {
    vt_flat_filter f = {.kind = F_RELATIVE, .v = v, .c = c, .scale = scale, .r = r, .idx = idx};
    return vt_flat_run(&f, n, nonfinite);
}

/* reach = ((((double)s[i]) + sub) * factor) * scale: MATMUL's tight bound from the FP32 |A| @ |B| (+ |bias|). */
VT_EXPORT int64_t vt_round_filter_scaled32(const double *v, const float *s, int64_t n, double sub, double factor,
                                           double scale, float *r, int64_t *idx, uint32_t *nonfinite) {
    vt_flat_filter f = {.kind = F_SCALED32, .v = v, .s = s, .sub = sub, .factor = factor, .scale = scale, .r = r,
                        .idx = idx};
    return vt_flat_run(&f, n, nonfinite);
}

typedef struct {
    const double *v;
    int64_t m, ncols;
    const double *na, *nb, *na1, *nai, *nb1, *nbi, *bias;
    double sub, factor, scale;
    float *r;
    int64_t *idx;
    int one; /* the Cauchy-Schwarz product alone (na1 .. nbi unused) */
    int64_t count[64];
} vt_norm3_filter;

/* One part of vt_round_filter_norm3: rows [lo, hi), candidates from idx + lo * ncols. */
static void vt_norm3_part(void *p, int part, int64_t lo, int64_t hi) {
    const vt_norm3_filter *f = p;
    uint8_t mask[VT_BLOCK + 8] = {0};
    const int simd = vt_use_simd();
    const int64_t ncols = f->ncols;
    int64_t *idx = f->idx + lo * ncols;
    int64_t k = 0;
    for (int64_t i = lo; i < hi; i++) {
        const int64_t off = (i / f->m) * ncols;
        const double a2 = f->na[i], a1 = f->one ? 0.0 : f->na1[i], ai = f->one ? 0.0 : f->nai[i];
        for (int64_t c0 = 0; c0 < ncols; c0 += VT_BLOCK) {
            const int64_t len = ncols - c0 < VT_BLOCK ? ncols - c0 : VT_BLOCK;
            const int64_t at = i * ncols + c0;
            const double *bl = f->bias ? f->bias + c0 : NULL;
            const double *b2 = f->nb + off + c0, *b1 = f->one ? b2 : f->nb1 + off + c0,
                         *bi = f->one ? b2 : f->nbi + off + c0;
            uint8_t any;
#if VT_HAVE_AVX2
            if (f->one)
                any = simd == 2 ? vt_mask_norm1_avx512(f->v + at, len, a2, b2, bl, f->sub, f->factor, f->scale,
                                                       f->r + at, mask)
                      : simd    ? vt_mask_norm1_avx2(f->v + at, len, a2, b2, bl, f->sub, f->factor, f->scale,
                                                     f->r + at, mask)
                                : vt_mask_norm1(f->v + at, len, a2, b2, bl, f->sub, f->factor, f->scale, f->r + at,
                                                mask);
            else
                any = simd == 2 ? vt_mask_norm3_avx512(f->v + at, len, a2, a1, ai, b2, b1, bi, bl, f->sub, f->factor,
                                                       f->scale, f->r + at, mask)
                      : simd    ? vt_mask_norm3_avx2(f->v + at, len, a2, a1, ai, b2, b1, bi, bl, f->sub, f->factor,
                                                     f->scale, f->r + at, mask)
                                : vt_mask_norm3(f->v + at, len, a2, a1, ai, b2, b1, bi, bl, f->sub, f->factor,
                                                f->scale, f->r + at, mask);
#else
            (void)simd;
            any = f->one ? vt_mask_norm1(f->v + at, len, a2, b2, bl, f->sub, f->factor, f->scale, f->r + at, mask)
                         : vt_mask_norm3(f->v + at, len, a2, a1, ai, b2, b1, bi, bl, f->sub, f->factor, f->scale,
                                         f->r + at, mask);
#endif
            if (any) {
                k = vt_append(mask, len, at, idx, k);
                memset(mask, 0, sizeof mask);
            }
        }
    }
    ((vt_norm3_filter *)p)->count[part] = k;
}

/* vt_round_filter_norm under the smaller of three bounds of sum_k |a_k b_k| per element: the
 * Cauchy-Schwarz na * nb and Hoelder's na1 * nbinf and nainf * nb1 (vt_row_norms1inf32), each a valid
 * upper bound, so their minimum is; reach = ((((min) + |bias_j|) + sub) * factor) * scale. The trainer's
 * canonical MATMUL filter (matmul.c): fewer candidates where rows are peaked (a softmax gradient, a
 * one-hot), never a missed one. */
VT_EXPORT int64_t vt_round_filter_norm3(const double *v, int64_t rows, int64_t m, int64_t ncols,
                                        const double *na, const double *nb, const double *na1, const double *nai,
                                        const double *nb1, const double *nbi, const double *bias, double sub,
                                        double factor, double scale, float *r, int64_t *idx, uint32_t *nonfinite) {
    vt_norm3_filter f = {.v = v, .m = m, .ncols = ncols, .na = na, .nb = nb, .na1 = na1, .nai = nai, .nb1 = nb1,
                         .nbi = nbi, .bias = bias, .sub = sub, .factor = factor, .scale = scale, .r = r, .idx = idx,
                         .one = na1 == NULL};
    (void)vt_use_simd(); /* (chosen here, before the parts' threads read it) */
    const int parts = ncols > 0 ? vt_parts(rows, VT_GRAIN / ncols + 1) : 1;
    vt_run_parts(rows, parts, vt_norm3_part, &f);
    const int64_t k = vt_gather_parts(idx, rows, parts, ncols, f.count);
    *nonfinite = vt_any_nonfinite(r, idx, k);
    return k;
}

/* The candidates idx[0..count) of the Cauchy-Schwarz filter (vt_round_filter_norm) that stay
 * candidates under vt_round_filter_norm3's bound, in order, in place; returns their count. The
 * three-product bound is never above the one product, so every candidate of vt_round_filter_norm3 is
 * one of vt_round_filter_norm's, and each is tested by the same operations: the list is exactly
 * vt_round_filter_norm3's (r is RN32(v) either way). */
int64_t vt_refine_norm3(const double *v, int64_t m, int64_t ncols, const double *na, const double *nb,
                        const double *na1, const double *nai, const double *nb1, const double *nbi,
                        const double *bias, double sub, double factor, double scale, float *r, int64_t *idx,
                        int64_t count) {
    int64_t k = 0;
    for (int64_t c = 0; c < count; c++) {
        const int64_t e = idx[c], i = e / ncols, j = e % ncols, col = (i / m) * ncols + j;
        uint8_t mask;
        float ri;
        vt_mask_norm3(v + e, 1, na[i], na1[i], nai[i], nb + col, nb1 + col, nbi + col, bias ? bias + j : NULL, sub,
                      factor, scale, &ri, &mask);
        r[e] = ri;
        idx[k] = e;
        k += mask;
    }
    return k;
}

/* v is [rows, ncols] (rows = batches * m); row i of batch b = i / m reads na[i] and nb[b * ncols + j];
 * bias (FP64, ncols values) may be NULL. reach = ((((na * nb) + |bias_j|) + sub) * factor) * scale: the
 * Cauchy-Schwarz bound alone: vt_round_filter_norm3 with its three products all na * nb (the same bits),
 * by a loop with the one product (vt_mask_norm1; the Hoelder norms NULL). */
VT_EXPORT int64_t vt_round_filter_norm(const double *v, int64_t rows, int64_t m, int64_t ncols,
                                       const double *na, const double *nb, const double *bias,
                                       double sub, double factor, double scale,
                                       float *r, int64_t *idx, uint32_t *nonfinite) {
    return vt_round_filter_norm3(v, rows, m, ncols, na, nb, NULL, NULL, NULL, NULL, bias, sub, factor, scale, r, idx,
                                 nonfinite);
}

/* r = RN32(v) with canonical zero, no filter (exact ops); returns whether any r is not finite. */
VT_EXPORT uint32_t vt_round_fp32(const double *v, int64_t n, float *r) {
    uint32_t nf = 0;
    for (int64_t i = 0; i < n; i++) {
        float f = (float)v[i] + 0.0f;
        uint32_t bits;
        memcpy(&bits, &f, sizeof bits);
        nf |= (bits & 0x7F800000u) == 0x7F800000u;
        r[i] = f;
    }
    return nf;
}

/* pw_sum (pairwise.h) of the FP64 values of x[0..n) and of their absolute values at once: the same
 * blocking, pairing and order, so the bits of pw_sum(t, n, 0) and pw_sum(t, n, 1) for t = (double)x. */
static void vt_pw_sum2(const float *x, int64_t n, double *sum, double *abs_sum) {
    if (n < 8) {
        double res = -0.0, ares = -0.0;
        for (int64_t i = 0; i < n; i++) {
            res += (double)x[i];
            ares += fabs((double)x[i]);
        }
        *sum = res;
        *abs_sum = ares;
        return;
    }
    if (n <= 128) {
        double r[8], q[8];
        for (int j = 0; j < 8; j++) {
            r[j] = (double)x[j];
            q[j] = fabs((double)x[j]);
        }
        int64_t i;
        for (i = 8; i < n - (n % 8); i += 8) {
            double d[8];
            for (int j = 0; j < 8; j++) d[j] = (double)x[i + j];
            for (int j = 0; j < 8; j++) r[j] += d[j];
            for (int j = 0; j < 8; j++) q[j] += fabs(d[j]);
        }
        double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
        double ares = ((q[0] + q[1]) + (q[2] + q[3])) + ((q[4] + q[5]) + (q[6] + q[7]));
        for (; i < n; i++) {
            res += (double)x[i];
            ares += fabs((double)x[i]);
        }
        *sum = res;
        *abs_sum = ares;
        return;
    }
    int64_t n2 = n / 2;
    n2 -= n2 % 8;
    double s1, a1, s2, a2;
    vt_pw_sum2(x, n2, &s1, &a1);
    vt_pw_sum2(x + n2, n - n2, &s2, &a2);
    *sum = s1 + s2;
    *abs_sum = a1 + a2;
}

/* SUM/MEAN of the rows of an FP32 x [rows, n] for the canonical trainer, with its bound and filter in
 * one pass over x: per row (numpy's pairwise sums from 0.0 of the exact FP64 values, np_sum)
 *     v = sum x (MEAN: sum x / n),  s = sum |x|,  reach = ((s + 0.0) * factor) * scale,
 * then r = RN32(v) and the candidate test of vt_round_cand. The reference is
 * canonical.sum_round_filter_np. Returns the candidate count. */
typedef struct {
    const float *x;
    int64_t n;
    int32_t mean;
    double factor, scale;
    double *v, *d; /* vt_sum_values_filter's outputs (NULL: vt_sum_round_filter) */
    float *r;
    int64_t *idx;
    int64_t count[64];
} vt_sum_filter;

/* One part of the SUM/MEAN filters: rows [lo, hi), candidates (row indices) from idx + lo. */
static void vt_sum_part(void *p, int part, int64_t lo, int64_t hi) {
    vt_sum_filter *f = p;
    int64_t *idx = f->idx + lo;
    int64_t k = 0;
    for (int64_t i = lo; i < hi; i++) {
        double v, s;
        vt_pw_sum2(f->x + i * f->n, f->n, &v, &s);
        v = 0.0 + v;
        if (f->mean) v = v / (double)f->n;
        double reach;
        if (f->v) {
            f->v[i] = v;
            f->d[i] = ((0.0 + s) + 0.0) * f->factor;
            reach = f->d[i] * f->scale;
        } else {
            reach = (((0.0 + s) + 0.0) * f->factor) * f->scale;
        }
        idx[k] = i;
        k += vt_round_cand(v, reach, &f->r[i]);
    }
    f->count[part] = k;
}

static int64_t vt_sum_run(vt_sum_filter *f, int64_t rows, uint32_t *nonfinite) {
    const int parts = f->n > 0 ? vt_parts(rows, VT_GRAIN / f->n + 1) : 1;
    vt_run_parts(rows, parts, vt_sum_part, f);
    const int64_t k = vt_gather_parts(f->idx, rows, parts, 1, f->count);
    *nonfinite = vt_any_nonfinite(f->r, f->idx, k);
    return k;
}

VT_EXPORT int64_t vt_sum_round_filter(const float *x, int64_t rows, int64_t n, int32_t mean, double factor,
                                      double scale, float *r, int64_t *idx, uint32_t *nonfinite) {
    vt_sum_filter f = {.x = x, .n = n, .mean = mean, .factor = factor, .scale = scale, .r = r, .idx = idx};
    return vt_sum_run(&f, rows, nonfinite);
}

/* The FP64 values and bounds of SUM/MEAN rows of an FP32 x [rows, n] for the checked replay, with its
 * filter, in one pass over x: per row, v and s as in vt_sum_round_filter (numpy's pairwise sums from 0.0),
 *     v[i] = sum x (MEAN: / n),  d[i] = ((s + 0.0) + 0.0) * factor,
 * the bits of canonical.sum_values_np, then r = RN32(v) and the candidate test of vt_round_cand at
 * reach d[i] * scale (vt_round_filter_dense's operations on v and d). The replay's rounding-log checks
 * read v and d at their candidates and entries: the [rows, n] FP64 copy never exists. Returns the
 * candidate count. */
VT_EXPORT int64_t vt_sum_values_filter(const float *x, int64_t rows, int64_t n, int32_t mean, double factor,
                                       double scale, double *v, double *d, float *r, int64_t *idx,
                                       uint32_t *nonfinite) {
    vt_sum_filter f = {.x = x, .n = n, .mean = mean, .factor = factor, .scale = scale, .v = v, .d = d, .r = r,
                       .idx = idx};
    return vt_sum_run(&f, rows, nonfinite);
}
