/* sched: where watched threads spend their time off CPU, and who runs instead of them.
 * Traced: sched_switch (every context switch, system-wide), sched_waking (every wake-up) and
 * sched_migrate_task. Tracepoint arguments carry thread ids only, so a watched thread is
 * recognised when it switches out (it is current then, and its tgid is known) and recorded in
 * `threads`, keyed by thread id; the wake-up and the switch back in find it there (the
 * runqlat pattern). Every interval feeds per-thread counters and log2 histograms in the
 * kernel; only intervals longer than THRESHOLD_OFFCPU_NS (THRESHOLD_IO_NS for I/O waits), or
 * whose run-queue wait exceeds THRESHOLD_RUNQ_NS, are streamed. Cost per context switch: the
 * per-CPU cached watched-set answer for the thread leaving, a bit of the `threads` filter
 * (gj_task_bits) for the thread arriving, and one array lookup for the CPU's run-queue
 * followers (runq_cpus below; a clock read and a few stores more where a watched thread
 * waits on that CPU): all inlined array lookups, no hashing. Only where a watched thread is
 * involved, a `threads` lookup per watched side, a clock read and a few per-CPU slots more
 * (docs/performance.md).
 *
 * I/O waits: block_rq_complete and block_io_done bracket, on one CPU, the end of a block
 * request, and the bios' end_io wakes the request's waiters in between; a watched thread
 * woken from uninterruptible sleep there was waiting on that request, and its interval
 * carries the request's device, size and direction. Cost per block request completed on the
 * node: a clock read and two per-CPU stores.
 *
 * With cstate in the same module (GJ_PART_CSTATE, probes/bundle.py) the raw sched_switch
 * program here also runs cstate's share of the switch, where cstate asks for it
 * (cstate.bpf.c): one program per hook, one clock read, and `threads` for both (a watched
 * thread's sleep and wake-up are what cstate's own `sleepers` hold when it runs alone).
 *
 * -D options: THRESHOLD_OFFCPU_NS, THRESHOLD_RUNQ_NS, THRESHOLD_IO_NS, SCHED_NODES (NUMA nodes
 * of the topology), SCHED_SYSCALL_FROM_REGS (read the syscall a thread blocked in from its
 * pt_regs), SCHED_IO_WAKE (block_rq_complete exists), SCHED_IO_DONE (block_io_done exists:
 * without it a completion is only bounded by IO_WAKE_WINDOW_NS), SCHED_RAW with TASK_PID,
 * TASK_COMM and TASK_SE_SUM_EXEC_RUNTIME (raw tracepoints; task_struct offsets from BTF).
 */
/* The switch-in, wake-up and migration filter in front of `threads`: keyed by task pointer
 * on raw tracepoints (the thread id would cost a read through the pointer), else by id. */
#define GJ_TASK_BITS
#include "gpujitter.h"

/* sched_switch prev_state as the tracepoint reports it (one bit per state, see its format):
 * TASK_REPORT_MAX marks a preemption; 0 a switch away from a task still runnable (yield). */
#define REPORT_INTERRUPTIBLE 0x01
#define REPORT_UNINTERRUPTIBLE 0x02
#define REPORT_STOPPED 0x04
#define REPORT_TRACED 0x08
#define REPORT_EXIT_DEAD 0x10
#define REPORT_EXIT_ZOMBIE 0x20
#define REPORT_IDLE 0x80 /* TASK_IDLE: uninterruptible but not counted as load */
#define REPORT_PREEMPTED 0x100

/* OffCpu.state: ST_PREEMPTED .. ST_OTHER and ST_COUNT come from STATES in sched.py (-D). */

#define LOG2_SLOTS 65 /* bpf_log2l() returns 1..64 */

/* A wake-up this long after a request's completion began is no longer that completion's:
 * end_io runs microseconds after block_rq_complete; this bounds a completion whose
 * block_io_done is never traced (a kernel without it, a batch completed without it). */
#define IO_WAKE_WINDOW_NS 1000000

/* OffCpu.io_op, index into IO_OPS in sched.py */
enum { IO_NONE, IO_READ, IO_WRITE, IO_OTHER };

/* One entry per watched thread, keyed by thread id: the off-CPU interval in progress and the
 * thread's cumulative totals, which user space reads once a second (and prunes of exited
 * threads). One map, so that a switch costs one lookup per side. */
