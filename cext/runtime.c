/* Runtime: CPU feature detection and kernel dispatch, the thread pool, counted aligned memory.
 *
 * Dispatch: every public kernel entry point calls through the table of the selected variant
 * (ex_kernels_avx512, ex_kernels_avx2 or ex_kernels_generic), chosen at first use from the CPU
 * features and the EXPRESS_ISA environment variable ("generic" forces the portable kernels,
 * "avx2" caps the choice at AVX2), or by ex_set_isa.
 *
 * Pool: n - 1 persistent workers plus the calling thread.  A job is published by one 64-bit
 * ticket word (generation | next chunk | chunk count); participants claim chunks with CAS on
 * that word, so a worker that wakes late can never run a chunk of a newer job.  Idle workers
 * spin briefly (for low dispatch latency between back-to-back ops) and then sleep on a
 * condition variable; the first one also serves ex_prefetch_async's requests while it waits.
 * With one thread per CPU each worker is pinned to its own CPU, never the caller's (the caller
 * stays free; the workers move when it does): unpinned, a worker woken after a sleep was often
 * put on the caller's CPU and shared it until the load balancer moved one of them, which took
 * longer than a whole inference.  EXPRESS_PIN_THREADS=0 leaves placement to the OS. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "internal.h"

/* ---- ISA dispatch ---- */
static _Atomic(const ex_kernel_table *) g_table;

int ex_cpu_has_avx2(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
         __builtin_cpu_supports("f16c");
#else
  return 0;
#endif
}

int ex_cpu_has_avx512(void) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return ex_cpu_has_avx2() && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512dq");
#else
  return 0;
#endif
}

static const ex_kernel_table *table_for(int isa) {
#if defined(__x86_64__)
  if (isa == EX_ISA_AVX512) return &ex_kernels_avx512;
  if (isa == EX_ISA_AVX2) return &ex_kernels_avx2;
#endif
  (void)isa;
  return &ex_kernels_generic;
}

static const ex_kernel_table *K(void) {
  const ex_kernel_table *t = atomic_load_explicit(&g_table, memory_order_acquire);
  if (!t) {
    const char *e = getenv("EXPRESS_ISA"); /* generic | avx2 | avx512: the most it may use */
    const int generic = e && strcmp(e, "generic") == 0, avx2 = e && strcmp(e, "avx2") == 0;
    t = table_for(generic ? EX_ISA_GENERIC
                  : !avx2 && ex_cpu_has_avx512() ? EX_ISA_AVX512
                  : ex_cpu_has_avx2() ? EX_ISA_AVX2 : EX_ISA_GENERIC);
    atomic_store_explicit(&g_table, t, memory_order_release);
  }
  return t;
}

int ex_isa(void) {
  const ex_kernel_table *t = K();
#if defined(__x86_64__)
  if (t == &ex_kernels_avx512) return EX_ISA_AVX512;
#endif
  return t == &ex_kernels_generic ? EX_ISA_GENERIC : EX_ISA_AVX2;
}

int ex_set_isa(int isa) {
  if (isa != EX_ISA_GENERIC && !(isa == EX_ISA_AVX2 && ex_cpu_has_avx2()) &&
      !(isa == EX_ISA_AVX512 && ex_cpu_has_avx512()))
    return EX_EINVAL;
  atomic_store_explicit(&g_table, table_for(isa), memory_order_release);
  return EX_OK;
}

int ex_elementwise(const ex_program *p) { return K()->elementwise(p); }

int ex_copy(int32_t elem_size, const void *src, const int64_t *src_strides, void *dst,
            int32_t ndim, const int64_t *shape) {
  return K()->copy(elem_size, src, src_strides, dst, ndim, shape);
}

int ex_reduce(int32_t op, int32_t in_dtype, const void *x, int32_t out_dtype, void *y,
              int64_t outer, int64_t r, int64_t inner) {
  return K()->reduce(op, in_dtype, x, out_dtype, y, outer, r, inner);
}

int ex_cumsum(int32_t in_dtype, const void *x, int32_t out_dtype, void *y,
              int64_t outer, int64_t r, int64_t inner) {
  return K()->cumsum(in_dtype, x, out_dtype, y, outer, r, inner);
}

