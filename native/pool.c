/* A small fork-join thread pool for the native kernels (GEMM, depthwise, ...).
 *
 * Why not Python threads or OpenBLAS' pool: a Python hand-off costs tens of microseconds, more than many
 * mobile-net layers take, and OpenBLAS' workers only serve its own GEMMs. Here a job is a task count and a
 * callback; the calling thread works on it too, and workers spin briefly between jobs so back-to-back layers
 * do not pay a futex wake-up each.
 *
 * Tasks are dealt in contiguous ranges, one per thread (the caller takes the first), and a thread that ends its
 * own range steals from the far end of the others'. The same thread thus computes the same share of every
 * layer that splits alike (a depthwise conv's channels after the 1x1 conv that wrote them) and reads it from
 * its own cache, where with one shared counter which thread took which task changed from layer to layer
 * (2-core VM: int8 mobilenetv2 ~3% faster, fp32 shufflenetv2 up to 9%). A worker descheduled because the core
 * is busy still loses only the tasks it did not start.
 *
 * Correctness of the hand-off rests on one 64-bit state word: bits 63..33 the job generation, bit 32 "open",
 * bits 31..0 the number of workers inside the job. A worker enters with a CAS that requires the generation it
 * saw and the open bit; the caller, once every task is claimed, clears the open bit and waits until nobody
 * is inside. So no worker can touch a job's fields after its caller returned, and the caller never waits
 * for a worker that did not start (one that is asleep or descheduled).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#define OPEN_BIT (1ULL << 32)
#define GEN_SHIFT 33
#define INSIDE_MASK 0xffffffffULL
#define MAX_THREADS 64

typedef void (*task_fn)(void* ctx, long long task);

/* One thread's share of the job: next task (high half) and end (low half), claimed by CAS from either end. */
typedef struct {
    uint64_t range;
    char pad[64 - sizeof(uint64_t)];
} share_t;

static struct {
    pthread_mutex_t submit; /* one job at a time; a second caller runs its tasks inline */
    pthread_mutex_t mu;     /* guards sleeping and thread start/stop */
    uint64_t state;
    int sleepers;
    int stop;
    int nthreads; /* wanted, caller included */
    int nworkers; /* started */
    pthread_t tids[MAX_THREADS];
    long long spin_ns;
    /* the current job: written by the caller before the generation is published */
    task_fn fn;
    void* ctx;
    int job_workers; /* workers (besides the caller) that may take part */
    int caller_cpu;  /* the core the caller submitted the job from (-1: unknown) */
    share_t share[MAX_THREADS] __attribute__((aligned(64))); /* [0] the caller's, [1 + i] worker i's */
    /* each worker sleeps on its own condition variable (under mu), so that a job wakes only the workers it takes */
    pthread_cond_t wcv[MAX_THREADS];
    int asleep[MAX_THREADS];
    long long jobs[MAX_THREADS]; /* jobs each worker entered (inferd_pool_worker_jobs) */
    inferd_idle_work* idle;      /* work for a spinning worker (inferd_pool_set_idle_work), or NULL */
    int idle_inside;             /* workers inside idle->fn */
} P = {.submit = PTHREAD_MUTEX_INITIALIZER, .mu = PTHREAD_MUTEX_INITIALIZER, .nthreads = 1, .spin_ns = 200000};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The next task of share q: from the front for its owner, from the back for a thief; -1 once it is empty. */
static long long claim(int q, int front)
{
    uint64_t r = __atomic_load_n(&P.share[q].range, __ATOMIC_RELAXED);
    for (;;) {
        const uint32_t lo = (uint32_t)(r >> 32), hi = (uint32_t)r;
        if (lo >= hi) return -1;
        const uint64_t nr = front ? ((uint64_t)(lo + 1) << 32) | hi : ((uint64_t)lo << 32) | (hi - 1);
        if (__atomic_compare_exchange_n(&P.share[q].range, &r, nr, 0, __ATOMIC_RELAXED, __ATOMIC_RELAXED))
            return front ? (long long)lo : (long long)hi - 1;
    }
}

/* Participant p of n: its own share front to back, then the others' from their backs until every share is empty
   (so when the caller returns from here, every task has been claimed). */
static void run_tasks(task_fn fn, void* ctx, int p, int n)
{
    long long t;
    while ((t = claim(p, 1)) >= 0) fn(ctx, t);
    for (int k = 1; k < n; ++k) {
        const int q = (p + k) % n;
        while ((t = claim(q, 0)) >= 0) fn(ctx, t);
    }
}

