"""The streaming loaders in C (native/stream.c), driven as the streaming runtime drives them, without Python:
random layouts of pieces (dependencies, gaps in the store, layers in several pieces and blobs), one to three
loaders with and without the compute thread stealing. Every layer's bytes are the file's once its wait returns, no
piece is written before the step it waits for has run, and a damaged blob, a file cut short, a failing read and
an aborted run end as the runtime expects (the right error, the loaders out of the arena before ``end`` returns,
the next run correct). Built for the host (with sanitizers, and with ThreadSanitizer where the compiler has it)
and for aarch64 under qemu: its memory model is weaker than x86's, where a missing barrier goes unnoticed."""
from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

import pytest

from native_harness import AARCH64_CC, AARCH64_FLAGS, QEMU, build_and_run, needs_aarch64, with_sanitizers

HARNESS = textwrap.dedent(r"""
    #define _GNU_SOURCE
    #include <errno.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <time.h>
    #include <unistd.h>
    #include "inferd_native.h"

    static int failures = 0;
    #define CHECK(c, ...) do { if (!(c)) { ++failures; printf("FAIL: " __VA_ARGS__); printf("\n"); } } while (0)

    enum { NSTEPS = 48, MAXP = 1024, MAXU = NSTEPS, MAXB = 2 * NSTEPS, SENT = 0xA5 };

    static unsigned rng = 12345u;
    static unsigned rnd(void) { rng = rng * 1103515245u + 12345u; return rng >> 8; }
    static void sleep_us(int us) { struct timespec ts = {0, us * 1000L}; nanosleep(&ts, NULL); }

    static unsigned long long fnv(const void* p, unsigned long n) {
        const unsigned char* b = p;
        unsigned long long h = 1469598103934665603ull;
        for (unsigned long i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
        return h;
    }

    typedef struct {
        int np, nu, nb;
        inferd_stream_piece pc[MAXP];
        inferd_stream_blob bl[MAXB];
        int step_of[MAXU];         /* the step that runs unit u */
        long long ufile[MAXU], uarena[MAXU], usize[MAXU];
        long long file_size, arena_size;
    } layout;

    static layout L;
    static unsigned char* data;   /* the file's bytes */
    static unsigned char* arena;
    static char gapbuf[4096] __attribute__((aligned(64)));

    /* A random model: streamed layers at random steps, each cut into pieces of 64 B..2.5 KiB whose dependencies
       grow within the layer, one or two blobs a layer, gaps between layers in the file (some joinable, some
       not); the last piece's span runs past the end of the file (block padding). */
    static void make_layout(unsigned seed) {
        rng = seed;
        memset(&L, 0, sizeof(L));
        long long fo = 0, ao = 0;
        for (int s = 2; s < NSTEPS; ++s) {
            if (rnd() % 3 == 0) continue;
            int u = L.nu++;
            L.step_of[u] = s;
            fo += (rnd() % 4 == 0) ? 64 * (long long)(rnd() % 80) : 0; /* up to 5 KiB: beyond the join gap */
            long long total = 64 * (long long)(1 + rnd() % 200);
            L.ufile[u] = fo;
            L.uarena[u] = ao;
            L.usize[u] = total;
            int dep = -1 + (int)(rnd() % (unsigned)s);
            long long done = 0, split = 64 * (long long)(rnd() % (unsigned)(total / 64));
            int second = 0;
            while (done < total) {
                long long sz = 64 * (long long)(1 + rnd() % 40);
                if (sz > total - done) sz = total - done;
                if (L.np == MAXP) { sz = total - done; }
                inferd_stream_piece* p = &L.pc[L.np++];
                p->file_off = fo + done;
                p->span = p->need = sz;
                p->dst = (unsigned long long)(ao + done); /* an offset until the arena exists */
                if (rnd() % 3 == 0 && dep < s - 1) dep += 1 + (int)(rnd() % (unsigned)(s - 1 - dep));
                p->dep = dep;
                p->unit = u;
                done += sz;
                if (split > 0 && done >= split && !second) second = 1, split = done;
            }
            if (second && split < total) {
                L.bl[L.nb++] = (inferd_stream_blob){(unsigned long long)ao, split, 0, u, 0};
                L.bl[L.nb++] = (inferd_stream_blob){(unsigned long long)(ao + split), total - split, 0, u, 0};
            } else {
                L.bl[L.nb++] = (inferd_stream_blob){(unsigned long long)ao, total, 0, u, 0};
            }
            fo += total;
            ao += total + 64;
        }
        L.pc[L.np - 1].span += 64; /* block padding past the file's end */
        L.file_size = fo;
        L.arena_size = ao + 128;
        free(data);
        free(arena);
        data = malloc((size_t)L.file_size);
        arena = aligned_alloc(64, (size_t)L.arena_size);
        for (long long i = 0; i < L.file_size; ++i) data[i] = (unsigned char)rnd();
        for (int i = 0; i < L.np; ++i) L.pc[i].dst += (unsigned long long)(size_t)arena;
        for (int b = 0; b < L.nb; ++b) {
            long long off = (long long)L.bl[b].addr;
            int u = L.bl[b].unit;
            L.bl[b].sum = fnv(data + L.ufile[u] + (off - L.uarena[u]), (unsigned long)L.bl[b].size);
            L.bl[b].addr += (unsigned long long)(size_t)arena;
        }
    }

    static int make_file(long long size) {
        char path[] = "/tmp/inferd-stream-test-XXXXXX";
        int fd = mkstemp(path);
        if (fd < 0) { perror("mkstemp"); exit(2); }
        unlink(path);
        if (write(fd, data, (size_t)size) != size) { perror("write"); exit(2); }
        return fd;
    }

    static int early(int step) { /* pieces written before the step they wait for ran */
        int bad = 0;
        for (int i = 0; i < L.np; ++i) {
            if (L.pc[i].dep < step) continue;
            const unsigned char* d = (const unsigned char*)(size_t)L.pc[i].dst;
            for (int k = 0; k < 16; ++k) if (d[k] != SENT) { ++bad; break; }
        }
        return bad;
    }

    static volatile double sink[8];
    static void spin_task(void* ctx, long long t) {
        (void)ctx;
        double a = (double)t;
        for (int i = 0; i < 2000; ++i) a = a * 0.999 + 1.0;
        sink[t] = a;
    }

    /* One run as stream.py drives it; the first error returned by a wait (0: none); *at: its unit. */
    static int run(inferd_stream* s, int nloaders, int steal, int check, int* at) {
        memset(arena, SENT, (size_t)L.arena_size);
        int got = inferd_stream_begin(s, nloaders);
        CHECK(got == nloaders, "begin(%d) started %d loaders", nloaders, got);
        int u = 0, rc = 0;
        *at = -1;
        for (int step = 0; step < NSTEPS; ++step) {
            if (u < L.nu && L.step_of[u] == step) {
                rc = inferd_stream_wait(s, u, steal);
                if (rc) { *at = u; break; }
                if (check)
                    CHECK(memcmp(arena + L.uarena[u], data + L.ufile[u], (size_t)L.usize[u]) == 0,
                          "unit %d: not the file's bytes after its wait (loaders %d steal %d)", u, nloaders, steal);
                ++u;
            }
            if (check) CHECK(early(step) == 0, "step %d: %d pieces written before their dependency ran (loaders %d "
                             "steal %d)", step, early(step), nloaders, steal);
            if (rnd() % 2) sleep_us((int)(rnd() % 300)); /* a layer's compute: Python between the layers */
            inferd_parallel(spin_task, NULL, 8, 0);       /* and its native part, on the pool */
            inferd_stream_done(s, step);
        }
        inferd_stream_end(s, rc != 0);
        return rc;
    }

    static void stats(inferd_stream* s, double* d, long long* i) { inferd_stream_stats(s, d, i); }

    int main(void) {
        double d[2];
        long long st[11];
        inferd_pool_set_threads(2);
        long long pool_reads = 0;
        for (unsigned seed = 1; seed <= 3; ++seed) {
            make_layout(seed * 7919u);
            int fd = make_file(L.file_size);
            for (int variant = 0; variant < 4; ++variant) {
                int pool = variant >= 2; /* the pool's spinning workers read too */
                inferd_stream* s = inferd_stream_new(fd, -1, 0, 0, pool, L.pc, L.np, L.nu, L.bl, L.nb,
                                                     variant % 2 ? fnv : NULL, gapbuf, sizeof(gapbuf), 16384, 256);
                CHECK(s != NULL, "new failed");
                if (!s) continue;
                static const int cfg[][2] = {{0, 1}, {1, 0}, {1, 1}, {3, 0}, {3, 1}, {2, 1}};
                for (int c = 0; c < 6; ++c)
                    for (int r = 0; r < 2; ++r) {
                        int at;
                        int rc = run(s, cfg[c][0], cfg[c][1], 1, &at);
                        CHECK(rc == 0, "seed %u: run failed with %d at unit %d", seed, rc, at);
                        stats(s, d, st);
                        long long want = 0;
                        for (int u = 0; u < L.nu; ++u) want += L.usize[u];
                        CHECK(st[0] > 0 && st[1] >= want, "%lld reads of %lld bytes for %lld", st[0], st[1], want);
                        CHECK(st[0] < L.np || L.np < 4, "no piece joined: %lld reads of %d pieces", st[0], L.np);
                        CHECK(st[2] == 0, "error %lld after a clean run", st[2]);
                        CHECK(st[9] >= cfg[c][0], "%lld loader threads", st[9]);
                        CHECK(pool || st[10] == 0, "%lld reads by pool workers without pool_idle", st[10]);
                        pool_reads += st[10];
                    }
                /* aborted half-way: the loaders leave the arena before end returns; the next run is whole */
                inferd_stream_begin(s, 3);
                for (int step = 0; step < L.step_of[0]; ++step) inferd_stream_done(s, step);
                CHECK(inferd_stream_wait(s, 0, 0) == 0, "unit 0 of the aborted run");
                for (int step = L.step_of[0]; step < NSTEPS / 2; ++step) inferd_stream_done(s, step);
                inferd_stream_end(s, 1); /* while the loaders read ahead */
                stats(s, d, st);
                CHECK(st[8] == 0, "%lld loaders still inside the run after end(abort)", st[8]);
                CHECK(st[2] == INFERD_STREAM_ABORTED, "error %lld after an abort", st[2]);
                int at;
                CHECK(run(s, 3, 1, 1, &at) == 0, "the run after an abort failed");
                inferd_stream_free(s);
            }
            /* a damaged blob: reported as a checksum error, never as a layer that is in */
            int bad = L.nb / 2;
            L.bl[bad].sum ^= 1;
            for (int c = 0; c < 3; ++c) {
                inferd_stream* s = inferd_stream_new(fd, -1, 0, 0, c != 1, L.pc, L.np, L.nu, L.bl, L.nb, fnv, gapbuf,
                                                     sizeof(gapbuf), 16384, 256);
                int at;
                int rc = run(s, c, c != 1, 0, &at);
                stats(s, d, st);
                CHECK(rc == INFERD_STREAM_CHECKSUM && at <= L.bl[bad].unit && st[5] == bad && st[8] == 0,
                      "damaged blob %d (unit %d): rc %d at unit %d, blob %lld, busy %lld", bad, L.bl[bad].unit, rc,
                      at, st[5], st[8]);
                inferd_stream_free(s);
            }
            L.bl[bad].sum ^= 1;
            /* a read that fails: the errno comes back */
            {
                inferd_stream* s = inferd_stream_new(-1, -1, 0, 0, 1, L.pc, L.np, L.nu, L.bl, L.nb, fnv, gapbuf,
                                                     sizeof(gapbuf), 16384, 256);
                int at;
                int rc = run(s, 2, 1, 0, &at);
                stats(s, d, st);
                CHECK(rc == INFERD_STREAM_IO && st[3] == EBADF && at == 0, "bad fd: rc %d errno %lld at %d", rc,
                      st[3], at);
                inferd_stream_free(s);
            }
            close(fd);
            /* the file cut inside a layer: a short read there, every layer before it in */
            int cut_u = L.nu / 2;
            int cfd = make_file(L.ufile[cut_u] + L.usize[cut_u] / 2);
            for (int c = 0; c < 3; ++c) {
                inferd_stream* s = inferd_stream_new(cfd, -1, 0, 0, 1, L.pc, L.np, L.nu, L.bl, L.nb, fnv, gapbuf,
                                                     sizeof(gapbuf), 16384, 256);
                int at;
                int rc = run(s, c, c != 1, 0, &at);
                stats(s, d, st);
                CHECK(rc == INFERD_STREAM_SHORT && at <= cut_u && st[6] < st[7] && st[8] == 0,
                      "cut in unit %d: rc %d at unit %d, got %lld need %lld", cut_u, rc, at, st[6], st[7]);
                inferd_stream_free(s);
            }
            close(cfd);
        }
        CHECK(pool_reads > 0, "the pool's workers read nothing between jobs");
        /* bad arguments: units out of order */
        make_layout(99u);
        if (L.np > 1) {
            L.pc[0].unit = L.nu - 1;
            CHECK(inferd_stream_new(0, -1, 0, 0, 0, L.pc, L.np, L.nu, L.bl, L.nb, NULL, gapbuf, sizeof(gapbuf), 16384,
                                    256) == NULL, "pieces out of unit order accepted");
        }
        printf("ok (%d failures)\n", failures);
        return failures != 0;
    }
""")