int ex_matmul(int32_t dtype, const void *a, int64_t a_rs, int64_t a_cs,
              const void *b, int64_t b_rs, int64_t b_cs, void *c,
              int64_t m, int64_t n, int64_t k,
              int32_t nbatch_dims, const int64_t *batch_shape,
              const int64_t *a_bs, const int64_t *b_bs) {
  return K()->matmul(dtype, a, a_rs, a_cs, b, b_rs, b_cs, c, m, n, k, nbatch_dims, batch_shape,
                     a_bs, b_bs);
}

int ex_softmax(const float *x, float *y, int64_t outer, int64_t r, int64_t inner, int32_t log) {
  return K()->softmax(x, y, outer, r, inner, log);
}

int ex_linear(const float *x, const void *w, int32_t w_dtype, const float *bias, const float *res,
              float *y, int64_t m, int64_t n, int64_t k, int32_t act) {
  return K()->linear(x, w, w_dtype, bias, res, y, m, n, k, act);
}

int ex_conv2d(const ex_conv_params *p, const float *x, const float *w, const float *bias,
              const float *res, float *y) {
  return K()->conv2d(p, x, w, bias, res, y);
}

int ex_conv_pwdw(const ex_conv_params *p1, const float *w1, const float *b1, const ex_conv_params *p2,
                 const float *w2, const float *b2, const float *x, const float *res, float *y) {
  return K()->conv_pwdw(p1, w1, b1, p2, w2, b2, x, res, y);
}

int64_t ex_conv_packed_size(const ex_conv_params *p) { return K()->conv_packed_size(p); }

int ex_conv_pack_weights(const ex_conv_params *p, const float *w, float *out) {
  return K()->conv_pack_weights(p, w, out);
}

int ex_winograd_weights(const float *w, float *u, int64_t oc, int64_t ic) {
  return K()->winograd_weights(w, u, oc, ic);
}

int ex_conv_transpose2d(const ex_conv_params *p, const float *x, const float *w, const float *bias,
                        float *y) {
  return K()->conv_transpose2d(p, x, w, bias, y);
}

int ex_pool2d(int32_t kind, const float *x, float *y, int64_t nc, int64_t h, int64_t w,
              int64_t oh, int64_t ow, int64_t kh, int64_t kw, int64_t sh, int64_t sw,
              int64_t ph, int64_t pw, int64_t dh, int64_t dw) {
  return K()->pool2d(kind, x, y, nc, h, w, oh, ow, kh, kw, sh, sw, ph, pw, dh, dw);
}

int ex_adaptive_pool2d(int32_t kind, const float *x, float *y, int64_t nc, int64_t h, int64_t w,
                       int64_t oh, int64_t ow) {
  return K()->adaptive_pool2d(kind, x, y, nc, h, w, oh, ow);
}

int ex_resize2d(int32_t mode, int32_t align_corners, const float *x, float *y, int64_t nc,
                int64_t h, int64_t w, int64_t oh, int64_t ow, float scale_h, float scale_w) {
  return K()->resize2d(mode, align_corners, x, y, nc, h, w, oh, ow, scale_h, scale_w);
}

int ex_pad(int32_t elem_size, int32_t mode, const void *x, void *y, int64_t outer,
           const int64_t *in_shape, const int64_t *before, const int64_t *after, const void *value) {
  return K()->pad(elem_size, mode, x, y, outer, in_shape, before, after, value);
}

int ex_layer_norm(const float *x, const float *w, const float *b, float *y, int64_t rows,
                  int64_t n, float eps) {
  return K()->layer_norm(x, w, b, y, rows, n, eps);
}

int ex_rms_norm(const float *x, const float *w, float *y, int64_t rows, int64_t n, float eps) {
  return K()->rms_norm(x, w, y, rows, n, eps);
}

int ex_group_norm(const float *x, const float *w, const float *b, float *y, int64_t n, int64_t c,
                  int64_t inner, int64_t groups, float eps, int32_t act) {
  return K()->group_norm(x, w, b, y, n, c, inner, groups, eps, act);
}

