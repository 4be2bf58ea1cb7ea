/* FP32-exact elementwise ops of the executor (vtrain/numerics/fp32_native.py): one IEEE binary32
 * add, sub, mul or div per element (what torch's FP32 CPU kernels compute: each is correctly
 * rounded, so the result is RN32 of the exact value), the canonical zero (+0.0f added: -0 -> +0
 * under round-to-nearest) and the NaN/Inf check, all in one pass over a broadcast index space.
 *
 * Compiled with -ffp-contract=off -fno-fast-math (Makefile): no FMA, no reassociation, signed
 * zeros and subnormals kept (no FTZ/DAZ is set here; torch does not set them either). */
#include <stdint.h>
#include <string.h>

#include "parallel.h"

#define VT_EXPORT __attribute__((visibility("default")))

/* On x86-64 the rows are also built for AVX2 and AVX-512 (picked at load time): the same IEEE
 * operations on wider vectors, so the same bits (no FMA: -ffp-contract=off holds for every clone). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define VT_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define VT_CLONES
#endif
#define VT_MAX_DIMS 16

enum { VT_ADD = 0, VT_SUB = 1, VT_MUL = 2, VT_DIV = 3 };

static inline uint32_t bits_of(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* One row of n elements: a and b advance by sa and sb (0 or any stride, in elements).
 * Returns a nonzero value when some output is NaN or Inf (exponent all ones). */
#define VT_ROW(NAME, EXPR)                                                                         \
    VT_CLONES static uint32_t NAME(const float *a, int64_t sa, const float *b, int64_t sb, float *out,     \
                         int64_t n) {                                                              \
        uint32_t bad = 0;                                                                          \
        if (sa == 1 && sb == 1) {                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i], y = b[i];                                                          \
                float r = (EXPR) + 0.0f;                                                           \
                out[i] = r;                                                                        \
                bad |= (uint32_t)((bits_of(r) & 0x7F800000u) == 0x7F800000u);                      \
            }                                                                                      \
        } else if (sa == 1 && sb == 0) {                                                           \
            const float y = b[0];                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i];                                                                    \
                float r = (EXPR) + 0.0f;                                                           \
                out[i] = r;                                                                        \
                bad |= (uint32_t)((bits_of(r) & 0x7F800000u) == 0x7F800000u);                      \
            }                                                                                      \
        } else if (sa == 0 && sb == 1) {                                                           \
            const float x = a[0];                                                                  \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float y = b[i];                                                                    \
                float r = (EXPR) + 0.0f;                                                           \
                out[i] = r;                                                                        \
                bad |= (uint32_t)((bits_of(r) & 0x7F800000u) == 0x7F800000u);                      \
            }                                                                                      \
        } else {                                                                                   \
            for (int64_t i = 0; i < n; i++) {                                                      \
                float x = a[i * sa], y = b[i * sb];                                                \
                float r = (EXPR) + 0.0f;                                                           \
                out[i] = r;                                                                        \
                bad |= (uint32_t)((bits_of(r) & 0x7F800000u) == 0x7F800000u);                      \
            }                                                                                      \
        }                                                                                          \
        return bad;                                                                                \
    }

VT_ROW(row_add, x + y)
VT_ROW(row_sub, x - y)
VT_ROW(row_mul, x * y)
VT_ROW(row_div, x / y)

typedef uint32_t (*row_fn)(const float *, int64_t, const float *, int64_t, float *, int64_t);

/* out = a OP b over `shape` (ndim dims, C order; out is contiguous), a and b read with the strides
 * sa and sb (in elements; 0 on a broadcast dim), each result plus +0.0f. Returns 1 when every output
 * is finite, 0 when some is NaN/Inf, -1 on a bad argument (unknown op, too many dims). */
