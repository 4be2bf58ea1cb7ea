/* The native numerics kernels (vtrain/numerics/native.py): ABI version of the library.
 *
 * Every file in csrc/numerics/ is compiled into one library, vtrain/numerics/_kernels.so, with
 * -ffp-contract=off and without -ffast-math: each kernel must perform exactly the IEEE binary64 /
 * binary32 operations its numpy reference performs, in the same order (no FMA contraction, no
 * reassociation), so that its results are the reference's bits on every machine. Tests compare
 * every kernel with its numpy reference. */
#define VT_EXPORT __attribute__((visibility("default")))

/* Bumped whenever a kernel is added or its signature changes (with _ABI_VERSION in native.py): a
 * library built from older sources is then refused as a whole (numpy fallback, same bits) instead
 * of failing on a missing symbol. 2: vt_rows_decide_into. 3: vt_matmul_round_norm. 4: vt_replay_matmul_norm,
 * vt_replay_sum_values. 5: their entries and settled status (a checked replay's op in one call). 6: the
 * Hoelder norms in the MATMUL norm bound (vt_row_norms1inf32, vt_round_filter_norm3), vt_free. 7: threads
 * (vt_set_threads, parallel.c). 8: vt_matmul_products (gemm.c), vt_sum_round_decide
 * (sums.c), the MATMUL epilogue's compacted entries (status[4]). */
VT_EXPORT int vt_numerics_abi_version(void) { return 8; }
