/* malloc, cheap mode: the allocator's system calls (mmap, munmap, brk, madvise, mremap) made
 * by watched processes, timed by the mm's lock: mmap_lock_start_locking to the next
 * mmap_lock_released of the same thread, when the system call it is in (orig_ax of its
 * user registers) is one of those. That span holds the call's work: the wait for the lock,
 * the mapping, the unmapping (zapping and freeing pages after munmap's downgrade to a read
 * lock), a MAP_POPULATE's faulting-in (a second span of its own). Raw tracepoints that run
 * on mmap_lock operations only, filtered to watched threads first; no syscall tracepoint
 * (enabling one sends every system call of every task down the kernel's traced path) and
 * no uprobe (a trap per call in every process that maps the libc). Every call lands in a
 * log2 latency histogram per system call; calls slower than THRESHOLD_SYSCALL_NS are
 * streamed. Not seen: calls that take no mmap_lock (madvise DONTNEED/FREE of one VMA on
 * 6.18, which takes that VMA's lock only). x86_64 registers.
 */
#include "gpujitter.h"

/* SC_MMAP .. SC_MREMAP, SC_COUNT and NR_MMAP .. NR_MREMAP (their system call numbers):
 * SYSCALLS and SYSCALL_NR in malloc.py, as -D options. */

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

static __always_inline int syscall_index(u64 nr)
{
    switch (nr) {
    case NR_MMAP: return SC_MMAP;
    case NR_MUNMAP: return SC_MUNMAP;
    case NR_BRK: return SC_BRK;
    case NR_MADVISE: return SC_MADVISE;
    case NR_MREMAP: return SC_MREMAP;
    default: return -1;  /* a fault (-1), or another call that takes the lock (mprotect, ...) */
    }
}

RAW_TRACEPOINT_PROBE(mmap_lock_start_locking)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!gj_current_watched_cached(id))
        return 0;
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct pt_regs regs = {};
    bpf_probe_read_kernel(&regs, sizeof(regs), (void *)bpf_task_pt_regs(task));
    int sc = syscall_index(regs.orig_ax);
    u32 tid = (u32)id;
    if (sc < 0) {
        /* what a thread that died waiting for the lock left (no release came) must not
         * time the next release of a thread given its id */
        inflight.delete(&tid);
        return 0;
    }
    /* the bytes asked for: mmap's, munmap's and madvise's second argument, mremap's new
     * length (third); brk's argument is an address, not a length */
    u64 length = sc == SC_MREMAP ? regs.dx : sc == SC_BRK ? 0 : regs.si;
    /* overwritten, never kept: a lock wait cut short by a fatal signal has no release */
    struct inflight call = {.ts_ns = bpf_ktime_get_ns(), .length = length, .sc = sc};
    inflight.update(&tid, &call);
    return 0;
}

RAW_TRACEPOINT_PROBE(mmap_lock_released)
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
            e->ret = 0;  /* the call has not returned yet */
            e->tid = tid;
            e->tgid = id >> 32;
            e->cpu = bpf_get_smp_processor_id();
            e->sc = call->sc;
            slow_syscalls.ringbuf_submit(e, gj_wake_flags());
        }
    }
    inflight.delete(&tid);
    return 0;
}
