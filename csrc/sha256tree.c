/* sha256tree: RFC 9162 SHA-256 Merkle roots of whole buffers in one call.
 *
 * The optional fast path of vtrain/commit/merkle.py (loaded with ctypes by
 * vtrain/commit/native.py; the pure-Python builders there stay the reference). Same format:
 * leaf = SHA-256(0x00 || data), node = SHA-256(0x01 || left || right), levels paired left to
 * right with an odd last node promoted (= the RFC 9162 split at the largest power of two < n),
 * the empty tree's root = SHA-256("").
 *
 * SHA-256 compression, chosen at load time from CPUID: x86 SHA extensions (two messages
 * interleaved), else AVX2 (eight messages, one per 32-bit lane), else portable C.
 * Work is cut into aligned subtrees of 2^k leaves, hashed by a pthread pool (the caller's
 * thread included); ctypes releases the GIL for the whole call.
 *
 * Build: cc -O3 -fPIC -shared -pthread sha256tree.c -o _sha256tree.so   (see Makefile `native`)
 */
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define VT_X86 1
#include <cpuid.h>
#include <immintrin.h>
#endif

#define VT_API __attribute__((visibility("default")))
#define VT_ABI_VERSION 2

static const uint32_t K256[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static const uint32_t H0[8] = {
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

/* ---------------------------------------------------------------------------------------- */
/* Portable compression */

#define ROR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))

static inline uint32_t load_be32(const uint8_t *p) {
    return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static void compress_portable(uint32_t st[8], const uint8_t *p, size_t nblocks) {
    uint32_t w[64];
    for (; nblocks; nblocks--, p += 64) {
        for (int i = 0; i < 16; i++) w[i] = load_be32(p + 4 * i);
        for (int i = 16; i < 64; i++) {
            uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
            uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
            w[i] = w[i - 16] + s0 + w[i - 7] + s1;
        }
        uint32_t a = st[0], b = st[1], c = st[2], d = st[3];
        uint32_t e = st[4], f = st[5], g = st[6], h = st[7];
        for (int i = 0; i < 64; i++) {
            uint32_t t1 = h + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) + ((e & f) ^ (~e & g)) + K256[i] + w[i];
            uint32_t t2 = (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
            h = g; g = f; f = e; e = d + t1;
            d = c; c = b; b = a; a = t1 + t2;
        }
        st[0] += a; st[1] += b; st[2] += c; st[3] += d;
        st[4] += e; st[5] += f; st[6] += g; st[7] += h;
    }
}


/* ---------------------------------------------------------------------------------------- */
/* SHA extensions (Intel SHA-NI). State kept as ABEF/CDGH, as sha256rnds2 wants it. */

#ifdef VT_X86
#define SHANI __attribute__((target("sha,sse4.1,ssse3")))

SHANI static inline void shani_pack(const uint32_t st[8], __m128i *abef, __m128i *cdgh) {
    __m128i t = _mm_loadu_si128((const __m128i *)&st[0]);  /* DCBA */
    __m128i s1 = _mm_loadu_si128((const __m128i *)&st[4]); /* HGFE */
    t = _mm_shuffle_epi32(t, 0xB1);                         /* CDAB */
    s1 = _mm_shuffle_epi32(s1, 0x1B);                       /* EFGH */
    *abef = _mm_alignr_epi8(t, s1, 8);                      /* ABEF */
    *cdgh = _mm_blend_epi16(s1, t, 0xF0);                   /* CDGH */
}

SHANI static inline void shani_unpack(uint32_t st[8], __m128i abef, __m128i cdgh) {
    __m128i t = _mm_shuffle_epi32(abef, 0x1B);  /* FEBA */
    cdgh = _mm_shuffle_epi32(cdgh, 0xB1);       /* DCHG */
    __m128i s0 = _mm_blend_epi16(t, cdgh, 0xF0); /* DCBA */
    __m128i s1 = _mm_alignr_epi8(cdgh, t, 8);    /* HGFE */
    _mm_storeu_si128((__m128i *)&st[0], s0);
    _mm_storeu_si128((__m128i *)&st[4], s1);
}

/* One group of four rounds g (0..15) on one lane; w[] is the rolling 16-word schedule. */
#define SHANI_GROUP(g, w, s0, s1, p)                                                              \
    do {                                                                                          \
        if ((g) < 4) {                                                                            \
            w[(g)] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)((p) + 16 * (g))), mask);   \
        } else {                                                                                  \
            __m128i m1 = _mm_sha256msg1_epu32(w[((g) - 4) & 3], w[((g) - 3) & 3]);                \
            m1 = _mm_add_epi32(m1, _mm_alignr_epi8(w[((g) - 1) & 3], w[((g) - 2) & 3], 4));        \
            w[(g) & 3] = _mm_sha256msg2_epu32(m1, w[((g) - 1) & 3]);                              \
        }                                                                                         \
        __m128i m = _mm_add_epi32(w[(g) & 3], _mm_loadu_si128((const __m128i *)&K256[4 * (g)])); \
        s1 = _mm_sha256rnds2_epu32(s1, s0, m);                                                    \
        s0 = _mm_sha256rnds2_epu32(s0, s1, _mm_shuffle_epi32(m, 0x0E));                           \
    } while (0)