VT_EXPORT int vt_fp32_binary(int op, const float *a, const int64_t *sa, const float *b,
                             const int64_t *sb, float *out, const int64_t *shape, int ndim) {
    row_fn row;
    switch (op) {
    case VT_ADD: row = row_add; break;
    case VT_SUB: row = row_sub; break;
    case VT_MUL: row = row_mul; break;
    case VT_DIV: row = row_div; break;
    default: return -1;
    }
    if (ndim < 0 || ndim > VT_MAX_DIMS) return -1;
    /* Collapse: drop size-1 dims, merge a dim into the next where both inputs step through them
     * as one (stride[i] == stride[i+1] * shape[i+1]). Dims kept in C order. */
    int64_t n[VT_MAX_DIMS], xa[VT_MAX_DIMS], xb[VT_MAX_DIMS];
    int d = 0;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] == 0) return 1;
        if (shape[i] == 1) continue;
        if (d > 0 && xa[d - 1] == sa[i] * shape[i] && xb[d - 1] == sb[i] * shape[i]) {
            n[d - 1] *= shape[i];
            xa[d - 1] = sa[i];
            xb[d - 1] = sb[i];
            continue;
        }
        n[d] = shape[i];
        xa[d] = sa[i];
        xb[d] = sb[i];
        d++;
    }
    if (d == 0) { /* one element */
        n[0] = 1;
        xa[0] = 0;
        xb[0] = 0;
        d = 1;
    }
    const int64_t inner = n[d - 1];
    uint32_t bad = 0;
    int64_t idx[VT_MAX_DIMS] = {0};
    int64_t oa = 0, ob = 0;
    for (;;) {
        bad |= row(a + oa, xa[d - 1], b + ob, xb[d - 1], out, inner);
        out += inner;
        int k = d - 2;
        while (k >= 0) {
            idx[k]++;
            oa += xa[k];
            ob += xb[k];
            if (idx[k] < n[k]) break;
            oa -= xa[k] * n[k];
            ob -= xb[k] * n[k];
            idx[k] = 0;
            k--;
        }
        if (k < 0) break;
    }
    return bad ? 0 : 1;
}

/* SQRT: RN32 of the square root of each FP32 value, plus +0.0f. The FP64 path computes
 * RN32(sqrt64(x)); both sqrt64 and the single-precision sqrt (sqrtss/sqrtps) are IEEE correctly
 * rounded and double rounding is innocuous (53 >= 2*24 + 2), so RN32(sqrt64(x)) = sqrt32(x): the
 * same bits. SSE intrinsics on x86-64 (the libm call would set errno and not vectorise). */
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static uint32_t row_sqrt(const float *a, float *out, int64_t n) {
    uint32_t bad = 0;
    int64_t i = 0;
#if defined(__x86_64__)
    const __m128 zero = _mm_setzero_ps();
    const __m128i expo = _mm_set1_epi32(0x7F800000);
    __m128i acc = _mm_setzero_si128();
    for (; i + 4 <= n; i += 4) {
        __m128 r = _mm_add_ps(_mm_sqrt_ps(_mm_loadu_ps(a + i)), zero);
        _mm_storeu_ps(out + i, r);
        __m128i e = _mm_and_si128(_mm_castps_si128(r), expo);
        acc = _mm_or_si128(acc, _mm_cmpeq_epi32(e, expo));
    }
    bad = (uint32_t)_mm_movemask_epi8(acc);
#endif
    for (; i < n; i++) {
        float r = __builtin_sqrtf(a[i]) + 0.0f;
        out[i] = r;
        bad |= (uint32_t)((bits_of(r) & 0x7F800000u) == 0x7F800000u);
    }
    return bad;
}

/* out[i] = RN32(sqrt(a[i])) + 0.0f for n contiguous elements; 1 when all are finite, else 0. */
VT_EXPORT int vt_fp32_sqrt(const float *a, float *out, int64_t n) {
    return row_sqrt(a, out, n) ? 0 : 1;
}

/* Data movement (executor._move's PERMUTE of the last two axes): out[b, j, i] = a[b, i, j] for
 * `batches` C-contiguous [rows, cols] matrices, in 16 x 16 tiles (bits copied, no arithmetic); on
 * x86-64 with AVX2 the full 8 x 8 blocks go through vector registers (loads, shuffles, stores: the
 * bits moved, NaN payloads included). */