int ex_batch_norm(const float *x, const float *mean, const float *var, const float *w,
                  const float *b, float *y, int64_t n, int64_t c, int64_t inner, float eps,
                  int32_t act) {
  return K()->batch_norm(x, mean, var, w, b, y, n, c, inner, eps, act);
}

int ex_attention(const float *q, const int64_t *q_strides, const float *k, const int64_t *k_strides,
                 const float *v, const int64_t *v_strides, const float *mask,
                 const int64_t *mask_strides, float *y, int64_t b, int64_t hq, int64_t hk, int64_t lq,
                 int64_t lk, int64_t d, int64_t dv, float scale, int32_t causal) {
  return K()->attention(q, q_strides, k, k_strides, v, v_strides, mask, mask_strides, y, b, hq, hk,
                        lq, lk, d, dv, scale, causal);
}

/* ---- aligned memory ----
 * Blocks of 1 MB or more that are kept and reused (a compiled plan's arena, a convolution's kept
 * scratch) are mapped afresh, 2 MB-aligned and rounded up to 2 MB, and Linux is asked to back them
 * with transparent huge pages before they are first touched (heap memory touched before keeps its
 * 4 KB pages).  Every layer reads them: on 4 KB pages ResNet-18 ran 5-10% slower at one thread,
 * most of all after an idle pause, when the page walks miss the cache.  A fresh mapping costs its
 * page faults each time, so short-lived blocks (an eager evaluation's) stay on the heap, whose
 * freed memory malloc reuses without faults. */
#define HUGE_PAGE ((size_t)2 << 20)

static int mapped(size_t nbytes, int huge) { return huge && nbytes >= HUGE_PAGE / 2; }

