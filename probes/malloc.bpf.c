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
 *
 * Per watched thread, the call in flight, written in place and never deleted, in the array
 * slot of its thread id modulo GJ_MAX_THREADS: the verifier inlines an array lookup to an
 * index, where a hash (an LRU one until 2026-12-05, so that entries of threads gone were
 * recycled) hashes the id and walks a bucket. The slot names its thread: a thread whose id
 * shares the slot (ids GJ_MAX_THREADS apart) takes it at its call, and a call of the other
 * still in flight there is counted lost (its release finds another id). Another thread's
 * release (system-wide: every munmap and mprotect of the node) is turned away by the per-CPU
 * watched cache before any lookup. The histograms are one per-CPU array entry
 * (probes/log2.py), not a hash of counters. (Task storage would need no slot at all, but its
 * map needs the BTF that the compile no longer emits, docs/performance.md.)
 */
#include "gpujitter.h"

/* SC_MMAP .. SC_MREMAP, SC_COUNT and NR_MMAP .. NR_MREMAP (their system call numbers):
 * SYSCALLS and SYSCALL_NR in malloc.py, as -D options. */

/* A watched thread's call in flight, in the slot of its thread id (ts_ns 0: none). */
struct inflight {
    u64 ts_ns;
    u64 length;
    u32 tid;
    u32 sc;
};
BPF_ARRAY(inflight, struct inflight, GJ_MAX_THREADS);

_Static_assert((GJ_MAX_THREADS & (GJ_MAX_THREADS - 1)) == 0, "a slot is a thread id's low bits");

static __always_inline struct inflight *inflight_slot(u32 tid)
{
    u32 slot = tid & (GJ_MAX_THREADS - 1);
    return inflight.lookup(&slot);
}

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

#define LOG2_SLOTS 65
/* slot sc * LOG2_SLOTS + log2(latency ns) */
struct latency_hists {
    u64 n[SC_COUNT * LOG2_SLOTS];
};
BPF_PERCPU_ARRAY(latency_log2, struct latency_hists, 1);

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
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    int sc = syscall_index(regs->orig_ax);
    u32 tid = (u32)id;
    struct inflight *call = inflight_slot(tid);
    if (!call)
        return 0;
    if (sc < 0) {
        /* a fault or another call: what a thread that died waiting for the lock left (no
         * release came) must not time the next release of a thread given its id */
        if (call->tid == tid)
            call->ts_ns = 0;
        return 0;
    }
    /* the bytes asked for: mmap's, munmap's and madvise's second argument, mremap's new
     * length (third); brk's argument is an address, not a length */
    u64 length = sc == SC_MREMAP ? regs->dx : sc == SC_BRK ? 0 : regs->si;
    /* another thread's call in flight in the slot: its release will not find it */
    if (call->ts_ns && call->tid != tid)
        gj_count_lost();
    /* overwritten, never kept: a lock wait cut short by a fatal signal has no release */
    *call = (struct inflight){.ts_ns = bpf_ktime_get_ns(), .length = length, .tid = tid, .sc = sc};
    return 0;
}

RAW_TRACEPOINT_PROBE(mmap_lock_released)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!gj_current_watched_cached(id))
        return 0;
    u32 tid = (u32)id;
    struct inflight *call = inflight_slot(tid);
    if (!call || call->tid != tid || !call->ts_ns)
        return 0;
    u64 start = call->ts_ns, length = call->length, dur = bpf_ktime_get_ns() - start;
    u32 sc = call->sc;
    call->ts_ns = 0;
    u32 zero = 0, slot = sc * LOG2_SLOTS + bpf_log2l(dur);
    struct latency_hists *h = latency_log2.lookup(&zero);
    if (h && slot < SC_COUNT * LOG2_SLOTS)
        h->n[slot]++;
    if (dur < THRESHOLD_SYSCALL_NS)
        return 0;
    struct alloc_syscall *e = slow_syscalls.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gj_count_lost();
        return 0;
    }
    e->ts_ns = start;
    e->dur_ns = dur;
    e->length = length;
    e->ret = 0; /* the call has not returned yet */
    e->tid = tid;
    e->tgid = id >> 32;
    e->cpu = bpf_get_smp_processor_id();
    e->sc = sc;
    slow_syscalls.ringbuf_submit(e, gj_wake_flags());
    return 0;
}
