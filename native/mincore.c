/* Which pages of a file the page cache holds, counted by mincore over one shared mapping.
 *
 * Why native: a cold load asks how much of its weights store is cached (read it with O_DIRECT or through the
 * cache) on the head read's I/O worker while the main thread parses the package. Through ctypes that was an mmap,
 * then per window a mincore call, a ctypes array type and a numpy count (32 windows): 0.3-0.5 ms of Python on the
 * 2-core VM, each return taking the GIL back from the main thread's parse (squeezenet1_1's open 1-2 ms longer
 * with it under way). Here it is one call, without the GIL (cffi releases it).
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "inferd_native.h"

long long inferd_resident_pages(int fd, long long size, const long long* offs, const long long* lens, int nwin,
                                long long* looked)
{
    long page = sysconf(_SC_PAGESIZE);
    long long resident = 0, total = 0, most = 0;
    *looked = 0;
    if (fd < 0 || size <= 0 || nwin <= 0 || page <= 0)
        return 0;
    for (int i = 0; i < nwin; ++i) {
        if (offs[i] < 0 || lens[i] < 0 || offs[i] % page || offs[i] + lens[i] > size)
            return -1;
        long long n = (lens[i] + page - 1) / page;
        if (n > most)
            most = n;
    }
    unsigned char* vec = (unsigned char*)malloc(most > 0 ? (size_t)most : 1);
    if (!vec)
        return -1;
    void* addr = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, fd, 0);
    if (addr == MAP_FAILED) {
        free(vec);
        return -1;
    }
    for (int i = 0; i < nwin && resident >= 0; ++i) {
        long long n = (lens[i] + page - 1) / page;
        if (n == 0)
            continue;
        if (mincore((char*)addr + offs[i], (size_t)lens[i], vec) != 0) {
            resident = -1;
            break;
        }
        for (long long j = 0; j < n; ++j)
            resident += vec[j] & 1;
        total += n;
    }
    munmap(addr, (size_t)size);
    free(vec);
    if (resident >= 0)
        *looked = total;
    return resident;
}