struct thread {
    u64 off_ns;      /* switched out; 0 while on CPU (or before it was first seen leaving) */
    u64 runnable_ns; /* woken (== off_ns when preempted), 0 while blocked */
    u32 tgid;
    u32 waker_tid;
    s32 syscall;
    u16 cpu; /* the CPU it left */
    u8 state;
    u8 exited;
    u32 io_dev;   /* the block device (kernel dev_t) whose request completion woke it, 0: none */
    u32 io_bytes; /* that request's size */
    u8 io_op;
    u8 wait_slot;  /* its slot in runq_cpus[wait_cpu].w, plus one; 0: not followed there */
    u16 wait_cpu;  /* the CPU whose run queue it waits on */
    u64 offcpu_ns;
    u64 runq_ns;
    u64 switches;
    u64 preemptions;
    u64 migrations;
    u64 cross_node;
    u64 ran_ns; /* its CPU time (se.sum_exec_runtime) at its last switch-out; 0: none seen */
    u64 oncpu_ns[SCHED_NODES];
};
BPF_HASH(threads, u32, struct thread, GJ_MAX_THREADS);

/* The watched thread on this CPU since since_ns (tid 0: none): its on-CPU time not yet
 * charged by a switch-out, which user space adds at a sample (and, without BTF, the stint
 * that a switch-out charges). User space copies it before and after `threads` and adds a
 * stint only where both copies agree (probes/sched.py oncpu_at): the hot path stays as is. */
struct running {
    u64 since_ns;
    u32 tid;
};
BPF_PERCPU_ARRAY(running, struct running, 1);

/* Log2 histograms of every completed interval: off-CPU time per state (slot state *
 * LOG2_SLOTS + bpf_log2l(ns)), run-queue wait; each set as one entry of a per-CPU array:
 * user space copies it in one lookup (probes/log2.py). */
struct offcpu_hists {
    u64 n[ST_COUNT * LOG2_SLOTS];
};
struct runq_hist {
    u64 n[LOG2_SLOTS];
};
BPF_PERCPU_ARRAY(offcpu_log2, struct offcpu_hists, 1);
BPF_PERCPU_ARRAY(runq_log2, struct runq_hist, 1);

/* Who held a CPU while watched threads waited on its run queue. The task switched out right
 * before a waiter runs again is often a bystander (a kworker, a short wake-up) that ran last
 * after a hog held the CPU for most of the wait; so while a watched thread waits on a CPU,
 * each switch there credits the task leaving with the time it held the CPU, and the waiter
 * keeps the two largest holders (a task displaced from the second place starts over: the
 * time credited is never more than the task held). A CPU with no waiter costs a switch one
 * array lookup and a test. Waiters are entered by the CPU they wait on (a preemption) or
 * by a waker or a migration on another CPU, without a lock: a lost race loses the holder
 * (the task switched out last is named instead), never an interval. */
#define RUNQ_WAITERS 4 /* watched threads followed on one CPU at a time */
#define RUNQ_STALE_NS 10000000000ULL /* a waiter this old was missed leaving: free its slot */

struct holder {
    u64 ns;
    u32 tid;
    char comm[TASK_COMM_LEN];
};

struct waiter {
    u64 since_ns; /* runnable there from; 0: a free slot */
    u32 tid;
    struct holder top[2]; /* the larger first */
};

struct runq_cpu {
    u64 last_ns; /* the last switch on this CPU that was credited, or the first waiter's arrival */
    u32 any;     /* a waiter may be in w[]; cleared by the CPU's own switch when none is */
    struct waiter w[RUNQ_WAITERS];
};
BPF_ARRAY(runq_cpus, struct runq_cpu, GJ_MAX_CPUS);

struct offcpu_rec {
    u64 ts_ns;
    u64 end_ns;
    u64 runnable_ns;
    u64 other_ns;
    u32 tid;
    u32 tgid;
    u32 cpu;
    u32 cpu_in;
    u32 waker_tid;
    u32 other_tid;
    s32 syscall;
    u32 state;
    u32 io_dev;
    u32 io_bytes;
    u32 io_op;
    u32 idle_state; /* cstate's IdleWake of this switch-in, carried (gj_idle_wake) */
    u64 idle_ns;
    u64 in_state_ns;
    char comm[TASK_COMM_LEN];
    char other_comm[TASK_COMM_LEN];
};
BPF_RINGBUF_OUTPUT(offcpu_events, 128);

