/* The drills' injections, in C so that an injected stall is the jitter under test and not
 * the Python interpreter around it: each runs in the feeding thread until a CLOCK_MONOTONIC
 * deadline and checks the clock between units of work (one page, one spin round).
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <sys/resource.h>
#include <time.h>

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Touch one byte of each `stride`-byte unit of [base, base + len) until the deadline: write
 * (first touch of fresh anonymous pages: minor faults) or read (pages out in swap or not in
 * the page cache: swap-ins, file-backed major faults). Returns the bytes covered. */
uint64_t gj_touch_until(volatile char *base, uint64_t len, uint64_t stride, int write,
                        uint64_t deadline_ns)
{
    uint64_t off = 0;
    char sink = 0;
    for (; off < len && now_ns() < deadline_ns; off += stride) {
        if (write)
            base[off] = 1;
        else
            sink += base[off];
    }
    (void)sink;
    return off < len ? off : len;
}

static long involuntary_switches(void)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_nivcsw;
}

/* CPU-bound work until the deadline: only the clock is read. Returns the time the thread
 * lost while it spun without being switched out: the sum of the steps between two
 * consecutive clock reads longer than threshold_ns (interrupts, and in a VM the
 * hypervisor). Steps in which the thread was preempted (its involuntary context switches
 * rose) go to *preempted_ns instead. */
uint64_t gj_spin_until(uint64_t deadline_ns, uint64_t threshold_ns, uint64_t *preempted_ns)
{
    long switches = involuntary_switches();
    uint64_t prev = now_ns(), lost = 0, preempted = 0;
    while (prev < deadline_ns) {
        uint64_t t = now_ns();
        if (t - prev > threshold_ns) {
            long n = involuntary_switches();
            if (n != switches)
                preempted += t - prev;
            else
                lost += t - prev;
            switches = n;
            t = now_ns(); /* the time getrusage took is not a step */
        }
        prev = t;
    }
    *preempted_ns = preempted;
    return lost;
}

/* Sleep `sleep_ns` at a time until the deadline, so that the thread leaves its CPU idle and
 * is woken onto it again and again. Returns the summed lateness of the wake-ups (how much
 * later than asked each sleep returned), *wakes their number. */
uint64_t gj_sleep_until(uint64_t deadline_ns, uint64_t sleep_ns, uint64_t *wakes)
{
    uint64_t late = 0, n = 0;
    for (uint64_t t = now_ns(); t < deadline_ns; n++) {
        uint64_t due = t + sleep_ns;
        struct timespec ts = {.tv_sec = due / 1000000000ull, .tv_nsec = due % 1000000000ull};
        clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
        t = now_ns();
        late += t > due ? t - due : 0;
    }
    *wakes = n;
    return late;
}
