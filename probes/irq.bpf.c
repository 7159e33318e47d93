/* irq: time spent in hard IRQ handlers, softirqs and x86 system vectors (local timer, IPIs),
 * per CPU and per source for every CPU (a vector that finds the CPU idle is counted, not
 * timed), and the part of it that was stolen from watched threads. Hooks: raw tracepoints
 * irq_handler_entry/exit, softirq_entry/exit and, when the kernel has them, the irq_vectors
 * <vector>_entry/exit pairs (one program pair for all of them, told apart by the
 * attachment's cookie, where the kernel passes one). Raw tracepoints hand over the
 * tracepoint's arguments (all plain numbers here) without building a perf record, which
 * halves the cost per hook. Cost: two short programs per interrupt, hash updates only
 * (nothing is streamed: user space reads the maps).
 *
 * In interrupt context `current` is the task that was interrupted, so work that ran while a
 * watched thread was current was stolen from it; no scheduler hook is needed. Softirqs run
 * in ksoftirqd are not stolen (current is ksoftirqd): they compete for the CPU like any
 * task, and the sched probe sees that as run-queue wait. Softirqs run on IRQ exit or at
 * local_bh_enable() in a watched thread's context are stolen.
 *
 * Stolen time is summed per (thread, CPU, source) over windows of THRESHOLD_WINDOW_NS,
 * keyed by the window's index: the kernel only ever writes the current window, so user
 * space can read and delete closed windows without racing the kernel. A window's key is
 * queued (`opened`) when its total first reaches THRESHOLD_STOLEN_NS, so that user space
 * reads only the windows it delivers; the others (most: single timer ticks of a few µs on a
 * busy thread) stay in the map until newer windows evict them (`stolen` is an LRU hash).
 */
#include "gpujitter.h"

/* KIND_HARDIRQ, KIND_SOFTIRQ, KIND_VECTOR (KINDS in irq.py) and the vector sources, the `sub`
 * of a key, VEC_LOCAL_TIMER .. VEC_X86_PLATFORM_IPI (VECTORS in irq.py) come as -D options. */

struct source {
    u32 irq;  /* IRQ number, softirq vector or x86 vector */
    u16 kind;
    u16 sub;  /* vector source (VEC_*) for KIND_VECTOR, else 0 */
};

/* What is in progress on this CPU, one slot per kind. Hard IRQs and vectors run with
 * interrupts off and never nest; either can interrupt a softirq, whose time then excludes
 * theirs. */
struct running {
    u64 ts_ns;  /* 0: none */
    u32 num;    /* IRQ, softirq vector or x86 vector */
    u32 pad;
};
struct cpu_state {
    struct running kind[KIND_COUNT];
    u64 soft_nested_ns;
};
BPF_PERCPU_ARRAY(cpu_state, struct cpu_state, 1);

/* Per CPU and source, cumulative since load: the system-wide facts. A per-CPU array (the
 * verifier inlines its lookup; no hashing on the hot path), one slot per source: hard IRQs
 * 0..HARDIRQ_SLOTS-2 by number (HARDIRQ_SLOTS comes from the highest IRQ number at load,
 * with room to spare; a higher one shares the last slot), then softirqs, then vectors. */
#define SOFTIRQ_SLOT(vec) (HARDIRQ_SLOTS + ((vec) & 15))
#define VECTOR_SLOT(sub) (HARDIRQ_SLOTS + 16 + ((sub) & 15))
struct stat {
    u64 ns;
    u64 count;
};
BPF_PERCPU_ARRAY(stats, struct stat, HARDIRQ_SLOTS + 32);

/* Work stolen from one watched thread on one CPU by one source, in one window. */
struct window_key {
    u64 window;  /* end of the last handler / THRESHOLD_WINDOW_NS */
    struct source src;
    u32 tid;
    u32 cpu;
    u32 pad;
};
struct window {
    u64 first_ns;  /* start of the first handler */
    u64 last_ns;   /* end of the last handler */
    u64 count;
    u64 total_ns;
    u32 tgid;
    u32 queued;  /* its key went to `opened` (total_ns reached THRESHOLD_STOLEN_NS) */
};