struct migration_rec {
    u64 ts_ns;
    u32 tid;
    u32 tgid;
    u32 src_cpu;
    u32 dst_cpu;
    u32 src_node;
    u32 dst_node;
    char comm[TASK_COMM_LEN];
};
BPF_RINGBUF_OUTPUT(migrations, 16);

static __always_inline u8 state_of(long prev_state)
{
    if (prev_state == 0 || (prev_state & REPORT_PREEMPTED))
        return ST_PREEMPTED;
    if (prev_state & REPORT_UNINTERRUPTIBLE)
        return ST_UNINTERRUPTIBLE;
    if (prev_state & (REPORT_INTERRUPTIBLE | REPORT_IDLE))
        return ST_SLEEPING;
    if (prev_state & (REPORT_STOPPED | REPORT_TRACED))
        return ST_STOPPED;
    return ST_OTHER;
}

/* The system call the current thread is in (orig_ax of its user-mode registers: pt_regs is
 * part of the uapi, unlike task_struct), -1 outside one. */
static __always_inline s32 current_syscall(void)
{
#ifdef SCHED_SYSCALL_FROM_REGS
    struct task_struct *task = (struct task_struct *)bpf_get_current_task_btf();
    struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(task);
    long nr = regs->orig_ax;
    return nr < 0 ? -1 : (s32)nr;
#else
    return -1;
#endif
}

/* The tracepoint's argument struct is only declared inside TRACEPOINT_PROBE (bcc generates
 * it there from tracefs), so helpers take its fields. */
/* The clock, read at most once per switch and only when a watched thread is involved: a
 * clock read is the dearest part of an unwatched switch (about 50 ns in a VM). */
static __always_inline u64 clock_of(u64 *now)
{
    if (!*now)
        *now = bpf_ktime_get_ns();
    return *now;
}

/* Follow who holds `cpu` while watched thread t waits on its run queue, from now_ns. */
static __always_inline void wait_on(struct thread *t, u32 tid, u32 cpu, u64 now_ns)
{
    struct runq_cpu *rc = runq_cpus.lookup(&cpu);
    t->wait_slot = 0;
    if (!rc)
        return;
#pragma unroll
    for (int i = 0; i < RUNQ_WAITERS; i++) {
        struct waiter *w = &rc->w[i];
        if (w->since_ns)
            continue;
        w->tid = tid;
        w->top[0].tid = w->top[1].tid = 0;
        w->top[0].ns = w->top[1].ns = 0;
        w->since_ns = now_ns;
        if (!rc->any) {
            rc->last_ns = now_ns;
            rc->any = 1;
        }
        t->wait_slot = i + 1;
        t->wait_cpu = cpu;
        return;
    }
}

/* t stops waiting where it was followed: its largest holder into *top when asked (tid 0:
 * none, e.g. only the idle task ran, or its slot was lost to a race). */
static __always_inline void wait_end(struct thread *t, u32 tid, struct holder *top)
{
    u32 slot = t->wait_slot - 1, cpu = t->wait_cpu;
    if (!t->wait_slot)
        return;
    t->wait_slot = 0;
    struct runq_cpu *rc = runq_cpus.lookup(&cpu);
    if (!rc || slot >= RUNQ_WAITERS)
        return;
    struct waiter *w = &rc->w[slot];
    if (w->tid != tid || !w->since_ns)
        return;
    if (top)
        *top = w->top[0];
    w->since_ns = 0;
}

/* The current task held the CPU for held_ns of w's wait. */
static __always_inline void credit(struct waiter *w, u32 tid, u64 held_ns)
{
    struct holder *a = &w->top[0], *b = &w->top[1];
    if (a->tid == tid) {
        a->ns += held_ns;
        return;
    }
    if (b->tid == tid) {
        b->ns += held_ns;
    } else if (held_ns > b->ns) {
        b->tid = tid;
        b->ns = held_ns;
        bpf_get_current_comm(b->comm, sizeof(b->comm));
    } else {
        return;
    }
    if (b->ns > a->ns) {
        struct holder first = *b;
        *b = *a;
        *a = first;
    }
}

/* A switch on `cpu`: where watched threads wait, the task leaving (current, prev_tid; 0 the
 * idle task, never a holder) held the CPU from the last credited switch or the waiter's
 * arrival, whichever is later. */
