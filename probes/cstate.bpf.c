/* cstate: idle states of every CPU, and what they cost watched threads that wake onto them.
 * cpu_idle (every idle entry and exit, system-wide) keeps each CPU's current state, entry
 * time and last exit in a per-CPU slot, and there its residency per state as one word each
 * that also holds the stretch in progress (struct idle_cpu). A watched thread that
 * goes to sleep is recorded at sched_switch (it is current then, so its tgid is known), its
 * wake-up time at sched_waking (in the waker's context, before the target CPU leaves idle);
 * when it is switched in straight from the idle task, the CPU's last idle interval is the one
 * its wake-up ended: state, idle time and wake->run latency. Every wake->run latency lands in a
 * log2 histogram per state (slot IDLE_STATES: woken onto a busy CPU); IdleWake is streamed
 * above THRESHOLD_WAKE_NS.
 *
 * Raw tracepoints, all three: they hand over the tracepoint's arguments without building a
 * perf record, which about halved the probe's cost on a watched ping-pong (+14 % to +7.5 %,
 * docs/performance.md). The raw sched_switch and sched_waking hand over task pointers, and
 * task_struct's layout cannot be trusted here (bcc compiles against whatever kernel headers
 * are installed, which need not match the running kernel), so sleepers are keyed by task
 * pointer, not thread id: the thread that switches out is current, and its ids come from a
 * helper.
 *
 * One program per hook with sched: where sched runs in the same module (probes/bundle.py)
 * with its programs on the raw sched_switch and sched_waking, those programs run this
 * probe's share of both events and this probe attaches only cpu_idle; it tells them so
 * through `carried` (sched's part number, GJ_THIS_PART; 0: not carried, when this probe
 * stops). sched already keeps, per watched thread, the state it went to sleep in and when it
 * was woken, in its own entry: carried, this probe keeps no `sleepers` of its own and only
 * takes the wake-up from sched's entry as the thread is switched in (cstate_carried_woken),
 * so a watched sleep costs no hash lookup and no cache line of this probe's at the
 * switch-out, the wake-up (on the waker's CPU) and the switch-in. One program run and one
 * prologue per event instead of two, one clock read per switch and wake-up
 * (docs/performance.md). And where sched streams an off-CPU record of that switch-in (most
 * IdleWakes: a sleep long enough to stream ends in most wake-ups slow enough to), the
 * IdleWake rides in it (struct gj_idle_wake) instead of a record of its own here: user space
 * gets the same two events from one record, one reservation and one ring callback. Alone,
 * or beside a sched on perf tracepoints, this probe attaches its own programs to both and
 * keeps `sleepers`. No map crosses probes either way (an extern
 * map needs its owner loaded first, and bcc never releases a public one): the two probes
 * stay separately switchable and fail alone.
 */
#define GJ_TASK_BITS /* `sleepers` keys, hashed: the switch-in and wake-up filter */
#include "gpujitter.h"

#define PWR_EVENT_EXIT 0xffffffff
#define LOG2_SLOTS 65
/* The raw sched_switch's prev_state is the task's __state (not the tracepoint record's
 * TASK_REPORT bits): TASK_INTERRUPTIBLE, TASK_UNINTERRUPTIBLE (TASK_IDLE and TASK_KILLABLE
 * include it), and TASK_DEAD at an exiting task's last switch. */
#define STATE_SLEEPS 0x03
#define STATE_DEAD 0x80

struct idle_cpu {
    u64 idle_since_ns; /* first idle-state entry since the idle task was switched in */
    u64 entry_ns;      /* last idle-state entry */
    u64 exit_ns;       /* last idle-state exit */
    u32 state;         /* state entered last */
    u32 in_idle;
    u32 switched; /* a context switch, and no idle state entered since */
    u32 pad;
    /* Per state, twice its residency so far, and while the CPU is in it, minus twice the
     * entry time, plus one (odd: in progress); modulo 2^64. User space reads these while the
     * CPU runs on: a finished total and an entry time kept apart can be read from either side
     * of an exit (the stretch then counted twice, or in no sample at all). One word is read
     * whole, so the residency it gives at the read is exact: word / 2 while even,
     * (word - 1) / 2 + now while odd (probes/cstate.py). */
    u64 residency2[IDLE_STATES];
};
BPF_PERCPU_ARRAY(idle_now, struct idle_cpu, 1);
/* The wake->run histograms, one per state and one for wake-ups onto a busy CPU (slot
 * state * LOG2_SLOTS + bpf_log2l(ns)), as one entry of a per-CPU array: user space copies
 * them in one lookup (probes/log2.py), where a batch read of an entry per slot took ~0.7 µs
 * a slot, 1105 slots. */
