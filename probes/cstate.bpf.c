/* cstate: idle states of every CPU, and what they cost watched threads that wake onto them.
 * power:cpu_idle (every idle entry and exit, system-wide) keeps each CPU's current state, entry
 * time and last exit in a per-CPU slot and adds residency per state. A watched thread that
 * goes to sleep is recorded at sched_switch (it is current then, so its tgid is known), its
 * wake-up time at sched_waking (in the waker's context, before the target CPU leaves idle);
 * when it is switched in straight from the idle task, the CPU's last idle interval is the one
 * its wake-up ended: state, idle time and wake->run latency. Every wake->run latency lands in a
 * log2 histogram per state (slot IDLE_STATES: woken onto a busy CPU); IdleWake is streamed
 * above THRESHOLD_WAKE_NS.
 *
 * Standalone, not folded into sched: sched and cstate stay separately switchable and fail
 * alone, and no map crosses probes (an extern map needs its owner loaded first, and bcc never
 * releases a public one). The price is a second sched_switch and sched_waking program; both
 * return after one map lookup unless a watched thread is involved: measured 35-45 ns net per
 * unwatched switch, 110-170 ns per watched one, about 40 % of the probes' in-kernel time on a
 * watched pipe ping-pong (docs/performance.md). Folding it into sched would need a per-CPU
 * idle map in the core that both share.
 */
#include "gpujitter.h"

#define PWR_EVENT_EXIT 0xffffffff
#define IDLE_STATES 16 /* cpuidle has at most 10 (CPUIDLE_STATE_MAX) */
#define LOG2_SLOTS 65
/* sched_switch prev_state bits (see sched.bpf.c) */
#define REPORT_SLEEPS 0x83 /* interruptible, uninterruptible, TASK_IDLE */
#define REPORT_EXITED 0x30
#define REPORT_PREEMPTED 0x100

struct idle_cpu {
    u64 idle_since_ns; /* first idle-state entry since the idle task was switched in */
    u64 entry_ns;      /* last idle-state entry */
    u64 exit_ns;       /* last idle-state exit */
    u32 state;         /* state entered last */
    u32 in_idle;
    u32 went_idle; /* the idle task was switched in, no idle state entered since */
};
BPF_PERCPU_ARRAY(idle_now, struct idle_cpu, 1);
BPF_PERCPU_ARRAY(residency_ns, u64, IDLE_STATES);
BPF_PERCPU_ARRAY(wake_log2, u64, (IDLE_STATES + 1) * LOG2_SLOTS);

/* A watched thread that went to sleep (wake_ns 0 until it is woken; armed 0: consumed). */
struct sleeper {
    u64 wake_ns;
    u32 tgid;
    u32 armed;
};
BPF_HASH(sleepers, u32, struct sleeper, GJ_MAX_THREADS);

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

TRACEPOINT_PROBE(power, cpu_idle)
{
    u32 zero = 0;
    struct idle_cpu *c = idle_now.lookup(&zero);
    if (!c)
        return 0;
    u64 now = bpf_ktime_get_ns();
    if (args->state != PWR_EVENT_EXIT) {
        /* Stamped here rather than at the switch to the idle task (a few microseconds
         * earlier), which then needs no clock read of its own. */
        if (c->went_idle) {
            c->idle_since_ns = now;
            c->went_idle = 0;
        }
        c->entry_ns = now;
        c->state = args->state;
        c->in_idle = 1;
        return 0;
    }
    if (!c->in_idle)
        return 0;
    c->in_idle = 0;
    c->exit_ns = now;
    u32 state = c->state < IDLE_STATES ? c->state : IDLE_STATES - 1;
    u64 *r = residency_ns.lookup(&state);
    if (r)
        *r += now - c->entry_ns;
    return 0;
}

/* Helpers take the tracepoint's fields: bcc declares its argument struct only inside
 * TRACEPOINT_PROBE. */
static __always_inline void woken_in(u32 tid, u32 prev_pid, struct sleeper *s, u64 now)
{
    u32 zero = 0;
    struct idle_cpu *c = idle_now.lookup(&zero);
    u64 wake_ns = s->wake_ns;
    u64 wake_to_run = now - wake_ns;
    /* Onto an idle CPU: the idle task ran, and had entered an idle state, before the
     * wake-up. The CPU idled from then until it left its last idle state (interrupts in
     * between do not end idle time; a timer wake-up runs after the exit, on that CPU). */
    bool from_idle = c && prev_pid == 0 && !c->in_idle && !c->went_idle && c->idle_since_ns &&
                     c->idle_since_ns <= wake_ns && c->entry_ns >= c->idle_since_ns &&
                     c->exit_ns >= c->entry_ns;
    u32 state = from_idle ? (c->state < IDLE_STATES ? c->state : IDLE_STATES - 1) : IDLE_STATES;
    u32 slot = state * LOG2_SLOTS + bpf_log2l(wake_to_run);
    u64 *n = wake_log2.lookup(&slot);
    if (n)
        (*n)++;
    if (!from_idle || wake_to_run < THRESHOLD_WAKE_NS)
        return;
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
    e->tgid = s->tgid;
    e->cpu = bpf_get_smp_processor_id();
    e->state = c->state;
    idle_wakes.ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

TRACEPOINT_PROBE(sched, sched_switch)
{
    u32 next = args->next_pid;
    if (!next) {
        u32 zero = 0;
        struct idle_cpu *c = idle_now.lookup(&zero);
        if (c)
            c->went_idle = 1;
    } else {
        struct sleeper *s = sleepers.lookup(&next);
        if (s && s->armed) {
            if (s->wake_ns)
                woken_in(next, args->prev_pid, s, bpf_ktime_get_ns());
            s->armed = 0;
        }
    }
    u32 prev = args->prev_pid;
    long prev_state = args->prev_state;
    if (!prev || (prev_state & REPORT_PREEMPTED) || !(prev_state & (REPORT_SLEEPS | REPORT_EXITED)))
        return 0;
    if (prev_state & REPORT_EXITED) {
        sleepers.delete(&prev);
        return 0;
    }
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!gj_tgid_watched(tgid))
        return 0;
    struct sleeper fresh = {.tgid = tgid, .armed = 1};
    struct sleeper *s = sleepers.lookup(&prev);
    if (s)
        *s = fresh; /* in place: cheaper than an update, which allocates */
    else
        sleepers.update(&prev, &fresh);
    return 0;
}

TRACEPOINT_PROBE(sched, sched_waking)
{
    u32 tid = args->pid;
    struct sleeper *s = sleepers.lookup(&tid);
    if (s && s->armed && !s->wake_ns)
        s->wake_ns = bpf_ktime_get_ns();
    return 0;
}