typedef struct {
    int index;
    uint64_t gen; /* the generation before the worker's first job, so it cannot miss that job */
} worker_arg;

static worker_arg ARGS[MAX_THREADS];

/* Whether the job of state s wants worker `index`: a generation after `seen` whose job takes more workers than
   `index` (its job_workers is written before its generation is published). */
static inline int wanted(uint64_t s, uint64_t seen, int index)
{
    return (s >> GEN_SHIFT) != seen && index < __atomic_load_n(&P.job_workers, __ATOMIC_RELAXED);
}

/* A worker that enters a job on the very core its caller runs on moves itself to another of its allowed cores
   (inferd_pool_leave_core). After an idle spell the scheduler woke the worker onto the caller's core (2-vCPU VM:
   about half the 10-run rounds after a 150 ms pause) and left both there for the whole round: every parallel
   layer ran on one core, keras mobilenetv2 1.15 ms instead of 0.72 (pinning the two threads apart: 0.72 every
   round; onnxruntime, whose workers spin 40 ms after a run, stays apart that way). Excluding the caller's core
   moves the thread at once; the mask is then restored, so the scheduler keeps every core to balance with. */
int inferd_pool_leave_core(int cpu)
{
#ifdef __linux__
    const int here = sched_getcpu();
    if (here < 0 || here != cpu) return here;
    cpu_set_t all, other;
    if (sched_getaffinity(0, sizeof all, &all) != 0) return here;
    other = all;
    CPU_CLR(here, &other);
    if (CPU_COUNT(&other) == 0) return here;
    if (sched_setaffinity(0, sizeof other, &other) == 0) sched_setaffinity(0, sizeof all, &all);
    return sched_getcpu();
#else
    (void)cpu;
    return -1;
#endif
}

/* A spinning worker's idle work: 1 if it did some. The count of workers inside is raised before the slot is
   read (both sequentially consistent), so inferd_pool_clear_idle_work, which empties the slot and then waits
   for the count to drop, never returns while a worker runs the work it cleared. */
static int idle_work(void)
{
    __atomic_fetch_add(&P.idle_inside, 1, __ATOMIC_SEQ_CST);
    inferd_idle_work* w = __atomic_load_n(&P.idle, __ATOMIC_SEQ_CST);
    int did = w ? w->fn(w->ctx) : 0;
    __atomic_fetch_sub(&P.idle_inside, 1, __ATOMIC_SEQ_CST);
    return did;
}