struct wake_hists {
    u64 n[(IDLE_STATES + 1) * LOG2_SLOTS];
};
BPF_PERCPU_ARRAY(wake_log2, struct wake_hists, 1);

/* A watched thread that went to sleep, keyed by its task_struct's address (wake_ns 0 until it
 * is woken; armed 0: consumed). */
struct sleeper {
    u64 wake_ns;
    u32 tid;
    u32 tgid;
    u32 armed;
    u32 pad;
};
BPF_HASH(sleepers, u64, struct sleeper, GJ_MAX_THREADS);

struct idle_wake_rec {
    u64 ts_ns;
    u64 idle_ns;
    u64 in_state_ns;
    u64 wake_to_run_ns;
    u32 tid;
    u32 tgid;
    u32 cpu;
    u32 state;
};
BPF_RINGBUF_OUTPUT(idle_wakes, 32);

static __always_inline u32 state_slot(u32 state)
{
    return state < IDLE_STATES ? state : IDLE_STATES - 1;
}

/* The CPU leaves its idle state at `now`: the stretch joins the state's residency. */
static __always_inline void idle_exit(struct idle_cpu *c, u64 now)
{
    c->in_idle = 0;
    c->exit_ns = now;
    c->residency2[state_slot(c->state)] += 2 * now - 1;
}

/* cpu_idle(unsigned int state, unsigned int cpu_id) */
RAW_TRACEPOINT_PROBE(cpu_idle)
{
    u32 zero = 0;
    struct idle_cpu *c = idle_now.lookup(&zero);
    if (!c)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u32 state = (u32)ctx->args[0];
    if (state != PWR_EVENT_EXIT) {
        /* Idle states are only entered by the idle task, so the first entry since a switch
         * is the first since the idle task came in: stamped here rather than at that switch
         * (a few microseconds earlier), which then needs no clock read of its own. */
        if (c->switched) {
            c->idle_since_ns = now;
            c->switched = 0;
        }
        /* A second entry without an exit between (one this program missed) ends the first
         * stretch here: its +1 on top of the first's would spoil both words for good. */
        if (c->in_idle)
            idle_exit(c, now);
        c->entry_ns = now;
        c->state = state;
        c->in_idle = 1;
        c->residency2[state_slot(state)] += 1 - 2 * now;
        return 0;
    }
    if (c->in_idle)
        idle_exit(c, now);
    return 0;
}

/* Watched thread tid (of tgid), woken at wake_ns, is switched in on this CPU at `now`;
 * `from_idle_task`: the idle task switched out. An IdleWake to report goes into *out where
 * the caller streams a record of this switch-in anyway (sched's off-CPU record, whose
 * runnable_ns, end_ns and cpu_in are this wake-up's wake_ns, now and CPU), else into this
 * probe's ring. */
static __always_inline void woken_in(u32 tid, u32 tgid, u64 wake_ns, struct idle_cpu *c,
                                     bool from_idle_task, u64 now, struct gj_idle_wake *out)
{
    u64 wake_to_run = now - wake_ns;
    /* Onto an idle CPU: the idle task ran, and had entered an idle state, before the
     * wake-up. The CPU idled from then until it left its last idle state (interrupts in
     * between do not end idle time; a timer wake-up runs after the exit, on that CPU). */
    bool from_idle = c && from_idle_task && !c->in_idle && !c->switched && c->idle_since_ns &&
                     c->idle_since_ns <= wake_ns && c->entry_ns >= c->idle_since_ns &&
                     c->exit_ns >= c->entry_ns;
    u32 state = from_idle ? state_slot(c->state) : IDLE_STATES;
    u32 slot = state * LOG2_SLOTS + bpf_log2l(wake_to_run);
    u32 zero = 0;
    struct wake_hists *h = wake_log2.lookup(&zero);
    if (h && slot < (IDLE_STATES + 1) * LOG2_SLOTS)
        h->n[slot]++;
    if (!from_idle || wake_to_run < THRESHOLD_WAKE_NS)
        return;
    if (out) {
        out->idle_ns = c->exit_ns - c->idle_since_ns;
        out->in_state_ns = c->exit_ns - c->entry_ns;
        out->state = c->state + 1;
        return;
    }
    struct idle_wake_rec *e = idle_wakes.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gj_count_lost();
        return;
    }
    e->ts_ns = wake_ns;
    e->idle_ns = c->exit_ns - c->idle_since_ns;
    e->in_state_ns = c->exit_ns - c->entry_ns;
    e->wake_to_run_ns = wake_to_run;
    e->tid = tid;
    e->tgid = tgid;
    e->cpu = bpf_get_smp_processor_id();
    e->state = c->state;
    idle_wakes.ringbuf_submit(e, gj_wake_flags());
}