static __always_inline void credit_holder(u32 cpu, u32 prev_tid, u64 *now)
{
    struct runq_cpu *rc = runq_cpus.lookup(&cpu);
    if (!rc || !rc->any)
        return;
    u64 ts = clock_of(now);
    u64 from = rc->last_ns;
    u32 any = 0;
    rc->last_ns = ts;
#pragma unroll
    for (int i = 0; i < RUNQ_WAITERS; i++) {
        struct waiter *w = &rc->w[i];
        u64 since = w->since_ns;
        if (!since)
            continue;
        if ((s64)(ts - since) > (s64)RUNQ_STALE_NS) {
            w->since_ns = 0;
            continue;
        }
        any = 1;
        s64 held = (s64)(ts - (since > from ? since : from));
        if (prev_tid && held > 0)
            credit(w, prev_tid, held);
    }
    rc->any = any;
}

/* The current task's bit in the filter (tid: its thread id). */
static __always_inline u32 current_bit(u32 tid)
{
#ifdef SCHED_RAW
    return gj_task_ptr_bit(bpf_get_current_task());
#else
    return tid;
#endif
}

/* On-CPU time per node is charged at each switch-out: where BTF gives the offset, as the
 * growth of the thread's own CPU time (se.sum_exec_runtime, which the scheduler brings up to
 * date before it traces the switch) since its last switch-out, all of it on this CPU's node:
 * a thread moves between CPUs only while off CPU, and every switch-out of a watched thread
 * is seen here. Not every switch-in is: some kernels do not trace switches away from
 * certain tasks (on the development VM, the threads of its PID-1 agent: the switch that
 * hands the CPU back to a watched thread is never traced), and a stint timed from its
 * switch-in would be lost whole (docs/probes.md). Without BTF the stint is timed from the
 * switch-in that the running slot holds. */
static __always_inline void charge_oncpu(struct thread *t, u32 tid, u64 task, u32 cpu,
                                         struct running *run, u64 ts)
{
    u32 node = gj_node_of(cpu);
#ifdef TASK_SE_SUM_EXEC_RUNTIME
    u64 ran = 0;
    bpf_probe_read_kernel(&ran, sizeof(ran), (void *)(task + TASK_SE_SUM_EXEC_RUNTIME));
    if (t->ran_ns && ran > t->ran_ns && node < SCHED_NODES)
        t->oncpu_ns[node] += ran - t->ran_ns;
    t->ran_ns = ran;
#else
    if (run && run->tid == tid && node < SCHED_NODES)
        t->oncpu_ns[node] += ts - run->since_ns;
#endif
}

/* task: the thread switched out (current, whose pid_tgid is id: asked once by the caller,
 * a helper call being a good part of an unwatched switch's few nanoseconds). */
static __always_inline void switched_out(u64 id, u64 task, long prev_state, u64 *now, u32 cpu)
{
    u32 tid = (u32)id;
    u32 slot = 0;
    bool exiting = prev_state & (REPORT_EXIT_DEAD | REPORT_EXIT_ZOMBIE);
    struct thread zero = {.tgid = id >> 32};
    struct thread *t;
    if (gj_current_watched_cached(id)) {
        t = threads.lookup_or_try_init(&tid, &zero);
        if (t && t->exited)
            *t = zero; /* the id of a thread that exited, reused before user space dropped it */
    } else {
        /* An exiting process has left the watched set already (sched_process_exit runs
         * before the last switch); its threads seen before still count. */
        if (!exiting)
            return;
        t = threads.lookup(&tid);
        if (!t)
            return;
    }
    u64 ts = clock_of(now);
    u8 state = state_of(prev_state);
    struct running *run = running.lookup(&slot);
    if (t)
        charge_oncpu(t, tid, task, cpu, run, ts);
    if (run)
        run->tid = 0;
    if (!exiting)
        gj_task_bit_set(current_bit(tid));
    if (!t)
        return;
    t->switches++;
    if (exiting) {
        /* The thread's last switch: user space reports its totals once more, then drops it;
         * nothing looks it up again. */
        t->exited = 1;
        t->off_ns = 0;
        /* Its bit goes with it. A thread id's bit is its own. A task pointer's is the
         * pointer's: task_structs are reused in place, and a task that took this one over
         * would pass the filter at every event of its own, for a `threads` lookup that
         * misses (gj_task_ptr_bit). Another watched thread whose pointer shares the bit (one
         * in 2^22 / watched threads, per exit) goes unseen from its next wake-up to its
         * next switch-out, which sets the bit again. */
        gj_task_bit_clear(current_bit(tid));
        return;
    }
    if (state == ST_PREEMPTED)
        t->preemptions++;
    t->off_ns = ts;
    t->runnable_ns = state == ST_PREEMPTED ? ts : 0;
    t->waker_tid = 0;
    t->syscall = current_syscall();
    t->cpu = cpu;
    t->state = state;
    t->io_dev = 0;
    t->io_bytes = 0;
    t->io_op = IO_NONE;
    wait_end(t, tid, NULL); /* a slot still held: a switch-in was missed */
    if (state == ST_PREEMPTED)
        wait_on(t, tid, cpu, ts);
}

