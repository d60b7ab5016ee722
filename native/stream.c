/* The streaming runtime's loaders (daemon/runtime/stream.py): threads that read a model's streamed weights from
 * its weights store into the arena while the compute thread runs the layers, each piece once the last step that
 * used its addresses has run, and verify each layer's blobs once all their pieces are in.
 *
 * Why in C: the Python loaders took the GIL for every read's bookkeeping and at every step they were woken for,
 * and the compute thread (Python between its native layer calls) waited for it. 2-core VM, vit_tiny at 8.5 MiB
 * (16 MiB streamed per run, 51 reads): with every read made a no-op the Python loader alone cost 8% of a 22 ms
 * run (three loaders 16%). Here the compute thread publishes each step with an atomic store (a wake-up only when
 * a loader waits for that step) and waits for a layer without the GIL; the loaders never take it.
 *
 * The queue and the rules are the Python loader's: pieces in run order (by layer, then by dependency); a loader
 * takes the first untaken piece whose dependency has run and joins the untaken ones that follow it in the store
 * (gaps of at most gap_max bytes read into a scratch buffer, up to run_max bytes) into one preadv; the compute
 * thread, reaching a layer whose weights are not in, reads that layer's untaken pieces itself rather than wait
 * for a loader to be scheduled. Whoever reads a layer's last piece verifies its blobs (the store's checksum,
 * through the hash function the caller passes: xxh3, the same code the store's Python side calls). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#define NEVER INT32_MAX
#define MAX_LOADERS 16
/* pieces a read may join (the Python loader looked 64 ahead) */
#define JOIN_MAX 64
/* the most a pool worker reads at a time between two jobs: ~50 us of copying from the page cache, so that a job
   that comes meanwhile finds it soon (its share is stolen by the caller until then) */
#define IDLE_RUN (64 << 10)

struct inferd_stream {
    int fd, dfd, drop, nice;
    int n, nunits, nblobs;
    inferd_stream_piece* pc; /* queue order */
    inferd_stream_blob* blob; /* by unit */
    int *first, *count, *bfirst, *bcount;
    inferd_hash_fn hash;
    char* gap;
    long long gap_size, run_max, gap_max;
    int nodirect; /* the file system refused a direct read: buffered from then on */
    int pool_idle; /* spinning pool workers read pieces too */
    inferd_idle_work idle;
    int idle_set; /* this run holds the pool's idle-work slot */

    /* one run's state: under mu, except prog, want and ok (atomics) */
    unsigned char* taken;
    int* left;
    int* ok;
    int cur, prog, want, waiting, active;
    int err, err_errno, err_piece, err_blob;
    long long err_got, err_need;
    int inflight;
    double since, read_s, verify_s;
    long long reads, bytes, idle_reads;

    pthread_mutex_t mu;
    pthread_cond_t lcv; /* loaders: a new run, a dependency, the end */
    pthread_cond_t ccv; /* the compute thread: a layer in, an error, loaders idle */
    pthread_t th[MAX_LOADERS];
    int nthreads, want_threads, gen, busy, closed;
};

typedef struct {
    inferd_stream* s;
    int index;
} loader_arg;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Under mu: the first error wins; everyone waiting wakes up to see it. */
static void fail_locked(inferd_stream* s, int code, int eno, int piece, int blob, long long got, long long need) {
    if (!s->err) {
        s->err = code;
        s->err_errno = eno;
        s->err_piece = piece;
        s->err_blob = blob;
        s->err_got = got;
        s->err_need = need;
    }
    pthread_cond_broadcast(&s->lcv);
    pthread_cond_broadcast(&s->ccv);
}

static void fail(inferd_stream* s, int code, int eno, int piece, int blob, long long got, long long need) {
    pthread_mutex_lock(&s->mu);
    fail_locked(s, code, eno, piece, blob, got, need);
    pthread_mutex_unlock(&s->mu);
}

/* Under mu: append to run (n pieces) the untaken pieces [from, to) that can join its read (of up to max
   bytes), in order. */
static void extend(inferd_stream* s, int* run, int* n, int from, int to, int prog, long long max) {
    const inferd_stream_piece* last = &s->pc[run[*n - 1]];
    long long size = 0, end = last->file_off + last->span;
    for (int k = 0; k < *n; ++k) size += s->pc[run[k]].span;
    for (int j = from; j < to && *n < JOIN_MAX; ++j) {
        const inferd_stream_piece* p = &s->pc[j];
        long long gap = p->file_off - end;
        if (size >= max || gap < 0 || gap > s->gap_max || s->taken[j] || p->dep > prog) break;
        s->taken[j] = 1;
        run[(*n)++] = j;
        size += gap + p->span;
        end = p->file_off + p->span;
    }
}

