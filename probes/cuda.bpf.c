/* cuda: host-side GPU feeding of watched processes, from uprobes on libcuda's entry points
 * (launches, graph launches, async and synchronous copies, stream/event/context syncs).
 *
 * Nothing is streamed per launch. Per process the kernel keeps the time, thread and kind of
 * the last activity (a launch entry, or a synchronisation return: the queue it waited for had
 * drained); a launch that comes after a quiet stretch of THRESHOLD_QUIET_NS or more is
 * streamed with the stretch's length, and a synchronisation blocked THRESHOLD_SYNC_NS or more
 * is streamed with its duration and the stretch before its entry. A synchronisation that ends
 * a quiet stretch begun by enqueued work (not by another sync's return) is streamed however
 * soon it returns: a thread kept off its CPU before it reached the sync finds the queue
 * drained and returns at once, and only the stretch says how long the GPU may have idled.
 * While a synchronisation is in progress in the process the GPU is busy, so launches and
 * syncs from other threads then are never "after quiet".
 *
 * Cost: one uprobe trap per traced call (~0.7 us on the GPU VM) plus this program; syncs add a
 * uretprobe. Function ids and their roles come from cuda.py as -D flags (GJ_ROLE_<id>).
 */
#include "gpujitter.h"

/* ROLE_SYNC, ROLE_COPY_SYNC: the roles of syncs, from cuda.py as -D options. */

struct proc_state {
    u64 last_ns;   /* last activity: launch entry or sync return; 0: none yet */
    u32 last_tid;
    u16 last_func;
    u8 last_role;
    u8 pad;
    s32 syncing;   /* threads of this process inside a synchronisation now */
};
BPF_HASH(procs, u32, struct proc_state, GJ_MAX_WATCHED);

struct sync_entry {
    u64 ts_ns;
    u64 after_idle_ns; /* the process's quiet stretch before the entry; 0: unknown */
    u32 depth;         /* a traced sync that calls another one is one synchronisation */
    u32 tgid;
    u32 prev_tid;      /* the activity that began that stretch */
    u16 func;
    u16 prev_func;
    u8 prev_role;
    u8 counted;        /* in its process's `syncing` (not where the process had no slot) */
};
BPF_HASH(syncs, u32, struct sync_entry, GJ_MAX_THREADS);

struct cuda_event {
    u64 ts_ns;
    u64 dur_ns;         /* syncs: time blocked */
    u64 after_idle_ns;  /* quiet stretch before this call (syncs: before their entry) */
    u32 tid;
    u32 tgid;
    u32 prev_tid;
    u32 cpu;
    u16 func;
    u16 prev_func;
    u8 role;
    u8 prev_role;
};
BPF_RINGBUF_OUTPUT(cuda_events, 16);

/* Calls per traced function (all watched processes): health, rates, the cost benchmark. */
BPF_PERCPU_ARRAY(hits, u64, 64);

static __always_inline struct proc_state *proc_of(u32 tgid)
{
    struct proc_state *p = procs.lookup(&tgid);
    if (p)
        return p;
    struct proc_state init = {};
    procs.insert(&tgid, &init);
    return procs.lookup(&tgid);
}

static __always_inline void emit(u64 ts, u64 dur, u64 idle, u32 tid, u32 tgid, u16 func,
                                 u8 role, u32 prev_tid, u16 prev_func, u8 prev_role)
{
    struct cuda_event *e = cuda_events.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gj_count_lost();
        return;
    }
    e->ts_ns = ts;
    e->dur_ns = dur;
    e->after_idle_ns = idle;
    e->tid = tid;
    e->tgid = tgid;
    e->prev_tid = prev_tid;
    e->cpu = bpf_get_smp_processor_id();
    e->func = func;
    e->prev_func = prev_func;
    e->role = role;
    e->prev_role = prev_role;
    cuda_events.ringbuf_submit(e, gj_wake_flags());
}

/* Work enqueued: a launch, graph launch or copy. */
static __always_inline void activity(u64 now, u32 tid, u32 tgid, u16 func, u8 role)
{
    struct proc_state *p = proc_of(tgid);
    if (!p)
        return;
    if (p->last_ns && p->syncing <= 0) {
        u64 quiet = now - p->last_ns;
        if (quiet >= THRESHOLD_QUIET_NS)
            emit(now, 0, quiet, tid, tgid, func, role, p->last_tid, p->last_func,
                 p->last_role);
    }
    p->last_ns = now;
    p->last_tid = tid;
    p->last_func = func;
    p->last_role = role;
}

static __always_inline void sync_begin(u64 now, u32 tid, u32 tgid, u16 func)
{
    struct sync_entry *s = syncs.lookup(&tid);
    if (s) {
        s->depth++;
        return;
    }
    struct sync_entry fresh = {.ts_ns = now, .depth = 1, .tgid = tgid, .func = func};
    struct proc_state *p = proc_of(tgid);
    if (p && p->last_ns && p->syncing <= 0) {
        fresh.after_idle_ns = now - p->last_ns;
        fresh.prev_tid = p->last_tid;
        fresh.prev_func = p->last_func;
        fresh.prev_role = p->last_role;
    }
    fresh.counted = p != 0;
    /* Counted only once its entry is kept (the map may be full): a sync whose return finds
     * no entry must not leave the process counted as synchronising for good. */
    if (syncs.update(&tid, &fresh) == 0 && p)
        __sync_fetch_and_add(&p->syncing, 1);
}