SHANI static void compress_shani(uint32_t st[8], const uint8_t *p, size_t nblocks) {
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i s0, s1, w[4];
    shani_pack(st, &s0, &s1);
    for (; nblocks; nblocks--, p += 64) {
        __m128i a0 = s0, a1 = s1;
#pragma GCC unroll 16
        for (int g = 0; g < 16; g++) SHANI_GROUP(g, w, s0, s1, p);
        s0 = _mm_add_epi32(s0, a0);
        s1 = _mm_add_epi32(s1, a1);
    }
    shani_unpack(st, s0, s1);
}

SHANI static void compress2_shani(uint32_t sa[8], uint32_t sb[8], const uint8_t *pa, const uint8_t *pb,
                                  size_t nblocks) {
    const __m128i mask = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i a0, a1, b0, b1, wa[4], wb[4];
    shani_pack(sa, &a0, &a1);
    shani_pack(sb, &b0, &b1);
    for (; nblocks; nblocks--, pa += 64, pb += 64) {
        __m128i sa0 = a0, sa1 = a1, sb0 = b0, sb1 = b1;
#pragma GCC unroll 16
        for (int g = 0; g < 16; g++) {
            SHANI_GROUP(g, wa, a0, a1, pa);
            SHANI_GROUP(g, wb, b0, b1, pb);
        }
        a0 = _mm_add_epi32(a0, sa0);
        a1 = _mm_add_epi32(a1, sa1);
        b0 = _mm_add_epi32(b0, sb0);
        b1 = _mm_add_epi32(b1, sb1);
    }
    shani_unpack(sa, a0, a1);
    shani_unpack(sb, b0, b1);
}

static int cpu_has_shani(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & bit_SSSE3) || !(c & bit_SSE4_1)) return 0;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 29) & 1; /* CPUID.(EAX=7,ECX=0):EBX.SHA[bit 29] */
}

/* ---------------------------------------------------------------------------------------- */
/* AVX2: eight messages at once, one 32-bit lane each (for x86 CPUs without SHA extensions). */

#define AVX2 __attribute__((target("avx2")))