#define VT_TILE 16
static void vt_transpose_tile(const float *ab, int64_t rows, int64_t cols, float *ob, int64_t i0, int64_t i1,
                              int64_t j0, int64_t j1) {
    for (int64_t j = j0; j < j1; j++)
        for (int64_t i = i0; i < i1; i++) ob[j * rows + i] = ab[i * cols + j];
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2"))) static void vt_t8x8(const float *a, int64_t lda, float *o, int64_t ldo) {
    __m256 r0 = _mm256_loadu_ps(a), r1 = _mm256_loadu_ps(a + lda), r2 = _mm256_loadu_ps(a + 2 * lda),
           r3 = _mm256_loadu_ps(a + 3 * lda), r4 = _mm256_loadu_ps(a + 4 * lda), r5 = _mm256_loadu_ps(a + 5 * lda),
           r6 = _mm256_loadu_ps(a + 6 * lda), r7 = _mm256_loadu_ps(a + 7 * lda);
    __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1), t2 = _mm256_unpacklo_ps(r2, r3),
           t3 = _mm256_unpackhi_ps(r2, r3), t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
           t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
    __m256 s0 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(1, 0, 1, 0)), s1 = _mm256_shuffle_ps(t0, t2, _MM_SHUFFLE(3, 2, 3, 2)),
           s2 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(1, 0, 1, 0)), s3 = _mm256_shuffle_ps(t1, t3, _MM_SHUFFLE(3, 2, 3, 2)),
           s4 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(1, 0, 1, 0)), s5 = _mm256_shuffle_ps(t4, t6, _MM_SHUFFLE(3, 2, 3, 2)),
           s6 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(1, 0, 1, 0)), s7 = _mm256_shuffle_ps(t5, t7, _MM_SHUFFLE(3, 2, 3, 2));
    _mm256_storeu_ps(o, _mm256_permute2f128_ps(s0, s4, 0x20));
    _mm256_storeu_ps(o + ldo, _mm256_permute2f128_ps(s1, s5, 0x20));
    _mm256_storeu_ps(o + 2 * ldo, _mm256_permute2f128_ps(s2, s6, 0x20));
    _mm256_storeu_ps(o + 3 * ldo, _mm256_permute2f128_ps(s3, s7, 0x20));
    _mm256_storeu_ps(o + 4 * ldo, _mm256_permute2f128_ps(s0, s4, 0x31));
    _mm256_storeu_ps(o + 5 * ldo, _mm256_permute2f128_ps(s1, s5, 0x31));
    _mm256_storeu_ps(o + 6 * ldo, _mm256_permute2f128_ps(s2, s6, 0x31));
    _mm256_storeu_ps(o + 7 * ldo, _mm256_permute2f128_ps(s3, s7, 0x31));
}

/* Rows [i_lo, i_hi) of one matrix. */
__attribute__((target("avx2"))) static void vt_transpose_avx2(const float *ab, int64_t rows, int64_t cols, float *ob,
                                                              int64_t i_lo, int64_t i_hi) {
    const int64_t r8 = i_hi - (i_hi - i_lo) % 8, c8 = cols - cols % 8;
    for (int64_t i0 = i_lo; i0 < r8; i0 += VT_TILE) {
        const int64_t i1 = i0 + VT_TILE < r8 ? i0 + VT_TILE : r8;
        for (int64_t j0 = 0; j0 < c8; j0 += VT_TILE) {
            const int64_t j1 = j0 + VT_TILE < c8 ? j0 + VT_TILE : c8;
            for (int64_t i = i0; i < i1; i += 8)
                for (int64_t j = j0; j < j1; j += 8) vt_t8x8(ab + i * cols + j, cols, ob + j * rows + i, rows);
        }
    }
    if (c8 < cols) vt_transpose_tile(ab, rows, cols, ob, i_lo, i_hi, c8, cols); /* the last columns */
    if (r8 < i_hi) vt_transpose_tile(ab, rows, cols, ob, r8, i_hi, 0, c8);      /* the last rows */
}
#endif

static int vt_transpose_simd = -1; /* -1: not chosen yet; 0: tiles; 1: AVX2 blocks */

/* Tests: 0 forces the scalar tiles, 1 the AVX2 blocks where the CPU has them; returns the level in use. */
VT_EXPORT int vt_transpose_set_simd(int on) {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    vt_transpose_simd = on && __builtin_cpu_supports("avx2") ? 1 : 0;
#else
    (void)on;
    vt_transpose_simd = 0;
#endif
    return vt_transpose_simd;
}

typedef struct {
    const float *a;
    int64_t rows, cols, total;
    float *out;
} transpose_job;

/* One part of vt_transpose32: the global rows [lo, hi) of the batches' matrices (its ends rounded
 * down to a multiple of 8, the same rounding on both sides of a shared end). */