def _write(tmp_path: Path) -> Path:
    src = tmp_path / "stream_test.c"
    src.write_text(HARNESS)
    return src


@pytest.mark.parametrize("sanitize", [False, True], ids=["plain", "sanitizers"])
def test_stream_loaders_read_each_layer_once_its_dependencies_ran(tmp_path: Path, sanitize: bool) -> None:
    src = _write(tmp_path)

    def build(flags: list[str]) -> None:
        build_and_run(src, ["stream.c", "pool.c"], "cc", flags, tmp_path, [], timeout=180)

    if sanitize:
        with_sanitizers(build)
    else:
        build([])


def test_stream_loaders_have_no_data_race_under_threadsanitizer(tmp_path: Path) -> None:
    """ThreadSanitizer sees every access of the loaders and the compute thread: a piece of state touched by two
    threads without a lock or an atomic between them fails the run."""
    src = _write(tmp_path)
    try:
        build_and_run(src, ["stream.c", "pool.c"], "cc", ["-fsanitize=thread", "-g"], tmp_path, [], opt=("-O1",),
                      timeout=300)
    except subprocess.CalledProcessError as e:  # the build, not the run: no TSan runtime for this compiler
        pytest.skip(f"no ThreadSanitizer here: {e.stderr[-300:]!r}")


@needs_aarch64
def test_stream_loaders_on_aarch64_under_qemu(tmp_path: Path) -> None:
    src = _write(tmp_path)
    build_and_run(src, ["stream.c", "pool.c"], AARCH64_CC, AARCH64_FLAGS, tmp_path, QEMU, timeout=300)
