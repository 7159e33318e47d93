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

/* The thread's context switches: involuntary ones (preemptions), or all of them. */
static long thread_switches(int voluntary_too)
{
    struct rusage ru;
    getrusage(RUSAGE_THREAD, &ru);
    return ru.ru_nivcsw + (voluntary_too ? ru.ru_nvcsw : 0);
}

static uint64_t thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* A minor-fault storm: write one byte of each `stride`-byte unit of [base, base + len) until
 * the deadline, as gj_touch_until. The faults probe times a storm by stretches of
 * `per_stretch` faults between its clock reads: a stretch that took longer than
 * per_stretch * slow_step_ns (its storm_gap), or in which the thread was switched out, is
 * counted, not timed (docs/probes.md). *untimed_ns sums what the thread ran in such
 * stretches, as the probe's rule leaves it out (its time off CPU is the run queue's). In a
 * VM the host's own faults behind the guest's make slow stretches: at times steps of
 * 150-650 us. */
uint64_t gj_storm_until(volatile char *base, uint64_t len, uint64_t stride, uint64_t deadline_ns,
                        uint64_t per_stretch, uint64_t slow_step_ns, uint64_t *untimed_ns)
{
    long switches = thread_switches(1);
    uint64_t off = 0, untimed = 0, n = 0, start = now_ns(), cpu = thread_cpu_ns(), t = start;
    for (; off < len && t < deadline_ns; off += stride) {
        base[off] = 1;
        t = now_ns();
        if (++n < per_stretch)
            continue;
        long now_switches = thread_switches(1);
        uint64_t now_cpu = thread_cpu_ns();
        if (now_switches != switches)
            untimed += now_cpu - cpu;
        else if (t - start > per_stretch * slow_step_ns)
            untimed += t - start;
        switches = now_switches;
        cpu = now_cpu;
        start = t = now_ns(); /* the two reads above are not the storm's */
        n = 0;
    }
    *untimed_ns = untimed;
    return off < len ? off : len;
}

/* CPU-bound work until the deadline: only the clock is read. Returns the time the thread
 * lost while it spun without being switched out: the sum of the steps between two
 * consecutive clock reads longer than threshold_ns (interrupts, and in a VM the
 * hypervisor). Steps in which the thread was preempted (its involuntary context switches
 * rose) go to *preempted_ns instead. */
uint64_t gj_spin_until(uint64_t deadline_ns, uint64_t threshold_ns, uint64_t *preempted_ns)
{
    long switches = thread_switches(0);
    uint64_t prev = now_ns(), lost = 0, preempted = 0;
    while (prev < deadline_ns) {
        uint64_t t = now_ns();
        if (t - prev > threshold_ns) {
            long n = thread_switches(0);
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