AVX2 static inline void transpose8(__m256i r[8]) {
    __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpackhi_epi32(r[0], r[1]);
    __m256i t2 = _mm256_unpacklo_epi32(r[2], r[3]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    __m256i t4 = _mm256_unpacklo_epi32(r[4], r[5]), t5 = _mm256_unpackhi_epi32(r[4], r[5]);
    __m256i t6 = _mm256_unpacklo_epi32(r[6], r[7]), t7 = _mm256_unpackhi_epi32(r[6], r[7]);
    __m256i u0 = _mm256_unpacklo_epi64(t0, t2), u1 = _mm256_unpackhi_epi64(t0, t2);
    __m256i u2 = _mm256_unpacklo_epi64(t1, t3), u3 = _mm256_unpackhi_epi64(t1, t3);
    __m256i u4 = _mm256_unpacklo_epi64(t4, t6), u5 = _mm256_unpackhi_epi64(t4, t6);
    __m256i u6 = _mm256_unpacklo_epi64(t5, t7), u7 = _mm256_unpackhi_epi64(t5, t7);
    r[0] = _mm256_permute2x128_si256(u0, u4, 0x20);
    r[1] = _mm256_permute2x128_si256(u1, u5, 0x20);
    r[2] = _mm256_permute2x128_si256(u2, u6, 0x20);
    r[3] = _mm256_permute2x128_si256(u3, u7, 0x20);
    r[4] = _mm256_permute2x128_si256(u0, u4, 0x31);
    r[5] = _mm256_permute2x128_si256(u1, u5, 0x31);
    r[6] = _mm256_permute2x128_si256(u2, u6, 0x31);
    r[7] = _mm256_permute2x128_si256(u3, u7, 0x31);
}

#define V_ROR(x, n) _mm256_or_si256(_mm256_srli_epi32((x), (n)), _mm256_slli_epi32((x), 32 - (n)))
#define V_ADD(a, b) _mm256_add_epi32((a), (b))
#define V_XOR3(a, b, c) _mm256_xor_si256(_mm256_xor_si256((a), (b)), (c))

/* st: 8 lanes x 8 words (lane l at st + 8 l); p[l]: lane l's blocks (nblocks x 64 bytes). */
AVX2 static void compress8_avx2(uint32_t *st, const uint8_t *const *p, size_t nblocks) {
    const __m256i bswap = _mm256_set_epi8(12, 13, 14, 15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14,
                                          15, 8, 9, 10, 11, 4, 5, 6, 7, 0, 1, 2, 3);
    __m256i s[8], w[16];
    for (int l = 0; l < 8; l++) s[l] = _mm256_loadu_si256((const __m256i *)(st + 8 * l));
    transpose8(s); /* s[i] = word i of every lane */
    for (size_t blk = 0; blk < nblocks; blk++) {
        for (int h = 0; h < 2; h++) {
            __m256i *r = w + 8 * h;
            for (int l = 0; l < 8; l++) r[l] = _mm256_loadu_si256((const __m256i *)(p[l] + 64 * blk + 32 * h));
            transpose8(r);
            for (int i = 0; i < 8; i++) r[i] = _mm256_shuffle_epi8(r[i], bswap);
        }
        __m256i a = s[0], b = s[1], c = s[2], d = s[3], e = s[4], f = s[5], g = s[6], hh = s[7];
#pragma GCC unroll 64
        for (int t = 0; t < 64; t++) {
            if (t >= 16) {
                __m256i w15 = w[(t - 15) & 15], w2 = w[(t - 2) & 15];
                __m256i s0 = V_XOR3(V_ROR(w15, 7), V_ROR(w15, 18), _mm256_srli_epi32(w15, 3));
                __m256i s1 = V_XOR3(V_ROR(w2, 17), V_ROR(w2, 19), _mm256_srli_epi32(w2, 10));
                w[t & 15] = V_ADD(V_ADD(w[t & 15], s0), V_ADD(w[(t - 7) & 15], s1));
            }
            __m256i ch = _mm256_xor_si256(_mm256_and_si256(e, f), _mm256_andnot_si256(e, g));
            __m256i t1 = V_ADD(V_ADD(hh, V_XOR3(V_ROR(e, 6), V_ROR(e, 11), V_ROR(e, 25))),
                               V_ADD(V_ADD(ch, _mm256_set1_epi32((int)K256[t])), w[t & 15]));
            __m256i maj = _mm256_or_si256(_mm256_and_si256(a, b), _mm256_and_si256(c, _mm256_or_si256(a, b)));
            __m256i t2 = V_ADD(V_XOR3(V_ROR(a, 2), V_ROR(a, 13), V_ROR(a, 22)), maj);
            hh = g; g = f; f = e; e = V_ADD(d, t1);
            d = c; c = b; b = a; a = V_ADD(t1, t2);
        }
        s[0] = V_ADD(s[0], a); s[1] = V_ADD(s[1], b); s[2] = V_ADD(s[2], c); s[3] = V_ADD(s[3], d);
        s[4] = V_ADD(s[4], e); s[5] = V_ADD(s[5], f); s[6] = V_ADD(s[6], g); s[7] = V_ADD(s[7], hh);
    }
    transpose8(s);
    for (int l = 0; l < 8; l++) _mm256_storeu_si256((__m256i *)(st + 8 * l), s[l]);
}

static int cpu_has_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    if (!(c & bit_OSXSAVE) || !(c & bit_AVX)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6) != 6) return 0; /* the OS saves XMM and YMM state */
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    return (b >> 5) & 1; /* CPUID.(EAX=7,ECX=0):EBX.AVX2[bit 5] */
}
#else
static int cpu_has_shani(void) { return 0; }
static int cpu_has_avx2(void) { return 0; }
#endif

