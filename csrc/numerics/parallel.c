/* Threads for the library's large kernels (vtrain/numerics/native.py, set_threads).
 *
 * A kernel cuts its index range into at most vt_threads contiguous parts of at least `grain` items,
 * runs part 0 on the calling thread and the others on threads started for the call, and joins them
 * before it returns: no thread outlives a call (nothing spins between kernels, nothing to fork
 * around), and while a kernel runs the caller's torch is idle, so `--threads N` never means more than
 * N busy threads. Every item is computed by the same operations whatever part it falls in, so the
 * bits do not depend on the thread count (tests compare 1 and several threads). */
#include <pthread.h>
#include <stdint.h>

#include "parallel.h"

#define VT_EXPORT __attribute__((visibility("default")))
#define VT_MAX_THREADS 64

static int vt_threads = 1;

/* The threads a kernel may use from now on (1..64; the executor sets torch's thread count); returns
 * the count in use. */
VT_EXPORT int vt_set_threads(int n) {
    vt_threads = n < 1 ? 1 : (n > VT_MAX_THREADS ? VT_MAX_THREADS : n);
    return vt_threads;
}

int vt_parts(int64_t n, int64_t grain) {
    const int64_t p = grain > 0 ? n / grain : n;
    return p < 1 ? 1 : (p > vt_threads ? vt_threads : (int)p);
}

typedef struct {
    vt_part_fn fn;
    void *ctx;
    int part;
    int64_t lo, hi;
} vt_job;

static void *vt_job_run(void *p) {
    const vt_job *j = p;
    j->fn(j->ctx, j->part, j->lo, j->hi);
    return NULL;
}

void vt_run_parts(int64_t n, int parts, vt_part_fn fn, void *ctx) {
    if (parts <= 1) {
        fn(ctx, 0, 0, n);
        return;
    }
    if (parts > VT_MAX_THREADS) parts = VT_MAX_THREADS;
    vt_job jobs[VT_MAX_THREADS];
    pthread_t tid[VT_MAX_THREADS];
    int started[VT_MAX_THREADS] = {0};
    for (int k = 0; k < parts; k++) {
        jobs[k].fn = fn;
        jobs[k].ctx = ctx;
        jobs[k].part = k;
        jobs[k].lo = vt_part_start(n, parts, k);
        jobs[k].hi = vt_part_start(n, parts, k + 1);
    }
    for (int k = 1; k < parts; k++) started[k] = pthread_create(&tid[k], NULL, vt_job_run, &jobs[k]) == 0;
    vt_job_run(&jobs[0]);
    for (int k = 1; k < parts; k++) {
        if (started[k])
            pthread_join(tid[k], NULL);
        else
            vt_job_run(&jobs[k]); /* no thread to be had: this one runs it */
    }
}