/* An LRU hash: user space deletes only the windows it delivers, and the windows that never
 * reach the threshold (~9 in 10 beside a training job on the H200: ~400 made a second, ~40
 * delivered) are left for newer windows to evict, the least recently written first. User
 * space reads a window 120-220 ms after it ends, so a queued window is evicted before it is
 * read only when tens of thousands of windows are made in between (the map's size, less
 * what the CPUs' free lists hold); user space counts each such window as lost (irq.py's
 * `_sweep`). Under that pressure an eviction could also take a window still being written
 * (this program's writes then land in the window that took its element); below it, never. */
BPF_TABLE("lru_hash", struct window_key, struct window, stolen, 32768);

/* The key of each window that reached the threshold, in that order: user space pops them
 * and looks up and deletes exactly the closed windows it delivers, instead of walking the
 * map's 32768 buckets (~300 µs, ten times a second). A key is queued once per window (the
 * window's `queued`), and user space empties the queue at every sweep (about ten a second),
 * so a push fails only when more windows than the map holds reach the threshold between two
 * sweeps: windows the map could not have kept either. Such a window is counted lost here. */
BPF_QUEUE(opened, struct window_key, 32768);

static __always_inline struct cpu_state *state(void)
{
    u32 zero = 0;
    return cpu_state.lookup(&zero);
}

static __always_inline void account(u16 kind, u16 sub, u32 irq, u64 start, u64 end)
{
    u64 dur = end - start;
    u32 slot = kind == KIND_HARDIRQ ? (irq < HARDIRQ_SLOTS ? irq : HARDIRQ_SLOTS - 1)
               : kind == KIND_SOFTIRQ ? SOFTIRQ_SLOT(irq)
                                      : VECTOR_SLOT(sub);
    struct stat *s = stats.lookup(&slot);
    if (s) {
        s->ns += dur;
        s->count++;
    }

    u64 id = bpf_get_current_pid_tgid();
    if (!gj_current_watched_cached(id))
        return;
    /* Only this CPU writes keys with its number, and a program never nests in itself (the
     * kernel skips the inner run and counts it); programs that do nest (a hard IRQ during
     * a softirq's program) write other keys. So plain updates are safe. */
    struct window_key wk = {
        .window = end / THRESHOLD_WINDOW_NS,
        .src = {.irq = irq, .kind = kind, .sub = sub},
        .tid = (u32)id,
        .cpu = bpf_get_smp_processor_id(),
    };
    struct window *w = stolen.lookup(&wk);
    if (w) {
        w->last_ns = end;
        w->count++;
        w->total_ns += dur;
        if (w->queued || w->total_ns < THRESHOLD_STOLEN_NS)
            return;
        w->queued = 1;
    } else {
        struct window first = {.first_ns = start,
                               .last_ns = end,
                               .count = 1,
                               .total_ns = dur,
                               .tgid = id >> 32,
                               .queued = dur >= THRESHOLD_STOLEN_NS};
        if (stolen.update(&wk, &first)) {
            gj_count_lost();
            return;
        }
        if (!first.queued)
            return;
    }
    /* A window whose key cannot be queued (see `opened`) is never delivered: counted once
     * (it stays marked queued), and left to the LRU. */
    if (opened.push(&wk, 0))
        gj_count_lost();
}

static __always_inline int entered(u32 kind, u32 num)
{
    struct cpu_state *st = state();
    if (!st)
        return 0;
    st->kind[kind].ts_ns = bpf_ktime_get_ns();
    st->kind[kind].num = num;
    if (kind == KIND_SOFTIRQ)
        st->soft_nested_ns = 0;
    return 0;
}

static __always_inline int exited(u32 kind, u16 sub, u32 num)
{
    struct cpu_state *st = state();
    if (!st)
        return 0;
    struct running *r = &st->kind[kind];
    /* its start was not seen (the probe attached mid-handler), or not timed (an idle CPU's
     * vector, below): the clock is read after this test */
    if (!r->ts_ns || r->num != num)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 start = r->ts_ns;
    r->ts_ns = 0;
    if (kind == KIND_SOFTIRQ) {
        /* Shift the start by the nested interrupts' time so that end - start is the
         * softirq's own time; first_ns of a stolen window is approximate by that much. */
        start += st->soft_nested_ns;
        if (start > now)
            start = now;
    } else if (st->kind[KIND_SOFTIRQ].ts_ns) {
        st->soft_nested_ns += now - start;
    }
    account(kind, sub, num, start, now);
    return 0;
}