/* ---------------------------------------------------------------------------------------- */
/* Dispatch */

typedef void (*compress_fn)(uint32_t *, const uint8_t *, size_t);
/* LANES messages at once: st = LANES x 8 words, p[l] = lane l's blocks. */
typedef void (*compressn_fn)(uint32_t *, const uint8_t *const *, size_t);

#define MAX_LANES 8

static void compressn_portable(uint32_t *st, const uint8_t *const *p, size_t nblocks) {
    compress_portable(st, p[0], nblocks);
}

#ifdef VT_X86
static void compressn_shani(uint32_t *st, const uint8_t *const *p, size_t nblocks) {
    compress2_shani(st, st + 8, p[0], p[1], nblocks);
}
#endif

static compress_fn C1 = compress_portable;
static compressn_fn CN = compressn_portable;
static int LANES = 1;
static int g_impl = 0; /* 0 portable, 1 SHA-NI, 2 AVX2 */

/* Select the implementation: 0 portable, 1 SHA-NI, 2 AVX2 (8 lanes), -1 the best this CPU has
 * (SHA-NI, then AVX2, then portable). One the CPU lacks gives portable. Returns the one in use.
 * Not thread-safe: call it only while no other call of this library runs (tests, benchmarks). */
VT_API int vt_select(int impl) {
    int shani = cpu_has_shani(), avx2 = cpu_has_avx2();
    if (impl < 0) impl = shani ? 1 : avx2 ? 2 : 0;
    C1 = compress_portable;
    CN = compressn_portable;
    LANES = 1;
    g_impl = 0;
#ifdef VT_X86
    if (impl == 1 && shani) {
        C1 = compress_shani;
        CN = compressn_shani;
        LANES = 2;
        g_impl = 1;
    } else if (impl == 2 && avx2) {
        CN = compress8_avx2;
        LANES = 8;
        g_impl = 2;
    }
#endif
    return g_impl;
}

VT_API int vt_impl(void) { return g_impl; }
VT_API int vt_abi_version(void) { return VT_ABI_VERSION; }

__attribute__((constructor)) static void vt_init(void) { vt_select(-1); }

/* ---------------------------------------------------------------------------------------- */
/* SHA-256 of (prefix || p[0..len)), one or two messages of the same length at a time */

static inline void store_digest(uint8_t *out, const uint32_t st[8]) {
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(st[i] >> 24);
        out[4 * i + 1] = (uint8_t)(st[i] >> 16);
        out[4 * i + 2] = (uint8_t)(st[i] >> 8);
        out[4 * i + 3] = (uint8_t)st[i];
    }
}

/* The last 1 or 2 blocks (the bytes after the first `used` message bytes, then padding). */
static inline size_t build_tail(uint8_t t[128], uint8_t prefix, const uint8_t *p, size_t len,
                                size_t used) {
    size_t total = len + 1, r = total - used;
    if (used == 0) {
        t[0] = prefix;
        if (len) memcpy(t + 1, p, len);
    } else {
        memcpy(t, p + used - 1, r);
    }
    t[r] = 0x80;
    size_t nb = (r + 9 <= 64) ? 1 : 2;
    memset(t + r + 1, 0, nb * 64 - r - 1 - 8);
    uint64_t bits = (uint64_t)total * 8;
    for (int i = 0; i < 8; i++) t[nb * 64 - 1 - i] = (uint8_t)(bits >> (8 * i));
    return nb;
}

static void hash_prefixed(uint8_t prefix, const uint8_t *p, size_t len, uint8_t *out) {
    uint32_t st[8];
    uint8_t t[128];
    memcpy(st, H0, sizeof st);
    size_t nfull = (len + 1) / 64;
    if (nfull) {
        t[0] = prefix;
        memcpy(t + 1, p, 63);
        C1(st, t, 1);
        if (nfull > 1) C1(st, p + 63, nfull - 1);
    }
    C1(st, t, build_tail(t, prefix, p, len, nfull * 64));
    store_digest(out, st);
}

/* LANES messages of the same length, at p0 + k * stride (k < LANES), digests to out0 + 32 k.
 * Safe when the outputs overlap the inputs (every read happens before the first write). */