/* Which part's programs run this probe's share of sched_switch and sched_waking: sched's
 * number in the module (GJ_THIS_PART there), 0 while this probe's own programs do. */
BPF_ARRAY(carried, u32, 1);

/* This probe's share of a context switch (ctx: the raw sched_switch's; prev is current, id
 * its pid_tgid). next_maybe: `next` may be in `sleepers` (its bit in a filter that every
 * sleeper's pointer sets); *now: the switch's clock, 0 until read. */
static __always_inline void cstate_switch(struct bpf_raw_tracepoint_args *ctx, u64 id,
                                          bool next_maybe, u64 *now)
{
    u32 zero = 0;
    struct idle_cpu *c = idle_now.lookup(&zero);
    u64 next = ctx->args[2];
    struct sleeper *s = next_maybe ? sleepers.lookup(&next) : NULL;
    if (s && s->armed) {
        if (s->wake_ns) {
            if (!*now)
                *now = bpf_ktime_get_ns();
            woken_in(s->tid, s->tgid, s->wake_ns, c, (u32)id == 0, *now, NULL);
        }
        s->armed = 0;
    }
    if (c)
        c->switched = 1;
    u32 prev_state = (u32)ctx->args[3];
    if ((u32)id == 0 || ctx->args[0] || !(prev_state & (STATE_SLEEPS | STATE_DEAD)))
        return;
    u64 prev = ctx->args[1];
    if (prev_state & STATE_DEAD) {
        /* the bit goes with the sleeper, as sched's with its thread (sched.bpf.c) */
        u32 bit = gj_task_ptr_bit(prev);
        if (gj_task_bit(bit) && sleepers.delete(&prev) == 0)
            gj_task_bit_clear(bit);
        return;
    }
    u32 tgid = id >> 32;
    if (!gj_current_watched_cached(id))
        return;
    struct sleeper fresh = {.tid = (u32)id, .tgid = tgid, .armed = 1};
    /* the bit first: a wake-up racing this switch on another CPU must find the entry */
    gj_task_bit_set(gj_task_ptr_bit(prev));
    s = sleepers.lookup(&prev);
    if (s)
        *s = fresh; /* in place: cheaper than an update, which allocates */
    else
        sleepers.update(&prev, &fresh);
}

/* This probe's share of a wake-up of `task` (in the waker's context), for a task that may
 * be in `sleepers`; *now as above. */
static __always_inline void cstate_waking(u64 task, u64 *now)
{
    struct sleeper *s = sleepers.lookup(&task);
    if (s && s->armed && !s->wake_ns) {
        if (!*now)
            *now = bpf_ktime_get_ns();
        s->wake_ns = *now;
    }
}

/* The share run from the program of part `part` (sched's), where that part's entry for the
 * thread holds what `sleepers` would: whether it went to sleep and when it was woken. */
static __always_inline bool cstate_carried_by(u32 part)
{
    u32 zero = 0;
    u32 *by = carried.lookup(&zero);
    return by && *by == part;
}

/* A watched thread that went to sleep and was woken at wake_ns is switched in at `now` (sched
 * calls this before its switch share below, as cstate_switch takes the sleeper first). out:
 * where sched streams its off-CPU record of this switch-in, the IdleWake goes in there
 * (NULL: none is streamed, this probe's ring takes it). */
static __always_inline void cstate_carried_woken(u32 tid, u32 tgid, u64 wake_ns, u64 now,
                                                 bool from_idle_task, u32 part,
                                                 struct gj_idle_wake *out)
{
    if (!cstate_carried_by(part))
        return;
    u32 zero = 0;
    woken_in(tid, tgid, wake_ns, idle_now.lookup(&zero), from_idle_task, now, out);
}

/* Every context switch: no idle state entered since. */
static __always_inline void cstate_carried_switch(u32 part)
{
    u32 zero = 0;
    struct idle_cpu *c = idle_now.lookup(&zero);
    if (c && cstate_carried_by(part))
        c->switched = 1;
}

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
 * unsigned int prev_state); prev is current. */
RAW_TRACEPOINT_PROBE(sched_switch)
{
    u64 now = 0;
    cstate_switch(ctx, bpf_get_current_pid_tgid(), gj_task_bit(gj_task_ptr_bit(ctx->args[2])),
                  &now);
    return 0;
}

/* sched_waking(struct task_struct *p), in the waker's context */
RAW_TRACEPOINT_PROBE(sched_waking)
{
    u64 task = ctx->args[0], now = 0;
    if (gj_task_bit(gj_task_ptr_bit(task)))
        cstate_waking(task, &now);
    return 0;
}
