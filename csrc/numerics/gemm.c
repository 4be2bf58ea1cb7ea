/* The certified MATMUL's FP64 products from its FP32 operands in one call (vtrain/numerics/native_gemm.py).
 *
 * v[b] = A[b] B[b]^T for b < batches, A [batches, m, k] and B [batches, n, k] FP32 (C-contiguous),
 * v [batches, m, n] FP64: the operands widened (exact) into the caller's FP64 buffers, then the BLAS
 * dgemm that torch.matmul calls for the same FP64 tensors (torch's own MKL, passed in by address).
 * It replaces two Tensor.double() copies and a torch.matmul, each with torch's dispatch and a fresh
 * buffer, on the small MATMULs where those fixed costs are most of the op.
 *
 * No output depends on which summation order the dgemm takes: the certified rule bounds the error
 * of any FP64 evaluation (executor._norm_bound), and candidates are decided from exact values. The
 * tests find the bits equal to torch.matmul's all the same (tests/test_native_gemm.py). */
#include <limits.h>
#include <stdint.h>

#define VT_EXPORT __attribute__((visibility("default")))

/* Fortran BLAS dgemm (LP64: int sizes), column-major. */
typedef void (*vt_dgemm_fn)(const char *transa, const char *transb, const int *m, const int *n, const int *k,
                            const double *alpha, const double *a, const int *lda, const double *b, const int *ldb,
                            const double *beta, double *c, const int *ldc);

static void widen(const float *x, double *y, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = (double)x[i];
}

/* Returns 0, or -1 where a size is out of dgemm's int range or an argument is missing (nothing written). */
VT_EXPORT int vt_matmul_products(const float *a, const float *b, int64_t batches, int64_t m, int64_t k, int64_t n,
                                 double *a64, double *b64, double *v, void *dgemm) {
    if (!dgemm || batches < 0 || m <= 0 || k <= 0 || n <= 0 || m > INT_MAX || k > INT_MAX || n > INT_MAX)
        return -1;
    widen(a, a64, batches * m * k);
    widen(b, b64, batches * n * k);
    const vt_dgemm_fn gemm = (vt_dgemm_fn)dgemm;
    const int im = (int)m, ik = (int)k, in = (int)n;
    const double one = 1.0, zero = 0.0;
    /* row-major v = A B^T is column-major v^T = B^T' A' with B' = B^T (k x n) and A' = A^T (k x m) as stored */
    for (int64_t i = 0; i < batches; i++)
        gemm("T", "N", &in, &im, &ik, &one, b64 + i * n * k, &ik, a64 + i * m * k, &ik, &zero, v + i * m * n, &in);
    return 0;
}