static void hash_prefixed_lanes(uint8_t prefix, const uint8_t *p0, size_t stride, size_t len, uint8_t *out0) {
    uint32_t st[8 * MAX_LANES];
    uint8_t t[MAX_LANES][128];
    const uint8_t *bp[MAX_LANES] = {0};
    int lanes = LANES;
    for (int l = 0; l < lanes; l++) memcpy(st + 8 * l, H0, sizeof H0);
    size_t nfull = (len + 1) / 64;
    if (nfull) {
        for (int l = 0; l < lanes; l++) {
            t[l][0] = prefix;
            memcpy(t[l] + 1, p0 + l * stride, 63);
            bp[l] = t[l];
        }
        CN(st, bp, 1);
        if (nfull > 1) {
            for (int l = 0; l < lanes; l++) bp[l] = p0 + l * stride + 63;
            CN(st, bp, nfull - 1);
        }
    }
    size_t nb = 0;
    for (int l = 0; l < lanes; l++) {
        nb = build_tail(t[l], prefix, p0 + l * stride, len, nfull * 64);
        bp[l] = t[l];
    }
    CN(st, bp, nb);
    for (int l = 0; l < lanes; l++) store_digest(out0 + 32 * l, st + 8 * l);
}

/* ---------------------------------------------------------------------------------------- */
/* Leaves and levels */

/* Leaf hashes of leaves [lo, hi) of buf (leaf i = buf[i*chunk, min((i+1)*chunk, len))). */
static void hash_leaves(const uint8_t *buf, uint64_t len, uint64_t chunk, uint64_t lo, uint64_t hi,
                        uint8_t *out) {
    uint64_t full_hi = len / chunk; /* leaves [0, full_hi) are full */
    if (full_hi > hi) full_hi = hi;
    uint64_t i = lo;
    if (LANES > 1)
        for (; i + LANES <= full_hi; i += LANES)
            hash_prefixed_lanes(0x00, buf + i * chunk, chunk, chunk, out + 32 * (i - lo));
    for (; i < hi; i++) {
        uint64_t n = (i + 1) * chunk <= len ? chunk : len - i * chunk;
        hash_prefixed(0x00, buf + i * chunk, n, out + 32 * (i - lo));
    }
}

/* Parents of nodes [2*lo, min(2*hi, n)) of a level of n digests: out[j - lo] for j in [lo, hi). */
static void level_range(const uint8_t *in, uint64_t n, uint64_t lo, uint64_t hi, uint8_t *out) {
    uint64_t pairs = n / 2;
    uint64_t j = lo, end = hi < pairs ? hi : pairs;
    if (LANES > 1)
        for (; j + LANES <= end; j += LANES) hash_prefixed_lanes(0x01, in + 64 * j, 64, 64, out + 32 * (j - lo));
    for (; j < end; j++) hash_prefixed(0x01, in + 64 * j, 64, out + 32 * (j - lo));
    if ((n & 1) && hi > pairs && lo <= pairs) memmove(out + 32 * (pairs - lo), in + 32 * (n - 1), 32);
}