static __always_inline int on_enter(u16 func, u8 role)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!gj_current_watched_cached(id))
        return 0;
    u32 tid = (u32)id;
    u32 slot = func;
    u64 *n = hits.lookup(&slot);
    if (n)
        (*n)++;
    u64 now = bpf_ktime_get_ns();
    if (role != ROLE_SYNC)
        activity(now, tid, tgid, func, role);
    if (role == ROLE_SYNC || role == ROLE_COPY_SYNC)
        sync_begin(now, tid, tgid, func);
    return 0;
}

static __always_inline int on_return(void)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id, tgid = id >> 32;
    struct sync_entry *s = syncs.lookup(&tid);
    if (!s)
        return 0;
    if (--s->depth > 0)
        return 0;
    u64 now = bpf_ktime_get_ns();
    struct sync_entry done = *s;
    syncs.delete(&tid);
    struct proc_state *p = procs.lookup(&tgid);
    if (!p)
        return 0;
    if (done.counted)
        __sync_fetch_and_add(&p->syncing, -1);
    u16 func = done.func;
    /* Blocked long enough, or the end of a quiet stretch in which work was queued (one
     * begun at a sync's return had nothing left to run: the next launch reports it). */
    bool late = done.after_idle_ns >= THRESHOLD_QUIET_NS && done.prev_role != ROLE_SYNC;
    if (now - done.ts_ns >= THRESHOLD_SYNC_NS || late)
        emit(done.ts_ns, now - done.ts_ns, done.after_idle_ns, tid, tgid, func, ROLE_SYNC,
             done.prev_tid, done.prev_func, done.prev_role);
    p->last_ns = now;
    p->last_tid = tid;
    p->last_func = func;
    p->last_role = ROLE_SYNC;
    return 0;
}

/* A thread that exits inside a synchronisation never returns from it. Its entry goes at its
 * own exit, and its process's count with an atomic add: from user space, a read-modify-write
 * of the process's state after the exit raced with its other threads' syncs (a count lost
 * either way leaves the process muted for good, or its syncs' launches "after quiet").
 * Every task's exit runs this; a thread with no sync in flight costs one hash lookup. */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct sync_entry *s = syncs.lookup(&tid);
    if (!s)
        return 0;
    u32 tgid = s->tgid;
    u8 counted = s->counted;
    syncs.delete(&tid);
    struct proc_state *p = procs.lookup(&tgid);
    if (p && counted)
        __sync_fetch_and_add(&p->syncing, -1);
    return 0;
}

#ifdef GJ_PER_ADDRESS
/* Where the kernel has no uprobe-multi links: one entry program per traced function id (its
 * role a compile-time constant), one return program shared by all synchronising functions. */
#define GJ_FUNC(i) \
    int enter_##i(struct pt_regs *ctx) { return on_enter(i, GJ_ROLE_##i); }
GJ_FUNC(0) GJ_FUNC(1) GJ_FUNC(2) GJ_FUNC(3) GJ_FUNC(4) GJ_FUNC(5) GJ_FUNC(6) GJ_FUNC(7)
GJ_FUNC(8) GJ_FUNC(9) GJ_FUNC(10) GJ_FUNC(11) GJ_FUNC(12) GJ_FUNC(13) GJ_FUNC(14) GJ_FUNC(15)
GJ_FUNC(16) GJ_FUNC(17) GJ_FUNC(18) GJ_FUNC(19) GJ_FUNC(20) GJ_FUNC(21) GJ_FUNC(22) GJ_FUNC(23)
GJ_FUNC(24) GJ_FUNC(25) GJ_FUNC(26) GJ_FUNC(27) GJ_FUNC(28) GJ_FUNC(29) GJ_FUNC(30) GJ_FUNC(31)
GJ_FUNC(32) GJ_FUNC(33) GJ_FUNC(34) GJ_FUNC(35) GJ_FUNC(36) GJ_FUNC(37) GJ_FUNC(38) GJ_FUNC(39)
GJ_FUNC(40) GJ_FUNC(41) GJ_FUNC(42) GJ_FUNC(43) GJ_FUNC(44) GJ_FUNC(45) GJ_FUNC(46) GJ_FUNC(47)

int leave_sync(struct pt_regs *ctx) { return on_return(); }
#else
/* Two uprobe-multi links per library (cuda.py): one entry program for every traced function,
 * which the link's cookie names (function id | role << 16), and one return program. */
int enter_any(struct pt_regs *ctx)
{
    u64 cookie = bpf_get_attach_cookie(ctx);
    return on_enter(cookie & 0xffff, (cookie >> 16) & 0xff);
}

int leave_any(struct pt_regs *ctx) { return on_return(); }
#endif
