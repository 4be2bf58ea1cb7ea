/* Threads for the library's large kernels (parallel.c). */
#ifndef VT_PARALLEL_H
#define VT_PARALLEL_H
#include <stdint.h>

/* fn(ctx, part, lo, hi): the items [lo, hi) of part `part`. */
typedef void (*vt_part_fn)(void *ctx, int part, int64_t lo, int64_t hi);

/* How many parts n items make at `grain` items per part at least (1..the thread count). */
int vt_parts(int64_t n, int64_t grain);

/* Part k of n items in `parts`: [vt_part_start(n, parts, k), vt_part_start(n, parts, k + 1)). */
static inline int64_t vt_part_start(int64_t n, int parts, int k) { return (int64_t)((__int128)n * k / parts); }

/* Runs fn on every part (part 0 on this thread), returns when all are done. */
void vt_run_parts(int64_t n, int parts, vt_part_fn fn, void *ctx);

/* Items per part below which a kernel stays on one thread (a thread costs ~20-50 us to start). */
#define VT_GRAIN (1 << 18)
#endif
