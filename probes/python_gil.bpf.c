/* python_gil: how long watched threads wait to take CPython's GIL, and which thread of their
 * process held it, from a uprobe and a uretprobe on the interpreter's take_gil (the wait of
 * every GIL acquisition: PyEval_RestoreThread's, after a C function released it, and the
 * eval loop's, after a forced switch). The GIL is one lock per process whose every taker
 * goes through take_gil, so the thread that last came out of take_gil in the process before
 * a waiter did is the one that held it as the wait ended (the holder).
 *
 * Each wait is timed per thread in the kernel: those of THRESHOLD_WAIT_NS or more are
 * streamed with the holder, the others land in a log2 histogram. Cost: two uprobe hits per
 * GIL acquisition of a watched thread (docs/probes.md has the figure).
 */
#include "gpujitter.h"

#define LOG2_SLOTS 65

/* when each watched thread inside take_gil entered it */
BPF_HASH(gil_waiting, u32, u64, GJ_MAX_THREADS);

/* per process: the thread that took its GIL last */
struct gil_owner {
    u32 tid;
    char comm[TASK_COMM_LEN];
};
BPF_HASH(gil_owner, u32, struct gil_owner, GJ_MAX_WATCHED);

struct gil_event {
    u64 ts_ns;
    u64 dur_ns;
    u32 tid;
    u32 tgid;
    u32 cpu;
    u32 holder_tid;
    char holder_comm[TASK_COMM_LEN];
};
BPF_RINGBUF_OUTPUT(gil_events, 8);

/* Waits below the threshold, by log2(ns), as one entry of a per-CPU array: user space
 * copies them in one lookup (probes/log2.py). */
struct gil_hist {
    u64 n[LOG2_SLOTS];
};
BPF_PERCPU_ARRAY(short_log2, struct gil_hist, 1);
/* GIL acquisitions of watched threads, all durations */
BPF_PERCPU_ARRAY(acquisitions, u64, 1);

int gil_enter(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!gj_current_watched_cached(id))
        return 0;
    u32 tid = (u32)id;
    u64 now = bpf_ktime_get_ns();
    gil_waiting.update(&tid, &now);
    return 0;
}

int gil_leave(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id, tgid = id >> 32;
    u64 *since = gil_waiting.lookup(&tid);
    if (!since)
        return 0;
    u64 start = *since, dur = bpf_ktime_get_ns() - start;
    struct gil_owner me = {.tid = tid};
    bpf_get_current_comm(me.comm, sizeof(me.comm));
    struct gil_owner *last = gil_owner.lookup(&tgid);
    u32 zero = 0;
    u64 *n = acquisitions.lookup(&zero);
    if (n)
        (*n)++;
    if (dur >= THRESHOLD_WAIT_NS) {
        struct gil_event *e = gil_events.ringbuf_reserve(sizeof(*e));
        if (!e) {
            gj_count_lost();
        } else {
            e->ts_ns = start;
            e->dur_ns = dur;
            e->tid = tid;
            e->tgid = tgid;
            e->cpu = bpf_get_smp_processor_id();
            e->holder_tid = 0;
            if (last && last->tid != tid) {
                e->holder_tid = last->tid;
                __builtin_memcpy(e->holder_comm, last->comm, TASK_COMM_LEN);
            } else {
                __builtin_memset(e->holder_comm, 0, TASK_COMM_LEN);
            }
            gil_events.ringbuf_submit(e, gj_wake_flags());
        }
    } else {
        u32 h = bpf_log2l(dur), zero = 0;
        struct gil_hist *hist = short_log2.lookup(&zero);
        if (hist && h < LOG2_SLOTS)
            hist->n[h]++;
    }
    gil_owner.update(&tgid, &me);
    gil_waiting.delete(&tid);
    return 0;
}