/* Root of n digests at h (n >= 1), folded in place. */
static void fold_inplace(uint8_t *h, uint64_t n) {
    while (n > 1) {
        level_range(h, n, 0, (n + 1) / 2, h);
        n = (n + 1) / 2;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* A pool of threads pulling task numbers from one counter (the caller's thread is one of them). */

typedef void (*task_fn)(void *ctx, uint64_t task, uint8_t *scratch);

typedef struct {
    task_fn fn;
    void *ctx;
    uint64_t ntasks;
    uint64_t next;
    size_t scratch;
    int failed;
} pool_t;

static void *pool_worker(void *arg) {
    pool_t *p = (pool_t *)arg;
    uint8_t *scratch = NULL;
    if (p->scratch && !(scratch = (uint8_t *)malloc(p->scratch))) {
        __atomic_store_n(&p->failed, 1, __ATOMIC_RELAXED);
        return NULL;
    }
    for (;;) {
        uint64_t t = __atomic_fetch_add(&p->next, 1, __ATOMIC_RELAXED);
        if (t >= p->ntasks) break;
        p->fn(p->ctx, t, scratch);
    }
    free(scratch);
    return NULL;
}

#define VT_MAX_THREADS 256

/* Runs every task; returns 0, or -1 when no thread could get its scratch memory. */
static int pool_run(int threads, uint64_t ntasks, task_fn fn, void *ctx, size_t scratch) {
    pool_t p = {fn, ctx, ntasks, 0, scratch, 0};
    if (threads < 1) threads = 1;
    if (threads > VT_MAX_THREADS) threads = VT_MAX_THREADS;
    if ((uint64_t)threads > ntasks) threads = (int)(ntasks ? ntasks : 1);
    pthread_t tids[VT_MAX_THREADS];
    int started = 0;
    for (int i = 1; i < threads; i++) {
        if (pthread_create(&tids[started], NULL, pool_worker, &p) != 0) break; /* fewer threads */
        started++;
    }
    pool_worker(&p);
    for (int i = 0; i < started; i++) pthread_join(tids[i], NULL);
    /* A worker that failed to allocate did no task; the caller's thread finishes what is left. */
    /* Every task index handed out ran (only a worker holding its scratch takes one). */
    return (p.failed && __atomic_load_n(&p.next, __ATOMIC_RELAXED) < ntasks) ? -1 : 0;
}

/* Threads worth starting for `bytes` of input: about one per 256 KiB, at most `threads`. */
static int threads_for(int threads, uint64_t bytes) {
    uint64_t useful = bytes / (256u << 10) + 1;
    if (threads < 1) threads = 1;
    return (uint64_t)threads < useful ? threads : (int)useful;
}

/* ---------------------------------------------------------------------------------------- */
/* Roots of many buffers: every buffer cut into aligned blocks of 2^k leaves, one task each. */

typedef struct {
    const uint8_t *const *bufs;
    const uint64_t *lens;
    uint64_t chunk;
    uint64_t block_leaves;
    int check_f32;
    const uint64_t *task_start; /* first task of buffer b; task_start[nbufs] = ntasks */
    uint64_t nbufs;
    uint8_t *block_roots; /* 32 bytes per task */
    uint8_t *bad;         /* per buffer: 1 if a float32 NaN/Inf was seen */
} roots_ctx;

static int has_nonfinite_f32(const uint8_t *p, uint64_t nbytes) {
    uint32_t acc = 0;
    uint64_t n = nbytes / 4;
    for (uint64_t i = 0; i < n; i++) {
        uint32_t w;
        memcpy(&w, p + 4 * i, 4);
        acc |= ((w & 0x7f800000u) == 0x7f800000u);
    }
    return acc != 0;
}

static void roots_task(void *vctx, uint64_t task, uint8_t *scratch) {
    roots_ctx *c = (roots_ctx *)vctx;
    /* The buffer of this task: the last b with task_start[b] <= task (binary search). */
    uint64_t lo = 0, hi = c->nbufs;
    while (hi - lo > 1) {
        uint64_t mid = (lo + hi) / 2;
        if (c->task_start[mid] <= task) lo = mid; else hi = mid;
    }
    uint64_t b = lo, j = task - c->task_start[b];
    const uint8_t *buf = c->bufs[b];
    uint64_t len = c->lens[b];
    uint64_t n = (len + c->chunk - 1) / c->chunk;
    uint64_t first = j * c->block_leaves, last = first + c->block_leaves;
    if (last > n) last = n;
    if (c->check_f32) {
        uint64_t a = first * c->chunk, e = last * c->chunk;
        if (e > len) e = len;
        if (has_nonfinite_f32(buf + a, e - a)) __atomic_store_n(&c->bad[b], 1, __ATOMIC_RELAXED);
    }
    hash_leaves(buf, len, c->chunk, first, last, scratch);
    fold_inplace(scratch, last - first);
    memcpy(c->block_roots + 32 * task, scratch, 32);
}

static uint64_t block_leaves_for(uint64_t chunk) {
    uint64_t b = 1;
    while (b < (1u << 14) && 2 * b * chunk <= (256u << 10)) b *= 2;
    return b;
}

/* Root of every buffer: bufs[i] (lens[i] bytes) cut into `chunk`-byte leaves, the last one short.
 * roots_out: 32 * nbufs bytes. bad_out (nbufs bytes, may be NULL unless check_f32): set to 1 for a
 * buffer holding a float32 NaN or infinity (its root is then meaningless).
 * Returns 0, -1 for bad arguments, -2 when out of memory. */
VT_API int vt_chunked_roots(uint64_t nbufs, const uint8_t *const *bufs, const uint64_t *lens,
                            uint64_t chunk, int check_f32, int threads, uint8_t *roots_out,
                            uint8_t *bad_out) {
    if (chunk == 0 || (check_f32 && (chunk % 4 || !bad_out))) return -1;
    uint64_t bl = block_leaves_for(chunk);
    uint64_t *task_start = (uint64_t *)malloc(sizeof(uint64_t) * (nbufs + 1));
    if (!task_start) return -2;
    uint64_t ntasks = 0, total = 0;
    for (uint64_t b = 0; b < nbufs; b++) {
        if (check_f32 && lens[b] % 4) {
            free(task_start);
            return -1;
        }
        uint64_t n = (lens[b] + chunk - 1) / chunk;
        task_start[b] = ntasks;
        ntasks += (n + bl - 1) / bl;
        total += lens[b];
        if (bad_out) bad_out[b] = 0;
    }
    task_start[nbufs] = ntasks;
    uint8_t *block_roots = (uint8_t *)malloc(32 * (ntasks ? ntasks : 1));
    if (!block_roots) {
        free(task_start);
        return -2;
    }
    roots_ctx c = {bufs, lens, chunk, bl, check_f32, task_start, nbufs, block_roots, bad_out};
    int rc = pool_run(threads_for(threads, total), ntasks, roots_task, &c, 32 * bl);
    if (rc == 0) {
        for (uint64_t b = 0; b < nbufs; b++) {
            uint64_t t0 = task_start[b], nt = task_start[b + 1] - t0;
            if (nt == 0) {
                uint32_t st[8];
                uint8_t t[64] = {0x80};
                memcpy(st, H0, sizeof st);
                C1(st, t, 1); /* SHA-256("") */
                store_digest(roots_out + 32 * b, st);
                continue;
            }
            fold_inplace(block_roots + 32 * t0, nt);
            memcpy(roots_out + 32 * b, block_roots + 32 * t0, 32);
        }
    }
    free(block_roots);
    free(task_start);
    return rc == 0 ? 0 : -2;
}

/* ---------------------------------------------------------------------------------------- */
/* Leaf hashes and levels (for trees kept whole, for proofs) */

typedef struct {
    const uint8_t *buf;
    uint64_t len, chunk, per_task, n;
    uint8_t *out;
} leaves_ctx;

static void leaves_task(void *vctx, uint64_t task, uint8_t *scratch) {
    (void)scratch;
    leaves_ctx *c = (leaves_ctx *)vctx;
    uint64_t lo = task * c->per_task, hi = lo + c->per_task;
    if (hi > c->n) hi = c->n;
    hash_leaves(c->buf, c->len, c->chunk, lo, hi, c->out + 32 * lo);
}

/* Leaf hashes of buf cut into `chunk`-byte leaves: out gets 32 * ceil(len / chunk) bytes. */
VT_API int vt_hash_chunks(const uint8_t *buf, uint64_t len, uint64_t chunk, int threads, uint8_t *out) {
    if (chunk == 0) return -1;
    uint64_t n = (len + chunk - 1) / chunk, per = block_leaves_for(chunk);
    leaves_ctx c = {buf, len, chunk, per, n, out};
    return pool_run(threads_for(threads, len), (n + per - 1) / per, leaves_task, &c, 0) ? -2 : 0;
}

typedef struct {
    const uint8_t *in;
    uint64_t n, per_task, parents;
    uint8_t *out;
} level_ctx;

static void level_task(void *vctx, uint64_t task, uint8_t *scratch) {
    (void)scratch;
    level_ctx *c = (level_ctx *)vctx;
    uint64_t lo = task * c->per_task, hi = lo + c->per_task;
    if (hi > c->parents) hi = c->parents;
    level_range(c->in, c->n, lo, hi, c->out + 32 * lo);
}

/* The level above n digests (n >= 1): out gets 32 * ceil(n / 2) bytes; out must not overlap in. */
VT_API int vt_level_up(const uint8_t *in, uint64_t n, int threads, uint8_t *out) {
    uint64_t parents = (n + 1) / 2, per = 4096;
    level_ctx c = {in, n, per, parents, out};
    return pool_run(threads_for(threads, 32 * n), (parents + per - 1) / per, level_task, &c, 0) ? -2 : 0;
}

/* SHA-256(prefix || data): one leaf (prefix 0) or node (prefix 1), for the tests of this file. */
VT_API void vt_hash_prefixed(uint8_t prefix, const uint8_t *p, uint64_t len, uint8_t *out) {
    hash_prefixed(prefix, p, len, out);
}