/* Raw tracepoint arguments: irq_handler_entry (int irq, struct irqaction *action),
 * irq_handler_exit (int irq, struct irqaction *action, int ret), softirq_entry/exit
 * (unsigned int vec_nr). */
RAW_TRACEPOINT_PROBE(irq_handler_entry) { return entered(KIND_HARDIRQ, ctx->args[0]); }
RAW_TRACEPOINT_PROBE(irq_handler_exit) { return exited(KIND_HARDIRQ, 0, ctx->args[0]); }
RAW_TRACEPOINT_PROBE(softirq_entry) { return entered(KIND_SOFTIRQ, ctx->args[0]); }
RAW_TRACEPOINT_PROBE(softirq_exit) { return exited(KIND_SOFTIRQ, 0, ctx->args[0]); }

/* A vector taken while this CPU idles (current is the idle task) is counted, not timed: a
 * reschedule or function-call IPI there is how a wake-up reaches the CPU and takes no task's
 * time, and timing it cost two clock reads on every wake-up onto an idle CPU (70-90 ns on
 * the H200, docs/performance.md, "irq"). Its exit finds no start and returns before the
 * clock. */
static __always_inline int vector_entered(u16 sub, u32 num)
{
    if (bpf_get_current_pid_tgid())
        return entered(KIND_VECTOR, num);
    u32 slot = VECTOR_SLOT(sub);
    struct stat *s = stats.lookup(&slot);
    if (s)
        s->count++;
    return 0;
}

#ifdef GJ_PER_VECTOR
/* One entry/exit pair per vector, each (int vector), compiled in when its tracepoints exist
 * (irq.py checks tracefs): bcc attaches every probe it compiles, and one missing hook would
 * fail the whole probe. Only where the kernel passes no cookie to a raw tracepoint program
 * (before 6.10), or with the option tp_cookies off. */
#define VECTOR_PROBES(name, sub)                                                               \
    RAW_TRACEPOINT_PROBE(name##_entry) { return vector_entered(sub, ctx->args[0]); }          \
    RAW_TRACEPOINT_PROBE(name##_exit) { return exited(KIND_VECTOR, sub, ctx->args[0]); }

#ifdef HAVE_LOCAL_TIMER
VECTOR_PROBES(local_timer, VEC_LOCAL_TIMER)
#endif
#ifdef HAVE_RESCHEDULE
VECTOR_PROBES(reschedule, VEC_RESCHEDULE)
#endif
#ifdef HAVE_CALL_FUNCTION
VECTOR_PROBES(call_function, VEC_CALL_FUNCTION)
#endif
#ifdef HAVE_CALL_FUNCTION_SINGLE
VECTOR_PROBES(call_function_single, VEC_CALL_FUNCTION_SINGLE)
#endif
#ifdef HAVE_IRQ_WORK
VECTOR_PROBES(irq_work, VEC_IRQ_WORK)
#endif
#ifdef HAVE_X86_PLATFORM_IPI
VECTOR_PROBES(x86_platform_ipi, VEC_X86_PLATFORM_IPI)
#endif
#else
/* One pair for every vector: irq.py attaches each to the <vector>_entry (or _exit) raw
 * tracepoints there are, with the vector's VEC_* as the cookie. Each copy of a pair above was
 * its own compile (~7 ms of LLVM a program on the development VM) and its own load. */
int vector_entry_any(struct bpf_raw_tracepoint_args *ctx)
{
    return vector_entered((u16)bpf_get_attach_cookie(ctx), ctx->args[0]);
}
int vector_exit_any(struct bpf_raw_tracepoint_args *ctx)
{
    return exited(KIND_VECTOR, (u16)bpf_get_attach_cookie(ctx), ctx->args[0]);
}
#endif
