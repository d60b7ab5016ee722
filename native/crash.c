/* A native backtrace when the process dies of a fatal signal (inferd_install_crash_report).
 *
 * Why: Python's faulthandler prints each thread's Python frames, and a crash inside a kernel shows there only as
 * the Python line that called it: a rare segmentation fault in the test suite (a conv's first run beside another
 * model's warm switch) showed two threads faulting at once, one of them with no Python frame at all (a pool
 * worker), and nothing said where. This handler writes, before the handler it replaced runs (faulthandler's, or
 * the default action), which signal, the faulting address, the thread and its native frames (module + offset;
 * ``addr2line -e <module> <offset>`` or the nearest exported symbol names the function).
 *
 * Only async-signal-safe calls on the way (write, and backtrace_symbols_fd, which does not allocate), except
 * backtrace itself, whose first call may load libgcc: it is called once at install for that reason. A thread
 * that faults while another is writing its report waits for it, so reports do not interleave.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "inferd_native.h"

#if defined(__GLIBC__)
#include <execinfo.h>
#define HAVE_BACKTRACE 1
#else
#define HAVE_BACKTRACE 0
#endif

static const int SIGNALS[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
#define NSIG_WATCHED ((int)(sizeof SIGNALS / sizeof SIGNALS[0]))
static struct sigaction PREV[NSIG_WATCHED];
static int INSTALLED = 0;
static int TAKEN = 0;      /* signals the install took */
static int REPORTING = 0; /* a report is being written (by any thread) */

/* where the report goes: stderr unless told (inferd_crash_report_fd). The test suite's fd 2 is a capture file
   during each test, lost with a worker that dies: the report goes where pytest's faulthandler writes instead */
static int OUT_FD = 2;

static void put(const char* s) { (void)!write(OUT_FD, s, strlen(s)); }

int inferd_crash_report_fd(int fd)
{
    if (fd < 0) return -1;
    OUT_FD = fd;
    return 0;
}

static void put_num(unsigned long long v, int base)
{
    char buf[32];
    int i = (int)sizeof buf;
    buf[--i] = '\0';
    do {
        const int d = (int)(v % (unsigned)base);
        buf[--i] = (char)(d < 10 ? '0' + d : 'a' + d - 10);
        v /= (unsigned)base;
    } while (v && i > 0);
    if (base == 16 && i >= 2) {
        buf[--i] = 'x';
        buf[--i] = '0';
    }
    put(buf + i);
}

static int watched(int sig)
{
    for (int i = 0; i < NSIG_WATCHED; ++i)
        if (SIGNALS[i] == sig) return i;
    return -1;
}

static void report(int sig, siginfo_t* si, void* uc)
{
    /* one report at a time: a second faulting thread waits (briefly: the first one's process is about to die) */
    while (__atomic_exchange_n(&REPORTING, 1, __ATOMIC_ACQUIRE)) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    put("\ninferd: fatal signal ");
    put_num((unsigned)sig, 10);
    put(" in thread ");
    put_num((unsigned long long)syscall(SYS_gettid), 10);
    if (si != NULL && si->si_code <= 0) {
        put(" (sent by kill or raise: a handler before this one may have re-raised it)");
    } else if (si != NULL && (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL)) {
        put(" at address ");
        put_num((unsigned long long)(unsigned long)si->si_addr, 16);
    }
    put("; native frames (module(symbol+offset)):\n");
#if HAVE_BACKTRACE
    void* frames[64];
    const int n = backtrace(frames, 64);
    backtrace_symbols_fd(frames, n, OUT_FD);
#else
    put("  (no backtrace on this C library)\n");
#endif
    __atomic_store_n(&REPORTING, 0, __ATOMIC_RELEASE);
    /* then what was there before: faulthandler dumps the Python frames and re-raises; the default action ends
       the process */
    const int k = watched(sig);
    struct sigaction* prev = k >= 0 ? &PREV[k] : NULL;
    if (prev != NULL && (prev->sa_flags & SA_SIGINFO) && prev->sa_sigaction != NULL) {
        sigaction(sig, prev, NULL);
        prev->sa_sigaction(sig, si, uc);
        return;
    }
    if (prev != NULL && prev->sa_handler != SIG_DFL && prev->sa_handler != SIG_IGN) {
        sigaction(sig, prev, NULL);
        prev->sa_handler(sig);
        return;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

int inferd_install_crash_report(void)
{
    if (__atomic_exchange_n(&INSTALLED, 1, __ATOMIC_ACQ_REL)) return __atomic_load_n(&TAKEN, __ATOMIC_ACQUIRE);
#if HAVE_BACKTRACE
    void* warm[4];
    (void)backtrace(warm, 4); /* loads libgcc now rather than inside a signal handler */
#endif
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = report;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    int ok = 0;
    for (int i = 0; i < NSIG_WATCHED; ++i)
        if (sigaction(SIGNALS[i], &sa, &PREV[i]) == 0) ++ok;
    __atomic_store_n(&TAKEN, ok, __ATOMIC_RELEASE);
    return ok;
}
