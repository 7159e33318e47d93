/* python_stacks: the innermost Python frame of a watched CPython thread, read in the kernel
 * each time the thread has run THRESHOLD_PERIOD_NS more of CPU time (a task-clock perf event
 * per thread, opened by python_stacks.py, runs py_tick in that thread's context).
 *
 * Where to read: py_threads (thread id -> its thread state's address, written by user space
 * from the interpreter's thread list) and py_procs (process id -> where that CPython version
 * keeps the fields, from probes/pyframes.py). The walk goes from the thread state to its
 * current frame, past shim frames (owned by the C stack) and anything that is not a code
 * object, and streams the code object's address with its name, file and first line as
 * pointers: user space turns them into text once per code object. A thread with no Python
 * frame (a native thread holding a thread state, C code between Python calls) streams its
 * user-space instruction address instead, for user space to name (native_names.py). So does
 * a native-only thread (thread state 0 in py_threads: a feeder in no interpreter's thread
 * list, in any watched process, Python or not) at once, with no thread state to read.
 *
 * Budget (python_stacks_budget.h): one sample per THRESHOLD_SPACING_NS in all, the feeders'
 * periods first (py_feeders_known: user space says feeding threads are known), the others'
 * thinned at random past the budget so that their shares follow their CPU time. The budget
 * is read and written without a lock: two CPUs deciding in the same instant can both spend
 * it (one sample over, rarely) or miscount a period of the thinning's window.
 */
#include "gpujitter.h"
#include "python_stacks_budget.h"

struct py_proc {
    u64 code_type;          /* PyCode_Type's address in the process */
    u32 tstate_frame;
    s32 cframe_current_frame; /* -1: the thread state points at the frame itself */
    u32 frame_code;
    u32 frame_previous;
    s32 frame_owner;        /* -1: the version's frames have no owner field */
    u32 code_filename;
    u32 code_name;
    u32 code_firstlineno;
};
BPF_HASH(py_procs, u32, struct py_proc, 1024);

struct py_thread {
    u64 tstate;             /* 0: native-only, the thread's instruction address alone */
    u32 tgid;               /* a thread id reused by another process is not read */
    u32 feeder;             /* a feeding thread (probes/feeders.py): first on the budget */
};
BPF_HASH(py_threads, u32, struct py_thread, GJ_MAX_THREADS);

BPF_ARRAY(py_budget, struct py_budget, 1);
BPF_ARRAY(py_feeders_known, u32, 1);

struct py_sample {
    u64 ts_ns;
    u64 code;               /* 0: the thread runs no Python code now */
    u64 filename;
    u64 name;
    u64 ip;                 /* code 0: the user-space instruction address (0: not read) */
    u32 tid;
    u32 tgid;
    s32 firstlineno;
    u32 pad;
};
BPF_RINGBUF_OUTPUT(py_samples, 8);
BPF_ARRAY(py_failed, u64, 1);  /* samples dropped for a read that failed */

/* Whether the budget allows this sample now; spends it if so. */
static __always_inline bool py_spend(u64 now, bool feeder)
{
    u32 zero = 0;
    struct py_budget *b = py_budget.lookup(&zero);
    u32 *known = py_feeders_known.lookup(&zero);
    if (!b)
        return false;
    return py_budget_spend(b, now, feeder, known && *known);
}

/* The word at addr in the current process; a failed read (a page not resident, a frame
 * freed under the walk) marks the sample bad. */
static __always_inline u64 py_word(u64 addr, bool *bad)
{
    u64 v = 0;
    if (gj_read_user(&v, sizeof(v), (void *)addr))
        *bad = true;
    return v;
}

/* The innermost Python frame of the thread whose thread state is at tstate into e (its code
 * object's address, name, file and first line; e->code stays 0 where there is none). */
static __always_inline void py_walk(u64 tstate, struct py_proc *p, struct py_sample *e,
                                    bool *bad)
{
    u64 frame = py_word(tstate + p->tstate_frame, bad);
    if (frame && p->cframe_current_frame >= 0)
        frame = py_word(frame + p->cframe_current_frame, bad);
#pragma unroll
    for (int i = 0; i < MAX_WALK; i++) {
        if (!frame || *bad)
            break;
        u64 code = py_word(frame + p->frame_code, bad);
        u8 owner = 0;
        if (p->frame_owner >= 0 && gj_read_user(&owner, 1, (void *)(frame + p->frame_owner)))
            *bad = true;
        if (code && owner != OWNED_BY_CSTACK && py_word(code + 8, bad) == p->code_type) {
            e->code = code;
            e->filename = py_word(code + p->code_filename, bad);
            e->name = py_word(code + p->code_name, bad);
            if (gj_read_user(&e->firstlineno, 4, (void *)(code + p->code_firstlineno)))
                *bad = true;
            return;
        }
        frame = py_word(frame + p->frame_previous, bad);
    }
}

int py_tick(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = id, tgid = id >> 32;
    struct py_thread *t = py_threads.lookup(&tid);
    if (!t || t->tgid != tgid)
        return 0;
    struct py_proc *p = 0;
    if (t->tstate) {
        p = py_procs.lookup(&tgid);
        if (!p)
            return 0;
    }
    u64 now = bpf_ktime_get_ns();
    if (!py_spend(now, t->feeder))
        return 0;
    struct py_sample *e = py_samples.ringbuf_reserve(sizeof(*e));
    if (!e) {
        gj_count_lost();
        return 0;
    }
    e->ts_ns = now;
    e->tid = tid;
    e->tgid = tgid;
    e->code = 0;
    e->filename = 0;
    e->name = 0;
    e->ip = 0;
    e->firstlineno = 0;
    e->pad = 0;
    bool bad = false;
    if (p)
        py_walk(t->tstate, p, e, &bad);
    if (!e->code && !bad) {
        /* The first entry of the user stack is the user registers' IP, also when the timer
         * interrupted the thread in the kernel; frame pointers are not needed for it. */
        u64 ip = 0;
        if (bpf_get_stack(ctx, &ip, sizeof(ip), BPF_F_USER_STACK) > 0)
            e->ip = ip;
    }
    if (bad) {
        py_samples.ringbuf_discard(e, BPF_RB_NO_WAKEUP);
        u32 zero = 0;
        u64 *n = py_failed.lookup(&zero);
        if (n)
            __sync_fetch_and_add(n, 1);
        return 0;
    }
    py_samples.ringbuf_submit(e, gj_wake_flags());
    return 0;
}