static void transpose_part(void *p, int part, int64_t lo, int64_t hi) {
    const transpose_job *t = p;
    (void)part;
    lo -= lo % 8;
    if (hi < t->total) hi -= hi % 8;
    const int64_t rows = t->rows, cols = t->cols;
    for (int64_t g = lo; g < hi;) {
        const int64_t b = g / rows, i_lo = g - b * rows;
        const int64_t i_hi = hi - b * rows < rows ? hi - b * rows : rows;
        const float *ab = t->a + b * rows * cols;
        float *ob = t->out + b * rows * cols;
#if defined(__x86_64__) && defined(__GNUC__)
        if (vt_transpose_simd == 1) {
            vt_transpose_avx2(ab, rows, cols, ob, i_lo, i_hi);
            g += i_hi - i_lo;
            continue;
        }
#endif
        for (int64_t i0 = i_lo; i0 < i_hi; i0 += VT_TILE) {
            const int64_t i1 = i0 + VT_TILE < i_hi ? i0 + VT_TILE : i_hi;
            for (int64_t j0 = 0; j0 < cols; j0 += VT_TILE) {
                const int64_t j1 = j0 + VT_TILE < cols ? j0 + VT_TILE : cols;
                vt_transpose_tile(ab, rows, cols, ob, i0, i1, j0, j1);
            }
        }
        g += i_hi - i_lo;
    }
}

/* (in parts on several threads where the matrices are large: each element is copied once, by one) */
VT_EXPORT void vt_transpose32(const float *a, int64_t batches, int64_t rows, int64_t cols, float *out) {
    if (vt_transpose_simd < 0) vt_transpose_set_simd(1);
    if (batches <= 0 || rows <= 0 || cols <= 0) return;
    transpose_job t = {.a = a, .rows = rows, .cols = cols, .total = batches * rows, .out = out};
    vt_run_parts(t.total, vt_parts(t.total, VT_GRAIN / cols + 8), transpose_part, &t);
}

/* A chain of FP32-exact ops over n elements in one pass (fp32_native.Chain, the executor's fused
 * elementwise groups): the same row functions as vt_fp32_binary and vt_fp32_sqrt, run block by block
 * so that the chain's inner values stay in cache and are never written out. Registers 0..n_regs-1,
 * by reg_kind[r]: 1 (element i at reg_ptr[r][i]: an input, or an output buffer the chain writes),
 * 0 (one value read for all elements: a scalar), 2 (element i at reg_ptr[r][i / reg_param[r]]: one
 * value per row of reg_param[r] elements), 3 (element i at reg_ptr[r][i % reg_param[r]]: a tile
 * repeated), -1 (scratch: an inner value). Kinds 2 and 3 are copied block by block into scratch (bits
 * copied, no arithmetic). ops: 4 int32 per op (code, dst, a, b), code VT_ADD..VT_DIV or VT_SQRT (b
 * unused; a not a scalar); each dst is written once, by one op, before any op reads it. Returns 1
 * when every op's output is finite, 0 when some is NaN/Inf, -1 on a bad argument or when the scratch
 * cannot be allocated. */
#include <stdlib.h>
enum { VT_SQRT = 4 };
#define VT_CHAIN_BLOCK 1024
typedef struct {
    int32_t n_regs;
    float *const *reg_ptr;
    const int32_t *reg_kind;
    const int64_t *reg_param;
    int32_t n_ops;
    const int32_t *ops;
    const int32_t *slot;
    int32_t n_scratch;
    uint32_t bad[64];
    int failed[64];
} chain_job;