static __always_inline void count_log2(u32 state, u64 offcpu_ns, u64 runq_ns)
{
    u32 zero = 0;
    u32 slot = state * LOG2_SLOTS + bpf_log2l(offcpu_ns);
    struct offcpu_hists *off = offcpu_log2.lookup(&zero);
    if (off && slot < ST_COUNT * LOG2_SLOTS)
        off->n[slot]++;
    slot = bpf_log2l(runq_ns);
    struct runq_hist *runq = runq_log2.lookup(&zero);
    if (runq && slot < LOG2_SLOTS)
        runq->n[slot]++;
}

#if defined(SCHED_RAW) && defined(GJ_PART_CSTATE)
/* cstate's share of sched_switch, defined by its part of the module. */
static __always_inline void cstate_carried_woken(u32 tid, u32 tgid, u64 wake_ns, u64 now,
                                                 bool from_idle_task, u32 part,
                                                 struct gj_idle_wake *out);
static __always_inline void cstate_carried_switch(u32 part);
#endif

/* tid 0: a task the filter rules out (or the idle task); only the CPU's running slot is
 * cleared. */
static __always_inline void switched_in(u32 tid, const char *comm, u32 other_tid,
                                        const char *other_comm, u64 *now, u32 cpu)
{
    struct thread *t = tid ? threads.lookup(&tid) : NULL;
    u32 slot = 0;
    struct running *run = running.lookup(&slot);
    if (!t || !t->off_ns) {
        if (run && run->tid) /* tested first: most switches have nothing to clear */
            run->tid = 0;
        return;
    }
    u64 ts = clock_of(now);
    if (run) {
        run->tid = tid;
        run->since_ns = ts;
    }
    struct holder top = {};
    wait_end(t, tid, &top);
    /* No wake-up seen (it happened before the probe attached): count it all as blocked. */
    u64 off_ns = t->off_ns;
    u64 runnable_ns = t->runnable_ns ? t->runnable_ns : ts;
    u64 offcpu_ns = ts - off_ns;
    u64 runq_ns = ts - runnable_ns;
    u32 state = t->state;
    bool stream = offcpu_ns >= THRESHOLD_OFFCPU_NS || runq_ns >= THRESHOLD_RUNQ_NS ||
                  (t->io_dev && offcpu_ns >= THRESHOLD_IO_NS);
    struct gj_idle_wake idle = {};
#if defined(SCHED_RAW) && defined(GJ_PART_CSTATE)
    /* a sleep whose wake-up was seen (a preempted thread's runnable_ns is its switch-out);
     * where this switch-in is streamed, its IdleWake rides in the same record */
    if (t->runnable_ns && (state == ST_SLEEPING || state == ST_UNINTERRUPTIBLE))
        cstate_carried_woken(tid, t->tgid, runnable_ns, ts, other_tid == 0, GJ_THIS_PART,
                             stream ? &idle : NULL);
#endif
    count_log2(state, offcpu_ns, runq_ns);
    t->offcpu_ns += offcpu_ns;
    t->runq_ns += runq_ns;
    t->off_ns = 0;
    if (!stream)
        return;
    struct offcpu_rec *e = offcpu_events.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gj_count_lost();
        if (idle.state) /* two events in the record */
            gj_count_lost();
        return;
    }
    e->ts_ns = off_ns;
    e->end_ns = ts;
    e->runnable_ns = runnable_ns;
    e->tid = tid;
    e->tgid = t->tgid;
    e->cpu = t->cpu;
    e->cpu_in = cpu;
    e->waker_tid = t->waker_tid;
    e->other_tid = top.tid ? top.tid : other_tid;
    e->other_ns = top.ns;
    e->syscall = t->syscall;
    e->state = state;
    e->io_dev = t->io_dev;
    e->io_bytes = t->io_bytes;
    e->io_op = t->io_op;
    e->idle_state = idle.state;
    e->idle_ns = idle.idle_ns;
    e->in_state_ns = idle.in_state_ns;
    /* the comms point into the tracepoint record, which only helpers may read once the
     * pointer has moved from the start of it */
    bpf_probe_read_kernel(e->comm, TASK_COMM_LEN, comm);
    if (top.tid)
        __builtin_memcpy(e->other_comm, top.comm, TASK_COMM_LEN);
    else
        bpf_probe_read_kernel(e->other_comm, TASK_COMM_LEN, other_comm);
    offcpu_events.ringbuf_submit(e, gj_wake_flags());
}