/* preadv until every byte of iov is in or the file ends; -1 (errno set) on an error. */
static long long preadv_full(int fd, struct iovec* iov, int cnt, long long off) {
    long long done = 0;
    int i = 0;
    while (i < cnt) {
        ssize_t r = preadv(fd, iov + i, cnt - i, (off_t)(off + done));
        if (r < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (r == 0) break;
        done += r;
        while (i < cnt && (size_t)r >= iov[i].iov_len) {
            r -= (ssize_t)iov[i].iov_len;
            ++i;
        }
        if (i < cnt) {
            iov[i].iov_base = (char*)iov[i].iov_base + r;
            iov[i].iov_len -= (size_t)r;
        }
    }
    return done;
}

static void verify_unit(inferd_stream* s, int u) {
    if (s->hash) {
        double t0 = now();
        for (int b = s->bfirst[u]; b < s->bfirst[u] + s->bcount[u]; ++b) {
            const inferd_stream_blob* bl = &s->blob[b];
            if (s->hash((const void*)(uintptr_t)bl->addr, (unsigned long)bl->size) != bl->sum) {
                fail(s, INFERD_STREAM_CHECKSUM, 0, -1, b, 0, 0);
                return;
            }
        }
        pthread_mutex_lock(&s->mu);
        s->verify_s += now() - t0;
    } else {
        pthread_mutex_lock(&s->mu);
    }
    __atomic_store_n(&s->ok[u], 1, __ATOMIC_RELEASE);
    if (s->waiting == u) pthread_cond_broadcast(&s->ccv);
    pthread_mutex_unlock(&s->mu);
}

/* Read the claimed pieces run[0..n) (one preadv), then verify the layers whose last piece this was. */
static void read_run(inferd_stream* s, const int* run, int n) {
    struct iovec iov[2 * JOIN_MAX];
    int k = 0;
    const inferd_stream_piece* p0 = &s->pc[run[0]];
    const inferd_stream_piece* pl = &s->pc[run[n - 1]];
    long long pos = p0->file_off;
    for (int j = 0; j < n; ++j) {
        const inferd_stream_piece* p = &s->pc[run[j]];
        if (p->file_off > pos) {
            if (p->file_off - pos > s->gap_size) {
                fail(s, INFERD_STREAM_GAP, 0, run[j], -1, p->file_off - pos, s->gap_size);
                return;
            }
            iov[k].iov_base = s->gap;
            iov[k++].iov_len = (size_t)(p->file_off - pos);
        }
        iov[k].iov_base = (void*)(uintptr_t)p->dst;
        iov[k++].iov_len = (size_t)p->span;
        pos = p->file_off + p->span;
    }
    long long need = pos - p0->file_off - (pl->span - pl->need);
    struct iovec copy[2 * JOIN_MAX];
    memcpy(copy, iov, sizeof(struct iovec) * (size_t)k);

    pthread_mutex_lock(&s->mu);
    if (s->inflight++ == 0) s->since = now();
    pthread_mutex_unlock(&s->mu);
    long long got = -1;
    int eno = 0;
    int direct = s->dfd >= 0 && !__atomic_load_n(&s->nodirect, __ATOMIC_RELAXED);
    if (direct) {
        got = preadv_full(s->dfd, iov, k, p0->file_off);
        if (got < 0 && errno == EINVAL) { /* the device wants larger blocks: buffered from now on */
            __atomic_store_n(&s->nodirect, 1, __ATOMIC_RELAXED);
            memcpy(iov, copy, sizeof(struct iovec) * (size_t)k);
            direct = 0;
        }
        eno = errno;
    }
    if (!direct) {
        got = preadv_full(s->fd, iov, k, p0->file_off);
        eno = errno;
        if (got > 0 && s->drop) posix_fadvise(s->fd, (off_t)p0->file_off, (off_t)got, POSIX_FADV_DONTNEED);
    }
    int done_units[JOIN_MAX];
    int nd = 0;
    pthread_mutex_lock(&s->mu);
    if (--s->inflight == 0) s->read_s += now() - s->since;
    s->reads += 1;
    s->bytes += pos - p0->file_off;
    if (got < 0) {
        fail_locked(s, INFERD_STREAM_IO, eno, run[0], -1, 0, need);
    } else if (got < need) {
        fail_locked(s, INFERD_STREAM_SHORT, 0, run[0], -1, got, need);
    } else {
        for (int j = 0; j < n; ++j) {
            int u = s->pc[run[j]].unit;
            if (--s->left[u] == 0) done_units[nd++] = u;
        }
    }
    pthread_mutex_unlock(&s->mu);
    for (int j = 0; j < nd; ++j) verify_unit(s, done_units[j]);
}

/* Under mu: claim the queue's next run (its first untaken piece, if the step it waits for has run, and the pieces
   that join it in a read of up to max bytes): the pieces claimed, or 0 with *dep the step the next piece waits
   for (NEVER: none is left). */
static int take_next(inferd_stream* s, int* run, long long max, int* dep) {
    int q = s->cur;
    while (q < s->n && s->taken[q]) ++q;
    s->cur = q;
    *dep = NEVER;
    if (q >= s->n) return 0;
    int prog = __atomic_load_n(&s->prog, __ATOMIC_SEQ_CST);
    if (s->pc[q].dep > prog) {
        *dep = s->pc[q].dep;
        return 0;
    }
    int n = 1;
    s->taken[q] = 1;
    run[0] = q;
    extend(s, run, &n, q + 1, s->n, prog, max);
    s->cur = q + n;
    return n;
}

/* A loader's next run off the queue, waiting for its first piece's dependency; 0: nothing more this run. */
static int next_run(inferd_stream* s, int* run, int* n) {
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (s->err || !s->active) break;
        int dep;
        *n = take_next(s, run, s->run_max, &dep);
        if (*n) {
            pthread_mutex_unlock(&s->mu);
            return 1;
        }
        if (dep == NEVER) break;
        if (dep < __atomic_load_n(&s->want, __ATOMIC_SEQ_CST)) __atomic_store_n(&s->want, dep, __ATOMIC_SEQ_CST);
        /* the compute thread stores prog, then reads want; we store want, then read prog: one of us sees the
           other's store, so a step that makes this piece readable is never missed */
        if (dep <= __atomic_load_n(&s->prog, __ATOMIC_SEQ_CST)) continue;
        pthread_cond_wait(&s->lcv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return 0;
}

/* A pool worker between two jobs: the queue's next run if its dependency has run (never waiting), of at most
   IDLE_RUN bytes; 1 if it read one. */
static int idle_read(void* ctx) {
    inferd_stream* s = ctx;
    int run[JOIN_MAX];
    int n = 0, dep;
    pthread_mutex_lock(&s->mu);
    if (!s->err && s->active) n = take_next(s, run, s->run_max < IDLE_RUN ? s->run_max : IDLE_RUN, &dep);
    if (n) s->busy++; /* inside the run, as a loader: an abort waits for it */
    pthread_mutex_unlock(&s->mu);
    if (!n) return 0;
    read_run(s, run, n);
    pthread_mutex_lock(&s->mu);
    s->idle_reads++;
    if (--s->busy == 0) pthread_cond_broadcast(&s->ccv);
    pthread_mutex_unlock(&s->mu);
    return 1;
}

static void* loader_main(void* argp) {
    loader_arg a = *(loader_arg*)argp;
    free(argp);
    inferd_stream* s = a.s;
    pthread_setname_np(pthread_self(), "inferd-stream");
    if (s->nice == INFERD_STREAM_IDLE) { /* only on a core nothing else wants; not permitted: as is */
        struct sched_param sp = {0};
        pthread_setschedparam(pthread_self(), SCHED_IDLE, &sp);
    } else if (s->nice > 0) {
        setpriority(PRIO_PROCESS, (id_t)syscall(SYS_gettid), s->nice);
    }
    int seen = 0;
    int run[JOIN_MAX];
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->closed && (s->gen == seen || a.index >= s->want_threads || !s->active)) {
            if (s->gen != seen) { /* a run that wants fewer loaders, or one already over */
                seen = s->gen;
                continue;
            }
            pthread_cond_wait(&s->lcv, &s->mu);
        }
        if (s->closed) break;
        seen = s->gen;
        s->busy++;
        pthread_mutex_unlock(&s->mu);
        int n;
        while (next_run(s, run, &n)) read_run(s, run, n);
        pthread_mutex_lock(&s->mu);
        if (--s->busy == 0) pthread_cond_broadcast(&s->ccv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static void free_all(inferd_stream* s) {
    free(s->pc);
    free(s->blob);
    free(s->first);
    free(s->count);
    free(s->bfirst);
    free(s->bcount);
    free(s->taken);
    free(s->left);
    free(s->ok);
    free(s);
}

inferd_stream* inferd_stream_new(int fd, int dfd, int drop, int nice, int pool_idle,
                                 const inferd_stream_piece* pieces, int npieces, int nunits,
                                 const inferd_stream_blob* blobs, int nblobs, inferd_hash_fn hash, void* gap,
                                 long long gap_size, long long run_max, long long gap_max) {
    if (npieces < 0 || nunits < 0 || nblobs < 0) return NULL;
    inferd_stream* s = calloc(1, sizeof(*s));
    if (!s) return NULL;
    s->fd = fd;
    s->dfd = dfd;
    s->drop = drop;
    s->nice = nice;
    s->pool_idle = pool_idle;
    s->idle.fn = idle_read;
    s->idle.ctx = s;
    s->n = npieces;
    s->nunits = nunits;
    s->nblobs = nblobs;
    s->hash = hash;
    s->gap = gap;
    s->gap_size = gap_size;
    s->run_max = run_max;
    s->gap_max = gap_max < gap_size ? gap_max : gap_size;
    size_t np = (size_t)npieces + 1, nu = (size_t)nunits + 1;
    s->pc = malloc(np * sizeof(*s->pc));
    s->blob = malloc(((size_t)nblobs + 1) * sizeof(*s->blob));
    s->first = calloc(nu, sizeof(int));
    s->count = calloc(nu, sizeof(int));
    s->bfirst = calloc(nu, sizeof(int));
    s->bcount = calloc(nu, sizeof(int));
    s->taken = calloc(np, 1);
    s->left = calloc(nu, sizeof(int));
    s->ok = calloc(nu, sizeof(int));
    if (!s->pc || !s->blob || !s->first || !s->count || !s->bfirst || !s->bcount || !s->taken || !s->left || !s->ok)
        goto bad;
    memcpy(s->pc, pieces, (size_t)npieces * sizeof(*s->pc));
    memcpy(s->blob, blobs, (size_t)nblobs * sizeof(*s->blob));
    /* pieces and blobs come grouped by unit, units in order */
    for (int i = 0; i < npieces; ++i) {
        int u = pieces[i].unit;
        if (u < 0 || u >= nunits || (i > 0 && u < pieces[i - 1].unit)) goto bad;
        if (s->count[u]++ == 0) s->first[u] = i;
    }
    for (int i = 0; i < nblobs; ++i) {
        int u = blobs[i].unit;
        if (u < 0 || u >= nunits || (i > 0 && u < blobs[i - 1].unit)) goto bad;
        if (s->bcount[u]++ == 0) s->bfirst[u] = i;
    }
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->lcv, NULL);
    pthread_cond_init(&s->ccv, NULL);
    s->waiting = -1;
    s->prog = -1;
    s->want = NEVER;
    return s;
bad:
    free_all(s);
    return NULL;
}

void inferd_stream_free(inferd_stream* s) {
    if (!s) return;
    if (s->idle_set) inferd_pool_clear_idle_work(&s->idle);
    pthread_mutex_lock(&s->mu);
    s->closed = 1;
    s->active = 0;
    pthread_cond_broadcast(&s->lcv);
    pthread_mutex_unlock(&s->mu);
    for (int i = 0; i < s->nthreads; ++i) pthread_join(s->th[i], NULL);
    pthread_cond_destroy(&s->lcv);
    pthread_cond_destroy(&s->ccv);
    pthread_mutex_destroy(&s->mu);
    free_all(s);
}

int inferd_stream_begin(inferd_stream* s, int nloaders) {
    if (nloaders > MAX_LOADERS) nloaders = MAX_LOADERS;
    if (nloaders < 0) nloaders = 0;
    pthread_mutex_lock(&s->mu);
    while (s->busy) pthread_cond_wait(&s->ccv, &s->mu); /* a loader of the last run still leaving its loop */
    memset(s->taken, 0, (size_t)s->n);
    for (int u = 0; u < s->nunits; ++u) {
        s->left[u] = s->count[u];
        __atomic_store_n(&s->ok[u], s->count[u] == 0, __ATOMIC_RELAXED);
    }
    s->cur = 0;
    __atomic_store_n(&s->prog, -1, __ATOMIC_SEQ_CST);
    __atomic_store_n(&s->want, NEVER, __ATOMIC_SEQ_CST);
    s->waiting = -1;
    s->err = s->err_errno = 0;
    s->err_piece = s->err_blob = -1;
    s->err_got = s->err_need = 0;
    s->inflight = 0;
    s->read_s = s->verify_s = 0.0;
    s->reads = s->bytes = s->idle_reads = 0;
    s->active = 1;
    int started = 0;
    while (s->nthreads < nloaders) {
        loader_arg* a = malloc(sizeof(*a));
        if (!a) break;
        a->s = s;
        a->index = s->nthreads;
        if (pthread_create(&s->th[s->nthreads], NULL, loader_main, a) != 0) {
            free(a);
            break;
        }
        s->nthreads++;
        started++;
    }
    s->want_threads = nloaders < s->nthreads ? nloaders : s->nthreads;
    s->gen++;
    pthread_cond_broadcast(&s->lcv);
    int got = s->want_threads;
    pthread_mutex_unlock(&s->mu);
    /* after the run's state is set: a worker may read from here on (another model's run may hold the slot:
       then only the loaders and the compute thread read) */
    if (s->pool_idle && s->n) s->idle_set = inferd_pool_set_idle_work(&s->idle);
    (void)started;
    return got;
}

void inferd_stream_done(inferd_stream* s, int step) {
    __atomic_store_n(&s->prog, step, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&s->want, __ATOMIC_SEQ_CST) <= step) {
        pthread_mutex_lock(&s->mu);
        __atomic_store_n(&s->want, NEVER, __ATOMIC_SEQ_CST);
        pthread_cond_broadcast(&s->lcv);
        pthread_mutex_unlock(&s->mu);
    }
}

int inferd_stream_wait(inferd_stream* s, int unit, int steal) {
    if (unit < 0 || unit >= s->nunits) return INFERD_STREAM_ARG;
    if (__atomic_load_n(&s->ok[unit], __ATOMIC_ACQUIRE)) return 0;
    if (steal) { /* every dependency of this layer's pieces has run: read what nobody has started */
        int a = s->first[unit], b = a + s->count[unit];
        int run[JOIN_MAX];
        for (int i = a; i < b;) {
            int n = 0;
            pthread_mutex_lock(&s->mu);
            while (i < b && s->taken[i]) ++i;
            if (i < b && !s->err) {
                s->taken[i] = 1;
                run[0] = i;
                n = 1;
                extend(s, run, &n, i + 1, b, __atomic_load_n(&s->prog, __ATOMIC_SEQ_CST), s->run_max);
                i += n;
            }
            pthread_mutex_unlock(&s->mu);
            if (!n) break;
            read_run(s, run, n);
        }
    }
    pthread_mutex_lock(&s->mu);
    s->waiting = unit;
    while (!__atomic_load_n(&s->ok[unit], __ATOMIC_ACQUIRE) && !s->err) pthread_cond_wait(&s->ccv, &s->mu);
    s->waiting = -1;
    int r = __atomic_load_n(&s->ok[unit], __ATOMIC_ACQUIRE) ? 0 : s->err;
    pthread_mutex_unlock(&s->mu);
    return r;
}

void inferd_stream_end(inferd_stream* s, int abort) {
    if (s->idle_set) { /* no worker reads for this run once this returns (not under mu: a worker inside takes it) */
        inferd_pool_clear_idle_work(&s->idle);
        s->idle_set = 0;
    }
    pthread_mutex_lock(&s->mu);
    s->active = 0;
    if (abort) { /* a loader may be reading into the arena: it is not the caller's again before they stop */
        if (!s->err) s->err = INFERD_STREAM_ABORTED;
        pthread_cond_broadcast(&s->lcv);
        while (s->busy) pthread_cond_wait(&s->ccv, &s->mu);
    }
    pthread_mutex_unlock(&s->mu);
}

void inferd_stream_stats(inferd_stream* s, double* d, long long* i) {
    pthread_mutex_lock(&s->mu);
    d[0] = s->read_s;
    d[1] = s->verify_s;
    i[0] = s->reads;
    i[1] = s->bytes;
    i[2] = s->err;
    i[3] = s->err_errno;
    i[4] = s->err_piece;
    i[5] = s->err_blob;
    i[6] = s->err_got;
    i[7] = s->err_need;
    i[8] = s->busy;
    i[9] = s->nthreads;
    i[10] = s->idle_reads;
    pthread_mutex_unlock(&s->mu);
}