/* One part of vt_fp32_chain: elements [lo_part, hi), block by block, with its own scratch. */
static void chain_part(void *p, int part, int64_t lo_part, int64_t n) {
    chain_job *job = p;
    const int32_t n_regs = job->n_regs, n_ops = job->n_ops;
    float *const *reg_ptr = job->reg_ptr;
    const int32_t *reg_kind = job->reg_kind, *ops = job->ops, *slot = job->slot;
    const int64_t *reg_param = job->reg_param;
    job->bad[part] = 0;
    job->failed[part] = 0;
    float *scratch = job->n_scratch ? malloc((size_t)job->n_scratch * VT_CHAIN_BLOCK * sizeof(float)) : NULL;
    if (job->n_scratch && !scratch) {
        job->failed[part] = 1;
        return;
    }
    uint32_t bad = 0;
    for (int64_t lo = lo_part; lo < n; lo += VT_CHAIN_BLOCK) {
        const int64_t len = n - lo < VT_CHAIN_BLOCK ? n - lo : VT_CHAIN_BLOCK;
        for (int32_t r = 0; r < n_regs; r++) { /* broadcast inputs: this block's elements */
            if (reg_kind[r] < 2) continue;
            float *dst = scratch + (int64_t)slot[r] * VT_CHAIN_BLOCK;
            const float *src = reg_ptr[r];
            const int64_t p = reg_param[r];
            /* (run by run: one value per row, or a piece of the tile; the bits copied) */
            if (reg_kind[r] == 2) {
                for (int64_t j = 0; j < len;) {
                    const int64_t row = (lo + j) / p;
                    const int64_t next = (row + 1) * p - lo; /* this block's first j of the next row */
                    const int64_t stop = next < len ? next : len;
                    const float v = src[row];
                    for (; j < stop; j++) dst[j] = v;
                }
            } else {
                for (int64_t j = 0; j < len;) {
                    const int64_t at = (lo + j) % p;
                    const int64_t run = p - at < len - j ? p - at : len - j;
                    memcpy(dst + j, src + at, (size_t)run * sizeof(float));
                    j += run;
                }
            }
        }
        for (int32_t k = 0; k < n_ops; k++) {
            const int32_t *o = ops + 4 * k;
#define VT_REG(r, S) (reg_kind[r] == 0 ? ((S) = 0, reg_ptr[r]) \
                      : reg_kind[r] == 1 ? ((S) = 1, reg_ptr[r] + lo) \
                      : ((S) = 1, scratch + (int64_t)slot[r] * VT_CHAIN_BLOCK))
            int64_t sd, sa, sb = 0;
            float *d = VT_REG(o[1], sd);
            const float *a = VT_REG(o[2], sa);
            switch (o[0]) {
            case VT_SQRT: bad |= row_sqrt(a, d, len); break;
            default: {
                const float *b = VT_REG(o[3], sb);
                switch (o[0]) {
                case VT_ADD: bad |= row_add(a, sa, b, sb, d, len); break;
                case VT_SUB: bad |= row_sub(a, sa, b, sb, d, len); break;
                case VT_MUL: bad |= row_mul(a, sa, b, sb, d, len); break;
                default: bad |= row_div(a, sa, b, sb, d, len); break;
                }
            }
            }
#undef VT_REG
            (void)sd;
        }
    }
    free(scratch);
    job->bad[part] = bad;
}

VT_EXPORT int vt_fp32_chain(int64_t n, int32_t n_regs, float *const *reg_ptr, const int32_t *reg_kind,
                            const int64_t *reg_param, int32_t n_ops, const int32_t *ops) {
    if (n < 0 || n_regs <= 0 || n_ops <= 0) return -1;
    int32_t n_scratch = 0;
    int32_t *slot = malloc((size_t)n_regs * sizeof *slot);
    if (!slot) return -1;
    for (int32_t r = 0; r < n_regs; r++) {
        const int32_t kind = reg_kind[r];
        if (kind < -1 || kind > 3 || (kind >= 2 && reg_param[r] <= 0)) {
            free(slot);
            return -1;
        }
        slot[r] = kind < 0 || kind >= 2 ? n_scratch++ : -1;
    }
    for (int32_t k = 0; k < n_ops; k++) {
        const int32_t *o = ops + 4 * k;
        if (o[0] < VT_ADD || o[0] > VT_SQRT || o[1] < 0 || o[1] >= n_regs || o[2] < 0 || o[2] >= n_regs ||
            (o[0] != VT_SQRT && (o[3] < 0 || o[3] >= n_regs)) || (reg_kind[o[1]] != 1 && reg_kind[o[1]] != -1) ||
            (o[0] == VT_SQRT && reg_kind[o[2]] == 0)) {
            free(slot);
            return -1;
        }
    }
    /* the elements in parts on several threads where there are many, each part with its own scratch */
    chain_job job = {.n_regs = n_regs, .reg_ptr = reg_ptr, .reg_kind = reg_kind, .reg_param = reg_param,
                     .n_ops = n_ops, .ops = ops, .slot = slot, .n_scratch = n_scratch};
    const int parts = vt_parts(n, VT_GRAIN);
    vt_run_parts(n, parts, chain_part, &job);
    uint32_t bad = 0;
    int failed = 0;
    for (int p = 0; p < parts; p++) {
        bad |= job.bad[p];
        failed |= job.failed[p];
    }
    free(slot);
    return failed ? -1 : (bad ? 0 : 1);
}