#ifdef SCHED_RAW
/* Raw tracepoints: no perf record is built per event, about half the hook's cost
 * (docs/performance.md). They hand over task pointers; the fields read through them are at
 * offsets learned from the running kernel's BTF (TASK_PID, TASK_COMM, from sched.py). */
static __always_inline u32 task_pid(u64 task)
{
    u32 pid = 0;
    bpf_probe_read_kernel(&pid, sizeof(pid), (void *)(task + TASK_PID));
    return pid;
}

/* The raw prev_state is the task's __state; the tracepoint's report bits from it, as the
 * kernel makes them (__trace_sched_switch_state): the low bits are the same, TASK_DEAD
 * (0x80) is an exit, TASK_IDLE is UNINTERRUPTIBLE|TASK_NOLOAD (0x400), an RT-lock wait
 * (TASK_RTLOCK_WAIT, 0x1000) reads as uninterruptible. */
static __always_inline long report_state(u64 preempt, u32 state)
{
    if (preempt)
        return REPORT_PREEMPTED;
    if (state & 0x80)
        return REPORT_EXIT_DEAD;
    if ((state & 0x402) == 0x402)
        return REPORT_IDLE;
    if (state & 0x1000)
        return REPORT_UNINTERRUPTIBLE;
    return state & 0x7f;
}

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 * unsigned int prev_state); prev is current. */
RAW_TRACEPOINT_PROBE(sched_switch)
{
    u64 now = 0;
    u32 cpu = bpf_get_smp_processor_id();
    u64 id = bpf_get_current_pid_tgid();
    u32 prev_pid = (u32)id;
    u64 prev = ctx->args[1], next = ctx->args[2];
    bool next_maybe = gj_task_bit(gj_task_ptr_bit(next));
    u32 next_pid = next_maybe ? task_pid(next) : 0;
    credit_holder(cpu, prev_pid, &now);
    if (prev_pid)
        switched_out(id, prev, report_state(ctx->args[0], (u32)ctx->args[3]), &now, cpu);
    switched_in(next_pid, (const char *)(next + TASK_COMM), prev_pid,
                (const char *)(prev + TASK_COMM), &now, cpu);
#ifdef GJ_PART_CSTATE
    cstate_carried_switch(GJ_THIS_PART);
#endif
    return 0;
}
#else
TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = 0;
    u32 cpu = bpf_get_smp_processor_id();
    u32 next_pid = gj_task_bit(args->next_pid) ? args->next_pid : 0;
    credit_holder(cpu, args->prev_pid, &now);
    if (args->prev_pid)
        switched_out(bpf_get_current_pid_tgid(), bpf_get_current_task(), args->prev_state, &now,
                     cpu);
    switched_in(next_pid, args->next_comm, args->prev_pid, args->prev_comm, &now, cpu);
    return 0;
}
#endif

#ifdef SCHED_IO_WAKE
/* The block request whose completion this CPU is running (ts_ns 0: none). */
struct completing {
    u64 ts_ns;
    u32 dev;
    u32 bytes;
    u8 op;
};
BPF_PERCPU_ARRAY(completing, struct completing, 1);

