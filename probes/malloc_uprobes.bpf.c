/* malloc, precise mode: every call of an allocator entry point (malloc, calloc, realloc,
 * free, posix_memalign, aligned_alloc/memalign of glibc, jemalloc or tcmalloc) in chosen
 * processes, timed by a uprobe at its entry and a uretprobe at its return; calls slower
 * than THRESHOLD_CALL_NS are streamed. Attached per process (the kernel plants the
 * breakpoints in those processes only) for a bounded window: nothing is timed before user
 * space writes the window's end into `window` (once every probe is attached, so the window
 * is as long as asked for, the compile and the attaches not in it), nor after that end,
 * even before user space detaches. Cost: two traps per call (~1.4 us each past
 * endbr64 on the GPU machine, ~6.5 us on it), hence opt-in and bounded.
 */
#include "gpujitter.h"

struct call {
    u64 ts_ns;
    u64 size;
    u64 ip;  /* where the entry probe sits: names the function in user space */
};
BPF_HASH(calls, u32, struct call, GJ_MAX_THREADS);

struct alloc_call {
    u64 ts_ns;
    u64 dur_ns;
    u64 size;
    u64 ip;
    u32 tid;
    u32 tgid;
    u32 cpu;
    u32 pad;
};
BPF_RINGBUF_OUTPUT(slow_calls, 64);

BPF_ARRAY(window, u64, 1);  /* the window's end (bpf_ktime_get_ns), 0 until it opens */

enum { COUNT_TIMED, COUNT_SLOW, COUNT_SLOTS };
BPF_PERCPU_ARRAY(counts, u64, COUNT_SLOTS);

static __always_inline void count(u32 slot)
{
    u64 *n = counts.lookup(&slot);
    if (n)
        (*n)++;
}

static __always_inline int enter(struct pt_regs *ctx, u64 size)
{
    u32 zero = 0;
    u64 *end = window.lookup(&zero);
    u64 now = bpf_ktime_get_ns();
    if (!end || now >= *end)
        return 0;
    u32 tid = bpf_get_current_pid_tgid();
    struct call c = {.ts_ns = now, .size = size, .ip = PT_REGS_IP(ctx)};
    calls.update(&tid, &c);
    return 0;
}

int enter_size1(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM1(ctx)); }
int enter_size2(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM2(ctx)); }
int enter_size3(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM3(ctx)); }
int enter_calloc(struct pt_regs *ctx) { return enter(ctx, PT_REGS_PARM1(ctx) * PT_REGS_PARM2(ctx)); }
int enter_nosize(struct pt_regs *ctx) { return enter(ctx, 0); }

/* One program for every site of a uprobe-multi link; the cookie says where the size is,
 * as SIZE_PROGRAMS in malloc_sites.py orders the programs above. */
int enter_linked(struct pt_regs *ctx)
{
    switch (bpf_get_attach_cookie(ctx)) {
    case 1: return enter(ctx, PT_REGS_PARM1(ctx));
    case 2: return enter(ctx, PT_REGS_PARM2(ctx));
    case 3: return enter(ctx, PT_REGS_PARM3(ctx));
    case 4: return enter(ctx, PT_REGS_PARM1(ctx) * PT_REGS_PARM2(ctx));
    default: return enter(ctx, 0);
    }
}

int leave(struct pt_regs *ctx)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct call *c = calls.lookup(&tid);
    if (!c)
        return 0;
    u64 dur = now - c->ts_ns;
    count(COUNT_TIMED);
    if (dur >= THRESHOLD_CALL_NS) {
        count(COUNT_SLOW);
        struct alloc_call *e = slow_calls.ringbuf_reserve(sizeof(*e));
        if (!e) {
            gj_count_lost();
        } else {
            e->ts_ns = c->ts_ns;
            e->dur_ns = dur;
            e->size = c->size;
            e->ip = c->ip;
            e->tid = tid;
            e->tgid = id >> 32;
            e->cpu = bpf_get_smp_processor_id();
            slow_calls.ringbuf_submit(e, gj_wake_flags());
        }
    }
    calls.delete(&tid);
    return 0;
}
