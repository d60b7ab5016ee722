/* Strided copies: a Transpose (or any view numpy would copy element by element) into a contiguous output.
 *
 * Why native: numpy assigns a permuted view one element at a time through its generic strided loop (vit_tiny's
 * K^T, 3x197x64 floats: 26 us, 0.7 ns an element; the q/k/v split's 5-D permutation with 64-float rows: 36 us),
 * on one core. Here adjacent axes that are contiguous in the source merge first; then rows whose source is
 * contiguous are memcpy'd, and a swap of the last two axes (the source's unit stride one axis up) goes in
 * 16 x 16 tiles so both sides touch whole cache lines; anything else is an element loop. Rows are split over
 * the pool.
 */
#include <stddef.h>
#include <string.h>

#include "inferd_internal.h"
#include "inferd_native.h"

#define SC_MAXD 8
#define SC_TILE 16

typedef struct {
    char* dst;
    const char* src;
    int nd, item, mode; /* mode 0: contiguous rows, 1: last-two-axes tiles, 2: element loop */
    long long shape[SC_MAXD], st[SC_MAXD]; /* after merging; st in bytes */
    long long rows, inner, groups_per_outer, chunks;
} sc_job;

/* source byte offset of the first element of row r (r over all axes but the last), with its index per axis */
static long long sc_row_offset(const sc_job* j, long long r, long long* idx)
{
    long long off = 0;
    for (int d = j->nd - 2; d >= 0; --d) {
        const long long n = j->shape[d];
        idx[d] = r % n;
        off += idx[d] * j->st[d];
        r /= n;
    }
    return off;
}

/* the next row's offset: an odometer over the axes but the last */
static long long sc_next(const sc_job* j, long long off, long long* idx)
{
    for (int d = j->nd - 2; d >= 0; --d) {
        off += j->st[d];
        if (++idx[d] < j->shape[d]) return off;
        off -= j->shape[d] * j->st[d];
        idx[d] = 0;
    }
    return off;
}

#define SC_COPY_ELEM(T)                                                     \
    do {                                                                    \
        T* restrict o = (T*)d;                                              \
        for (long long b = 0; b < inner; ++b) {                             \
            T v;                                                            \
            memcpy(&v, s + b * is, sizeof v);                               \
            o[b] = v;                                                       \
        }                                                                   \
    } while (0)

static void sc_rows(const sc_job* j, long long r0, long long r1)
{
    const long long inner = j->inner, is = j->st[j->nd - 1];
    const size_t rowb = (size_t)inner * (size_t)j->item;
    long long idx[SC_MAXD];
    long long off = r0 < r1 ? sc_row_offset(j, r0, idx) : 0;
    for (long long r = r0; r < r1; ++r, off = sc_next(j, off, idx)) {
        const char* restrict s = j->src + off;
        char* restrict d = j->dst + (size_t)r * rowb;
        if (j->mode == 0) {
            memcpy(d, s, rowb);
        } else if (j->item == 4) {
            SC_COPY_ELEM(unsigned);
        } else if (j->item == 8) {
            SC_COPY_ELEM(unsigned long long);
        } else if (j->item == 2) {
            SC_COPY_ELEM(unsigned short);
        } else {
            for (long long b = 0; b < inner; ++b) memcpy(d + b * j->item, s + b * is, (size_t)j->item);
        }
    }
}

/* rows a0..a1 (< SC_TILE of them, one outer slice) of the swapped pair: dst[a][b] = src[a * item + b * is] */
#define SC_TILE_LOOP(T)                                                                 \
    do {                                                                                \
        for (long long b0 = 0; b0 < inner; b0 += SC_TILE) {                             \
            const long long b1 = b0 + SC_TILE < inner ? b0 + SC_TILE : inner;           \
            for (long long a = 0; a < na; ++a) {                                        \
                T* restrict o = (T*)(d + (size_t)a * rowb);                             \
                const char* sa = s + a * (long long)sizeof(T);                          \
                for (long long b = b0; b < b1; ++b) {                                   \
                    T v;                                                                \
                    memcpy(&v, sa + b * is, sizeof v);                                  \
                    o[b] = v;                                                           \
                }                                                                       \
            }                                                                           \
        }                                                                               \
    } while (0)