static __always_inline u8 io_op_of(const char *rwbs)
{
    /* rwbs: an optional F (preflush), then R, W, D (discard), N (none), ... */
    char c = rwbs[0] == 'F' ? rwbs[1] : rwbs[0];
    if (c == 'R')
        return IO_READ;
    if (c == 'W')
        return IO_WRITE;
    return IO_OTHER;
}

/* Runs where the request completes (hard IRQ, block softirq, or the CPU it was issued from),
 * right before its bios' end_io wakes their waiters on this same CPU. */
TRACEPOINT_PROBE(block, block_rq_complete)
{
    u32 slot = 0;
    struct completing *c = completing.lookup(&slot);
    if (c) {
        c->ts_ns = bpf_ktime_get_ns();
        c->dev = args->dev;
        c->bytes = args->nr_sector << 9;
        c->op = io_op_of(args->rwbs);
    }
    return 0;
}

#ifdef SCHED_IO_DONE
/* After end_io: later wake-ups on this CPU are not this request's. */
TRACEPOINT_PROBE(block, block_io_done)
{
    u32 slot = 0;
    struct completing *c = completing.lookup(&slot);
    if (c)
        c->ts_ns = 0;
    return 0;
}
#endif

static __always_inline void io_woken(struct thread *t, u64 now)
{
    u32 slot = 0;
    struct completing *c = completing.lookup(&slot);
    if (c && c->ts_ns && now - c->ts_ns < IO_WAKE_WINDOW_NS) {
        t->io_dev = c->dev;
        t->io_bytes = c->bytes;
        t->io_op = c->op;
    }
}
#endif

/* sched_waking runs in the waker's context (sched_wakeup may run on the target CPU, after an
 * idle CPU woke up): its time includes the target's wake-up, and current is the waker (in a
 * block completion, the interrupted task; the completing request is what woke it). */
static __always_inline void waking(u32 tid, u64 *clock)
{
    struct thread *t = threads.lookup(&tid);
    if (t && t->off_ns && !t->runnable_ns) {
        u64 now = clock_of(clock);
        t->runnable_ns = now;
        t->waker_tid = (u32)bpf_get_current_pid_tgid();
        /* where it slept; a wake-up onto another CPU follows as a migration */
        wait_on(t, tid, t->cpu, now);
#ifdef SCHED_IO_WAKE
        if (t->state == ST_UNINTERRUPTIBLE)
            io_woken(t, now);
#endif
    }
}

#ifdef SCHED_RAW
/* sched_waking(struct task_struct *p) */
RAW_TRACEPOINT_PROBE(sched_waking)
{
    u64 task = ctx->args[0], now = 0;
    if (!gj_task_bit(gj_task_ptr_bit(task)))
        return 0;
    waking(task_pid(task), &now);
    return 0;
}
#else
TRACEPOINT_PROBE(sched, sched_waking)
{
    u64 now = 0;
    if (gj_task_bit(args->pid))
        waking(args->pid, &now);
    return 0;
}
#endif

/* Threads in `threads` are watched ones; same-node moves are counted, cross-node ones are
 * streamed too (they are what costs remote memory access). */
TRACEPOINT_PROBE(sched, sched_migrate_task)
{
    u32 tid = args->pid;
#ifndef SCHED_RAW
    if (!gj_task_bit(tid)) /* with pointer keys, migrations (rare) go to the hash */
        return 0;
#endif
    struct thread *t = threads.lookup(&tid);
    if (!t || t->exited)
        return 0;
    u32 src_cpu = args->orig_cpu, dst_cpu = args->dest_cpu;
    u32 src_node = gj_node_of(src_cpu), dst_node = gj_node_of(dst_cpu);
    t->migrations++;
    if (t->wait_slot) {
        /* a runnable thread moved: it waits on the destination's run queue now */
        wait_end(t, tid, NULL);
        wait_on(t, tid, dst_cpu, bpf_ktime_get_ns());
    }
    if (src_node == dst_node)
        return 0;
    t->cross_node++;
    struct migration_rec *e = migrations.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gj_count_lost();
        return 0;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->tid = tid;
    e->tgid = t->tgid;
    e->src_cpu = src_cpu;
    e->dst_cpu = dst_cpu;
    e->src_node = src_node;
    e->dst_node = dst_node;
    TP_DATA_LOC_READ_STR(&e->comm, comm, sizeof(e->comm));
    migrations.ringbuf_submit(e, gj_wake_flags());
    return 0;
}
