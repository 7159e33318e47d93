/* malloc, cheap mode: the allocator's system calls (mmap, munmap, brk, madvise, mremap) made
 * by watched processes, with their latency. One syscalls:sys_enter_X/sys_exit_X pair per
 * call, so unrelated system calls run no BPF at all. Every call lands in a log2 latency
 * histogram per syscall; calls slower than THRESHOLD_SYSCALL_NS are streamed.
 */
#include "gpujitter.h"

/* SC_MMAP .. SC_MREMAP, SC_COUNT: SYSCALLS in malloc.py, as -D options. */

struct inflight {
    u64 ts_ns;
    u64 length;
    u32 sc;
};
BPF_HASH(inflight, u32, struct inflight, GJ_MAX_THREADS);

struct alloc_syscall {
    u64 ts_ns;
    u64 dur_ns;
    u64 length;
    s64 ret;
    u32 tid;
    u32 tgid;
    u32 cpu;
    u32 sc;
};
BPF_RINGBUF_OUTPUT(slow_syscalls, 32);

/* key: sc * 64 + log2(latency ns) */
BPF_HISTOGRAM(latency_log2, u32, SC_COUNT * 64);

static __always_inline int on_enter(u32 sc, u64 length)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!gj_current_watched_cached(id))
        return 0;
    u32 tid = (u32)id;
    struct inflight call = {.ts_ns = bpf_ktime_get_ns(), .length = length, .sc = sc};
    inflight.update(&tid, &call);
    return 0;
}

static __always_inline int on_exit(s64 ret)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct inflight *call = inflight.lookup(&tid);
    if (!call)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 dur = now - call->ts_ns;
    u32 slot = call->sc * 64 + bpf_log2l(dur);
    latency_log2.increment(slot);
    if (dur >= THRESHOLD_SYSCALL_NS) {
        struct alloc_syscall *e = slow_syscalls.ringbuf_reserve(sizeof(*e));
        if (!e) {
            gj_count_lost();
        } else {
            e->ts_ns = call->ts_ns;
            e->dur_ns = dur;
            e->length = call->length;
            e->ret = ret;
            e->tid = tid;
            e->tgid = id >> 32;
            e->cpu = bpf_get_smp_processor_id();
            e->sc = call->sc;
            slow_syscalls.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
        }
    }
    inflight.delete(&tid);
    return 0;
}

TRACEPOINT_PROBE(syscalls, sys_enter_mmap) { return on_enter(SC_MMAP, args->len); }
TRACEPOINT_PROBE(syscalls, sys_enter_munmap) { return on_enter(SC_MUNMAP, args->len); }
TRACEPOINT_PROBE(syscalls, sys_enter_brk) { return on_enter(SC_BRK, 0); }
TRACEPOINT_PROBE(syscalls, sys_enter_madvise) { return on_enter(SC_MADVISE, args->len_in); }
TRACEPOINT_PROBE(syscalls, sys_enter_mremap) { return on_enter(SC_MREMAP, args->new_len); }
TRACEPOINT_PROBE(syscalls, sys_exit_mmap) { return on_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_exit_munmap) { return on_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_exit_brk) { return on_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_exit_madvise) { return on_exit(args->ret); }
TRACEPOINT_PROBE(syscalls, sys_exit_mremap) { return on_exit(args->ret); }