void *ex_aligned_alloc(size_t nbytes, int huge) {
  if (nbytes > SIZE_MAX - 2 * HUGE_PAGE) return NULL;
  if (!mapped(nbytes, huge)) return aligned_alloc(64, ((nbytes ? nbytes : 1) + 63) / 64 * 64);
  const size_t n = (nbytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE;
  char *m = mmap(NULL, n + HUGE_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return NULL;
  char *p = (char *)(((uintptr_t)m + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
  if (p > m) munmap(m, (size_t)(p - m));             /* trim to the aligned n bytes */
  if (p < m + HUGE_PAGE) munmap(p + n, (size_t)(m + HUGE_PAGE - p));
#ifdef MADV_HUGEPAGE
  madvise(p, n, MADV_HUGEPAGE); /* advice only: 4 KB pages if refused */
#endif
  return p;
}

void ex_aligned_free(void *p, size_t nbytes, int huge) {
  if (!p) return;
  if (mapped(nbytes, huge)) munmap(p, (nbytes + HUGE_PAGE - 1) / HUGE_PAGE * HUGE_PAGE);
  else free(p);
}

/* ---- counted aligned memory: a 64-byte header in front of each block holds its size and
 * whether it may be mapped ---- */
static _Atomic int64_t g_mem_cur, g_mem_peak;

static void *counted(size_t nbytes, int64_t huge) {
  if (nbytes > SIZE_MAX - 2 * HUGE_PAGE - 64) return NULL;
  char *raw = ex_aligned_alloc(nbytes + 64, (int)huge);
  if (!raw) return NULL;
  memcpy(raw, &nbytes, sizeof nbytes);
  memcpy(raw + 8, &huge, sizeof huge);
  const int64_t cur = atomic_fetch_add(&g_mem_cur, (int64_t)nbytes) + (int64_t)nbytes;
  int64_t peak = atomic_load(&g_mem_peak);
  while (cur > peak && !atomic_compare_exchange_weak(&g_mem_peak, &peak, cur)) {}
  return raw + 64;
}

void *ex_alloc(size_t nbytes) { return counted(nbytes, 0); }
void *ex_alloc_huge(size_t nbytes) { return counted(nbytes, 1); }

void ex_free(void *p) {
  if (!p) return;
  char *raw = (char *)p - 64;
  size_t nbytes;
  int64_t huge;
  memcpy(&nbytes, raw, sizeof nbytes);
  memcpy(&huge, raw + 8, sizeof huge);
  atomic_fetch_sub(&g_mem_cur, (int64_t)nbytes);
  ex_aligned_free(raw, nbytes + 64, (int)huge);
}

int64_t ex_mem_current(void) { return atomic_load(&g_mem_cur); }
int64_t ex_mem_peak(void) { return atomic_load(&g_mem_peak); }
void ex_mem_reset_peak(void) { atomic_store(&g_mem_peak, atomic_load(&g_mem_cur)); }

/* ---- thread pool ---- */
/* how long an idle worker spins before sleeping.  Waking a sleeping worker cost the first
 * product of a 2-thread LLM decode step about 60 us (81 against 22 us; the Python between two
 * steps takes 250 - 300 us), so the spin outlasts that gap: 200 us had it asleep every step. */
#define SPIN_NS 1000000
#define MAX_THREADS 256

static struct {
  pthread_mutex_t run_lock; /* held by the thread running a job (or resizing) */
  pthread_mutex_t cv_lock;
  pthread_cond_t cv;
  _Atomic uint64_t ticket;  /* gen << 32 | next chunk << 16 | chunk count */
  _Atomic int done;         /* chunks finished in the current job */
  _Atomic int sleeping;     /* workers blocked on cv */
  _Atomic int stop;
  uint32_t gen;
  ex_task_fn fn;
  void *ctx;
  int64_t n, per;
  int nthreads;             /* configured, including the caller */
  int nworkers;             /* running */
  pthread_t workers[MAX_THREADS];
} P = {.run_lock = PTHREAD_MUTEX_INITIALIZER, .cv_lock = PTHREAD_MUTEX_INITIALIZER,
       .cv = PTHREAD_COND_INITIALIZER};

static _Thread_local int t_in_task;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static uint32_t ticket_gen(uint64_t t) { return (uint32_t)(t >> 32); }

/* claim and run chunks of job `gen` until none are left */
static void run_chunks(uint32_t gen) {
  uint64_t t = atomic_load(&P.ticket);
  for (;;) {
    const uint32_t next = (uint32_t)(t >> 16) & 0xffff, cnt = (uint32_t)t & 0xffff;
    if (ticket_gen(t) != gen || next >= cnt) return;
    if (!atomic_compare_exchange_weak(&P.ticket, &t, t + (1u << 16))) continue;
    /* the job cannot be replaced before this chunk is counted done */
    const int64_t b = (int64_t)next * P.per, e = b + P.per < P.n ? b + P.per : P.n;
    t_in_task = 1;
    P.fn(P.ctx, b, e);
    t_in_task = 0;
    atomic_fetch_add_explicit(&P.done, 1, memory_order_release);
    t = atomic_load(&P.ticket);
  }
}

#ifdef __linux__
static cpu_set_t g_cpus; /* the CPUs the process may run on, read at pool start */
static int g_pin;        /* pinning wanted (EXPRESS_PIN_THREADS != 0), read at pool start */
static int g_placed = -1; /* the caller's CPU the workers were last placed around */
#endif

/* When the pool has one thread per allowed CPU, each worker is pinned to a CPU of its own,
 * none of them the caller's: worker i takes the (i + 1)-th allowed CPU counting on from the one
 * the caller runs on.  The caller is never pinned, so the workers follow it: each job checks the
 * caller's CPU and re-places them if it moved.  (Fixed places, the caller on a worker's CPU
 * shared it with the spinning worker for the whole run, seen for 20 ms and more: a 2-thread
 * job of 50 us then took as long as on one thread.)  With fewer threads than CPUs nothing is
 * pinned: there are idle CPUs to wake onto, and pinned workers of several processes would pile
 * onto the same CPUs.  Called with run_lock held. */
static void place_workers(void) {
#ifdef __linux__
  if (!g_pin || P.nworkers == 0 || P.nthreads != CPU_COUNT(&g_cpus)) return;
  const int me = sched_getcpu();
  if (me < 0 || me == g_placed) return;
  g_placed = me;
  int cpus[CPU_SETSIZE], n = 0, at = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
    if (CPU_ISSET(cpu, &g_cpus)) {
      if (cpu == me) at = n;
      cpus[n++] = cpu;
    }
  for (int i = 0; i < P.nworkers; i++) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpus[(at + 1 + i) % n], &one);
    pthread_setaffinity_np(P.workers[i], sizeof one, &one);
  }
#endif
}

static uint32_t g_start_gen[MAX_THREADS]; /* the job generation worker i starts from */

/* ex_prefetch_async's request; a new one may be written while the worker reads the old one, so
 * the fields are atomic (a torn request only prefetches the wrong lines: prefetches never fault) */
static struct {
  _Atomic uint32_t gen; /* bumped by each request */
  _Atomic(const char *) p[EX_PREFETCH_MAX];
  _Atomic int64_t bytes[EX_PREFETCH_MAX];
  _Atomic int32_t n;
} PF;

/* run by worker 0 while no job newer than `gen` and no newer request has come */
static void prefetch_request(uint32_t gen, uint32_t req) {
  const int n = atomic_load_explicit(&PF.n, memory_order_relaxed);
  const char *p[EX_PREFETCH_MAX];
  int64_t bytes[EX_PREFETCH_MAX], most = 0;
  for (int i = 0; i < n; i++) {
    p[i] = atomic_load_explicit(&PF.p[i], memory_order_relaxed);
    bytes[i] = atomic_load_explicit(&PF.bytes[i], memory_order_relaxed);
    most = bytes[i] > most ? bytes[i] : most;
  }
  for (int64_t off = 0; off < most; off += 64) {
    for (int i = 0; i < n; i++)
      if (off < bytes[i]) __builtin_prefetch(p[i] + off, 0, 2);
    if (ticket_gen(atomic_load_explicit(&P.ticket, memory_order_relaxed)) != gen ||
        atomic_load_explicit(&PF.gen, memory_order_relaxed) != req)
      return;
  }
}

static void wake_all(void);

void ex_prefetch_async(const ex_prefetch *req) {
  const int n = !req || req->n < 0 ? 0 : req->n > EX_PREFETCH_MAX ? EX_PREFETCH_MAX : req->n;
  if (n == 0) return;
  for (int i = 0; i < n; i++) {
    atomic_store_explicit(&PF.p[i], (const char *)req->p[i], memory_order_relaxed);
    atomic_store_explicit(&PF.bytes[i], req->bytes[i], memory_order_relaxed);
  }
  atomic_store_explicit(&PF.n, n, memory_order_relaxed);
  atomic_fetch_add(&PF.gen, 1);
  wake_all();
}

static void *worker_main(void *arg) {
  const uint32_t *start = arg;
  const int prefetcher = start == &g_start_gen[0];
  uint32_t seen = *start, req = atomic_load(&PF.gen);
  for (;;) {
    uint32_t g;
    int64_t t0 = now_ns();
    for (int spins = 0; (g = ticket_gen(atomic_load(&P.ticket))) == seen && !atomic_load(&P.stop);
         spins++) {
      if (prefetcher && atomic_load_explicit(&PF.gen, memory_order_relaxed) != req) {
        req = atomic_load(&PF.gen);
        prefetch_request(seen, req);
        t0 = now_ns();
        continue;
      }
      cpu_relax();
      if ((spins & 63) == 63 && now_ns() - t0 > SPIN_NS) {
        pthread_mutex_lock(&P.cv_lock);
        atomic_fetch_add(&P.sleeping, 1);
        while (ticket_gen(atomic_load(&P.ticket)) == seen && !atomic_load(&P.stop) &&
               !(prefetcher && atomic_load(&PF.gen) != req))
          pthread_cond_wait(&P.cv, &P.cv_lock);
        atomic_fetch_sub(&P.sleeping, 1);
        pthread_mutex_unlock(&P.cv_lock);
      }
    }
    if (atomic_load(&P.stop)) return NULL;
    seen = g;
    run_chunks(g);
  }
}

static void wake_all(void) {
  if (atomic_load(&P.sleeping)) {
    pthread_mutex_lock(&P.cv_lock);
    pthread_cond_broadcast(&P.cv);
    pthread_mutex_unlock(&P.cv_lock);
  }
}

/* with run_lock held: stop the workers */
static void stop_workers(void) {
  atomic_store(&P.stop, 1);
  pthread_mutex_lock(&P.cv_lock);
  pthread_cond_broadcast(&P.cv);
  pthread_mutex_unlock(&P.cv_lock);
  for (int i = 0; i < P.nworkers; i++) pthread_join(P.workers[i], NULL);
  P.nworkers = 0;
  atomic_store(&P.stop, 0);
}

/* with run_lock held: start the missing workers (fewer if the system refuses) */
static void start_workers(void) {
  while (P.nworkers < P.nthreads - 1) {
#ifdef __linux__
    g_placed = -1; /* the new worker is placed by the next job */
#endif
    g_start_gen[P.nworkers] = P.gen;
    if (pthread_create(&P.workers[P.nworkers], NULL, worker_main, &g_start_gen[P.nworkers]) != 0) break;
    P.nworkers++;
  }
}

static void after_fork_child(void) { /* the workers did not survive the fork */
  pthread_mutex_init(&P.run_lock, NULL);
  pthread_mutex_init(&P.cv_lock, NULL);
  pthread_cond_init(&P.cv, NULL);
  P.nworkers = 0;
  atomic_store(&P.sleeping, 0);
  atomic_store(&P.stop, 0);
}

static void pool_init(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  const char *e = getenv("EXPRESS_NUM_THREADS");
  if (e && atoi(e) > 0) n = atoi(e);
  P.nthreads = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : (int)n;
#ifdef __linux__
  if (sched_getaffinity(0, sizeof g_cpus, &g_cpus) != 0) CPU_ZERO(&g_cpus); /* then: no pinning */
  const char *pin = getenv("EXPRESS_PIN_THREADS");
  g_pin = !(pin && strcmp(pin, "0") == 0);
#endif
  pthread_atfork(NULL, NULL, after_fork_child);
}

void ex_set_num_threads(int n) {
  pthread_once(&g_once, pool_init);
  n = n < 1 ? 1 : n > MAX_THREADS ? MAX_THREADS : n;
  pthread_mutex_lock(&P.run_lock);
  if (n - 1 < P.nworkers) stop_workers(); /* restarted lazily by the next job */
  P.nthreads = n;
  pthread_mutex_unlock(&P.run_lock);
}

int ex_get_num_threads(void) {
  pthread_once(&g_once, pool_init);
  return P.nthreads;
}

int ex_pool_width(void) { return t_in_task ? 1 : ex_get_num_threads(); }

int64_t ex_parallel_per(int64_t n, int64_t grain) {
  if (n <= 0) return 0;
  if (grain < 1) grain = 1;
  const int nt = ex_pool_width();
  const int64_t chunks = (n + grain - 1) / grain, most = 4 * (int64_t)nt;
  if (nt == 1 || chunks <= 1) return n;
  int64_t c = chunks < most ? chunks : most;
  /* a whole number of chunks a thread where there are items enough: 64 channels in chunks of
   * 10 ran as 4 + 3 chunks on two threads, one thread doing 40 */
  if (c % nt && (c / nt + 1) * nt <= n) c = (c / nt + 1) * nt;
  return (n + c - 1) / c;
}

void ex_parallel_for(int64_t n, int64_t grain, ex_task_fn fn, void *ctx) {
  if (n <= 0) return;
  const int64_t per = ex_parallel_per(n, grain);
  if (per >= n || pthread_mutex_trylock(&P.run_lock) != 0) {
    fn(ctx, 0, n);
    return;
  }
  start_workers();
  place_workers();
  if (P.nworkers == 0) {
    pthread_mutex_unlock(&P.run_lock);
    fn(ctx, 0, n);
    return;
  }
  P.fn = fn;
  P.ctx = ctx;
  P.n = n;
  P.per = per;
  const int64_t chunks = (n + per - 1) / per;
  atomic_store(&P.done, 0);
  const uint32_t gen = ++P.gen;
  atomic_store(&P.ticket, (uint64_t)gen << 32 | (uint64_t)chunks); /* publishes the job */
  wake_all();
  run_chunks(gen);
  while (atomic_load_explicit(&P.done, memory_order_acquire) < chunks) cpu_relax();
  pthread_mutex_unlock(&P.run_lock);
}