int inferd_pool_set_idle_work(inferd_idle_work* w)
{
    inferd_idle_work* none = NULL;
    return __atomic_compare_exchange_n(&P.idle, &none, w, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
}

void inferd_pool_clear_idle_work(inferd_idle_work* w)
{
    inferd_idle_work* mine = w;
    if (!__atomic_compare_exchange_n(&P.idle, &mine, NULL, 0, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) return;
    for (unsigned k = 1; __atomic_load_n(&P.idle_inside, __ATOMIC_SEQ_CST); ++k) {
        cpu_relax();
        if ((k & 1023) == 0) sched_yield();
    }
}

static void* worker_main(void* arg)
{
    const int index = ((worker_arg*)arg)->index;
    uint64_t seen = ((worker_arg*)arg)->gen;
    long long until = now_ns() + P.spin_ns;
    for (;;) {
        /* wait for a job that wants this worker: spin until spin_ns after the last job it saw, then sleep on its
           own condition variable. A job that takes fewer workers does not wake a sleeping one (a small model's
           two-way jobs woke all 15 workers of a 16-core host, which then spun 200 us each: 3.6 ms of CPU for a
           0.1 ms inference); an awake one stays awake while jobs come, so that the next large layer finds it
           spinning (woken from sleep one by one, resnet18's 16 threads ran 20-35% slower) */
        uint64_t s = __atomic_load_n(&P.state, __ATOMIC_SEQ_CST);
        for (int k = 0; !wanted(s, seen, index); s = __atomic_load_n(&P.state, __ATOMIC_SEQ_CST)) {
            if ((s >> GEN_SHIFT) != seen) {
                seen = s >> GEN_SHIFT;
                until = now_ns() + P.spin_ns;
            }
            cpu_relax();
            if (__atomic_load_n(&P.stop, __ATOMIC_RELAXED)) return NULL;
            if ((++k & 255) != 0) continue;
            if (__atomic_load_n(&P.idle, __ATOMIC_RELAXED) && idle_work()) {
                until = now_ns() + P.spin_ns; /* while there is such work this core has it to do, awake */
                continue;
            }
            if (now_ns() <= until) {
                /* let a thread that shares this core (the caller, between layers) run: on a loaded or
                   oversubscribed machine a pure spin steals its time slice */
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&P.mu);
            __atomic_fetch_add(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            P.asleep[index] = 1;
            while (!P.stop && !wanted(__atomic_load_n(&P.state, __ATOMIC_SEQ_CST), seen, index))
                pthread_cond_wait(&P.wcv[index], &P.mu);
            P.asleep[index] = 0;
            __atomic_fetch_sub(&P.sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&P.mu);
            k = 0;
        }
        if (__atomic_load_n(&P.stop, __ATOMIC_RELAXED)) return NULL;
        seen = s >> GEN_SHIFT;
        /* enter only the job we saw, and only while it is open */
        int entered = 0;
        while ((s & OPEN_BIT) && (s >> GEN_SHIFT) == seen) {
            if (__atomic_compare_exchange_n(&P.state, &s, s + 1, 0, __ATOMIC_ACQUIRE, __ATOMIC_RELAXED)) {
                entered = 1;
                break;
            }
        }
        if (!entered) continue;
        inferd_pool_leave_core(__atomic_load_n(&P.caller_cpu, __ATOMIC_RELAXED));
        __atomic_fetch_add(&P.jobs[index], 1, __ATOMIC_RELAXED);
        if (index < P.job_workers) run_tasks(P.fn, P.ctx, 1 + index, 1 + P.job_workers);
        __atomic_fetch_sub(&P.state, 1, __ATOMIC_RELEASE);
        until = now_ns() + P.spin_ns;
    }
}

/* Called with P.submit held. */
static void stop_workers(void)
{
    pthread_mutex_lock(&P.mu);
    __atomic_store_n(&P.stop, 1, __ATOMIC_SEQ_CST);
    for (int i = 0; i < P.nworkers; ++i) pthread_cond_broadcast(&P.wcv[i]);
    pthread_mutex_unlock(&P.mu);
    for (int i = 0; i < P.nworkers; ++i) pthread_join(P.tids[i], NULL);
    for (int i = 0; i < P.nworkers; ++i) pthread_cond_destroy(&P.wcv[i]);
    P.nworkers = 0;
    __atomic_store_n(&P.stop, 0, __ATOMIC_SEQ_CST);
}

/* Called with P.submit held. */
static void start_workers(void)
{
    while (P.nworkers < P.nthreads - 1) {
        ARGS[P.nworkers].index = P.nworkers;
        ARGS[P.nworkers].gen = __atomic_load_n(&P.state, __ATOMIC_RELAXED) >> GEN_SHIFT;
        pthread_cond_init(&P.wcv[P.nworkers], NULL);
        P.asleep[P.nworkers] = 0;
        if (pthread_create(&P.tids[P.nworkers], NULL, worker_main, &ARGS[P.nworkers]) != 0) {
            pthread_cond_destroy(&P.wcv[P.nworkers]);
            break;
        }
        P.nworkers++;
    }
}

static void atfork_child(void)
{
    /* the workers do not exist in the child: forget them and start afresh on the next job */
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    P.submit = m;
    P.mu = m;
    P.nworkers = 0; /* their condition variables are initialised afresh when workers start again */
    P.sleepers = 0;
    P.stop = 0;
    P.state = 0;
    P.idle = NULL; /* a streaming run of the parent's: its loaders and its queue's lock are not the child's */
    P.idle_inside = 0;
}

static pthread_once_t once = PTHREAD_ONCE_INIT;
static void init_once(void) { pthread_atfork(NULL, NULL, atfork_child); }

void inferd_pool_set_threads(int n)
{
    pthread_once(&once, init_once);
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    pthread_mutex_lock(&P.submit);
    if (n != P.nthreads) {
        stop_workers();
        P.nthreads = n;
    }
    pthread_mutex_unlock(&P.submit);
}

int inferd_pool_threads(void) { return P.nthreads; }

long long inferd_pool_worker_jobs(int i)
{
    return i >= 0 && i < MAX_THREADS ? __atomic_load_n(&P.jobs[i], __ATOMIC_RELAXED) : -1;
}

int inferd_pool_worker_asleep(int i)
{
    if (i < 0 || i >= P.nworkers) return -1;
    pthread_mutex_lock(&P.mu);
    const int a = P.asleep[i];
    pthread_mutex_unlock(&P.mu);
    return a;
}

void inferd_pool_set_spin_us(int us) { P.spin_ns = us < 0 ? 0 : (long long)us * 1000; }

/* A cap on the threads of the jobs this thread submits (0: none). A small model's warm runs take the calling
   thread alone where that measured faster (daemon/runtime/threads.py): waking a worker for a 0.1 ms run costs
   more than it gives, and the woken worker then spins its 200 us on a core the apps want. Per thread, so another
   thread's run of another model keeps the whole pool. */
static __thread int CALLER_CAP = 0;

void inferd_pool_set_caller_cap(int n) { CALLER_CAP = n < 0 ? 0 : n; }

int inferd_pool_caller_cap(void) { return CALLER_CAP; }

void inferd_parallel(void (*fn)(void* ctx, long long task), void* ctx, long long ntasks, int max_threads)
{
    if (ntasks <= 0) return;
    int want = P.nthreads;
    if (max_threads > 0 && max_threads < want) want = max_threads;
    if (CALLER_CAP > 0 && CALLER_CAP < want) want = CALLER_CAP;
    if (want > ntasks) want = (int)ntasks;
    if (want <= 1 || ntasks > 0x7fffffffLL || pthread_mutex_trylock(&P.submit) != 0) {
        /* one thread wanted, or the pool is busy (another caller, or a task calling back in), or more tasks than
           a share's 32-bit halves hold (no kernel makes that many): inline */
        for (long long t = 0; t < ntasks; ++t) fn(ctx, t);
        return;
    }
    pthread_once(&once, init_once);
    if (P.nworkers < P.nthreads - 1) start_workers();
    P.fn = fn;
    P.ctx = ctx;
#ifdef __linux__
    __atomic_store_n(&P.caller_cpu, sched_getcpu(), __ATOMIC_RELAXED);
#else
    __atomic_store_n(&P.caller_cpu, -1, __ATOMIC_RELAXED);
#endif
    __atomic_store_n(&P.job_workers, want - 1, __ATOMIC_RELAXED);
    for (int q = 0; q < want; ++q) {
        const uint64_t lo = (uint64_t)(ntasks * q / want), hi = (uint64_t)(ntasks * (q + 1) / want);
        __atomic_store_n(&P.share[q].range, (lo << 32) | hi, __ATOMIC_RELAXED);
    }
    /* publish: new generation, open, nobody inside */
    const uint64_t gen = (__atomic_load_n(&P.state, __ATOMIC_RELAXED) >> GEN_SHIFT) + 1;
    __atomic_store_n(&P.state, (gen << GEN_SHIFT) | OPEN_BIT, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&P.sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&P.mu);
        for (int q = 0; q < want - 1; ++q)
            if (P.asleep[q]) pthread_cond_signal(&P.wcv[q]);
        pthread_mutex_unlock(&P.mu);
    }
    run_tasks(fn, ctx, 0, want);
    /* every task is claimed: close the job, then wait for the workers still inside */
    __atomic_fetch_and(&P.state, ~OPEN_BIT, __ATOMIC_SEQ_CST);
    for (unsigned k = 1; __atomic_load_n(&P.state, __ATOMIC_ACQUIRE) & INSIDE_MASK; ++k) {
        cpu_relax();
        if ((k & 1023) == 0) sched_yield(); /* the worker we wait for may be queued on this very core */
    }
    pthread_mutex_unlock(&P.submit);
}

int inferd_pool_useful_threads(double work, double per_thread)
{
    const int t = P.nthreads;
    if (t <= 2 || per_thread <= 0) return t;
    const double k = work / per_thread;
    return k >= t ? t : (k < 2 ? 2 : (int)k);
}

int inferd_pool_chunks(long long items, double work)
{
    const int t = P.nthreads;
    if (t <= 1 || items < 2 || work < 32768.0) return 1;
    /* not fewer threads by work as a GEMM does (inferd_pool_useful_threads): these are mostly passes over memory
       (bias and activation, transforms, copies), where 64k elements a thread left resnet18 slower on 16 cores */
    return (int)(items < 4LL * t ? items : 4LL * t);
}