static void sc_tiles(const sc_job* j, long long g0, long long g1)
{
    const long long inner = j->inner, is = j->st[j->nd - 1], A = j->shape[j->nd - 2];
    const size_t rowb = (size_t)inner * (size_t)j->item;
    for (long long g = g0; g < g1; ++g) {
        const long long outer = g / j->groups_per_outer, a0 = (g % j->groups_per_outer) * SC_TILE;
        const long long na = A - a0 < SC_TILE ? A - a0 : SC_TILE;
        const long long r = outer * A + a0;
        long long idx[SC_MAXD];
        const char* s = j->src + sc_row_offset(j, r, idx);
        char* d = j->dst + (size_t)r * rowb;
        if (j->item == 4)
            SC_TILE_LOOP(unsigned);
        else if (j->item == 8)
            SC_TILE_LOOP(unsigned long long);
        else if (j->item == 2)
            SC_TILE_LOOP(unsigned short);
        else
            SC_TILE_LOOP(unsigned char);
    }
}

static void sc_task(void* p, long long t)
{
    const sc_job* j = (const sc_job*)p;
    const long long units = j->mode == 1 ? j->rows / j->shape[j->nd - 2] * j->groups_per_outer : j->rows;
    const long long u0 = units * t / j->chunks, u1 = units * (t + 1) / j->chunks;
    if (j->mode == 1)
        sc_tiles(j, u0, u1);
    else
        sc_rows(j, u0, u1);
}

int inferd_strided_copy(void* dst, const void* src, int ndim, const long long* shape, const long long* strides,
                        int itemsize)
{
    if (ndim < 0 || itemsize <= 0) return -1;
    sc_job j;
    memset(&j, 0, sizeof j);
    j.dst = (char*)dst, j.src = (const char*)src, j.item = itemsize;
    long long total = 1;
    int nd = 0;
    for (int d = 0; d < ndim; ++d) {
        if (shape[d] <= 0) return shape[d] == 0 ? 0 : -1;
        total *= shape[d];
        if (shape[d] == 1) continue; /* its stride never matters */
        if (nd > 0 && j.st[nd - 1] == strides[d] * shape[d]) { /* contiguous with the axis before: merge */
            j.shape[nd - 1] *= shape[d];
            j.st[nd - 1] = strides[d];
            continue;
        }
        if (nd == SC_MAXD) return -1;
        j.shape[nd] = shape[d], j.st[nd] = strides[d], ++nd;
    }
    if (nd == 0) { /* one element */
        memcpy(dst, src, (size_t)itemsize);
        return 0;
    }
    j.nd = nd;
    j.inner = j.shape[nd - 1];
    j.rows = total / j.inner;
    const int unit_inner = j.st[nd - 1] == itemsize;
    if (unit_inner) {
        j.mode = 0;
    } else if (nd >= 2 && j.st[nd - 2] == itemsize &&
               (itemsize == 1 || itemsize == 2 || itemsize == 4 || itemsize == 8)) {
        j.mode = 1;
        j.groups_per_outer = (j.shape[nd - 2] + SC_TILE - 1) / SC_TILE;
    } else {
        j.mode = 2;
    }
    const long long units = j.mode == 1 ? j.rows / j.shape[nd - 2] * j.groups_per_outer : j.rows;
    /* a copy moves bytes, not FLOPs: weigh it as a few operations a byte for the split */
    j.chunks = inferd_pool_chunks(units, (double)total * itemsize);
    if (j.chunks < 1) j.chunks = 1;
    inferd_parallel(sc_task, &j, j.chunks, 0);
    return 0;
}
