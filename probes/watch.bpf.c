/* The core module, loaded before every probe: owns the maps that all probes share (the
 * watched processes, configuration, CPU -> NUMA node) and keeps the watched set current in
 * the kernel: children of watched processes are watched from their first instruction, and
 * exits drop out. Execs are streamed (rare: tens per second on a busy node) so user space
 * can match command-name patterns at once instead of on its next /proc scan.
 */
#define GJ_CORE
#include "gpujitter.h"

/* From watch.py as -D options: GJ_WHY_FORK, the gj_watched value (why a process is watched,
 * bits: user space decides the rest) of a child of a watched process; proc_event.exited's
 * values GJ_EXEC, GJ_EXIT_PROCESS, GJ_EXIT_THREAD. */

struct proc_event {
    u64 ts_ns;
    u32 tgid;
    u32 tid;
    u32 exited;  /* GJ_EXEC, or what of a watched process ended */
    char comm[TASK_COMM_LEN];
    char filename[64];
};
/* 64 pages: ~2,300 records of 112 bytes. A job that starts thousands of short threads a
 * second ends as many, and on a saturated node the drain comes late: 16 pages lost 72 % of
 * such a job's exits, and every reader kept the dead threads for its history. */
BPF_RINGBUF_OUTPUT(proc_events, 64);

TRACEPOINT_PROBE(sched, sched_process_fork)
{
    /* The parent is current; fork from any of its threads counts. A new thread (same
     * tgid) needs nothing: probes filter by tgid. */
    u32 parent = bpf_get_current_pid_tgid() >> 32;
    u32 child = args->child_pid;
    if (child == parent || !gj_watched.lookup(&parent))
        return 0;
    u8 why = GJ_WHY_FORK;
    gj_watched.update(&child, &why);
    gj_watched_changed();
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exec)
{
    struct proc_event *e = proc_events.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gj_count_lost();
        return 0;
    }
    u64 id = bpf_get_current_pid_tgid();
    e->ts_ns = bpf_ktime_get_ns();
    e->tgid = id >> 32;
    e->tid = (u32)id;
    e->exited = GJ_EXEC;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    TP_DATA_LOC_READ_STR(&e->filename, filename, sizeof(e->filename));
    proc_events.ringbuf_submit(e, gj_wake_flags());
    return 0;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
#if GJ_GROUP_DEAD
    /* The process ends with the last of its threads, whichever it is: a leader retired by
     * another thread's exec, or gone by pthread_exit, leaves it running under its id. */
    bool process = args->group_dead;
#else
    bool process = tid == tgid;
#endif
    if (tid != tgid) {
        /* Forks of watched processes add every new task id, threads too (the tracepoint
         * cannot tell them apart); a thread's entry goes when the thread does. */
        if (gj_watched.delete(&tid) == 0)
            gj_watched_changed();
    }
    if (!gj_watched.lookup(&tgid))
        return 0;
    /* A watched process's thread exits are streamed too, so that user space forgets the
     * thread at once: short-lived threads would otherwise pile up in what it keeps. */
    if (process) {
        gj_watched.delete(&tgid);
        gj_watched_changed();
    }
    struct proc_event *e = proc_events.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gj_count_lost();
        return 0;
    }
    e->ts_ns = bpf_ktime_get_ns();
    e->tgid = tgid;
    e->tid = tid;
    e->exited = process ? GJ_EXIT_PROCESS : GJ_EXIT_THREAD;
    bpf_get_current_comm(&e->comm, sizeof(e->comm));
    e->filename[0] = 0;
    proc_events.ringbuf_submit(e, gj_wake_flags());
    return 0;
}
