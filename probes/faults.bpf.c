/* faults and swap: page faults of watched threads, counted, and timed where they cost.
 *
 * Entry: the raw tracepoints exceptions:page_fault_user and page_fault_kernel (x86), at the
 * start of every fault, in the faulting thread's context. A raw tracepoint hands over the
 * address without building a perf record; the perf software events this probe used before
 * (an entry and a completion program per fault) cost +11-15 % on a watched fault storm by
 * themselves (docs/performance.md). No hook marks a minor fault's completion, so minor
 * faults are timed by their spacing: the clock is read at a window's first fault and then
 * every STORM_READ_EVERY faults; a stretch whose faults came at most THRESHOLD_STORM_GAP_NS
 * apart on average, without a context switch of the thread (task_struct's nvcsw + nivcsw,
 * at offsets from the running kernel's BTF), is a storm, and all of its time is fault time
 * (the trap's entry and exit, which no hook would time, included). Other faults are
 * counted, not timed.
 *
 * Major faults: the perf software event "major-faults" (mm_account_fault, at completion;
 * it fires for major faults only, so minor ones run nothing there) ends them. Two
 * tracepoints during the fault classify it and stamp when it began to wait:
 * filemap:mm_filemap_fault (a file page) and block:block_bio_queue with a read (no file
 * fault, but a read issued: a swap-in). A major fault's time runs from its entry to its
 * completion where the clock was read at its entry (at every fault outside a storm), else
 * from that stamp: the read and the wait for it, not the few microseconds before.
 *
 * One BPF object serves both registry entries: counters and histograms always run, and the
 * stream_modes map says which records to stream (minor windows and file majors for `faults`,
 * swap-ins for `swap` or, alone, `faults`), so one real fault yields at most one record.
 * Minor storms are summed per thread into windows, streamed when a window's fault time
 * reaches THRESHOLD_MINOR_NS. Cost per fault of a watched thread: one program, a map
 * lookup, a clock read every STORM_READ_EVERY faults; of other threads, the filter.
 */
#include "gpujitter.h"

/* The perf-event program's context, struct bpf_perf_event_data of
 * <uapi/linux/bpf_perf_event.h>, declared here: that header pulls in the kernel's
 * <linux/ptrace.h> and with it most of the scheduler's headers, 1.6 s of compiling at every
 * start for one field (docs/performance.md). On x86-64 bpf_user_pt_regs_t is struct pt_regs. */
#ifdef __x86_64__
struct bpf_perf_event_data {
    struct pt_regs regs;
    u64 sample_period;
    u64 addr;
};
#else
#include <uapi/linux/bpf_perf_event.h>
#endif

/* STORM_READ_EVERY (faults.py, as a -D option): faults between clock reads inside a window. */

/* Fault classes CLS_MINOR .. CLS_UNCLASSIFIED, CLS_COUNT: index into counters, histograms and
 * lost counts (FAULT_CLASSES in faults.py, as -D options). */

/* What the fault in progress did (seen bits). */
#define SEEN_FILEMAP 1
#define SEEN_READ_IO 2

/* stream_modes bits STREAM_MINOR, STREAM_FILE, STREAM_SWAP (faults.py, as -D options), set by
 * user space as the faults and swap probes start and stop. */

struct thread_faults {
    u64 entry_addr;    /* address of the thread's last fault */
    u64 entry_ns;      /* when it began, where the clock was read then; 0: not read */
    u64 wait_ns;       /* the fault in progress began waiting for a read; 0: not yet */
    u64 win_first_ns;  /* current minor-fault window */
    u64 win_last_ns;   /* the window's last clock read */
    u64 win_total_ns;
    u32 win_count;
    u32 since_read;    /* faults since win_last_ns; 0: no window open */
    u64 switches;      /* the thread's context switches at win_last_ns (FAULTS_SWITCHES) */
    u32 seen;
    u32 tgid;
    u32 untimed;       /* faults counted outside a storm, and majors without a stamp */
    u32 read_next;     /* outside a storm: read the clock at every fault */
    u64 count[CLS_COUNT];
    u64 total_ns[CLS_COUNT];
};
/* LRU: a thread that left without user space noticing is evicted, not leaked. 16k threads
 * (2.3 MB) is far more than the watched processes of a node run. */
BPF_TABLE("lru_hash", u32, struct thread_faults, threads, 16384);

/* key: class * 64 + log2(fault time in ns) */
BPF_PERCPU_ARRAY(fault_ns_log2, u64, CLS_COUNT * 64);
/* ring-buffer reserve failures per class, so each probe reports its own */
BPF_PERCPU_ARRAY(lost_by_class, u64, CLS_COUNT);
BPF_ARRAY(stream_modes, u32, 1);

struct fault_record {
    u64 ts_ns;     /* minor: first fault of the window began; major: the fault began */
    u64 end_ns;    /* last completion */
    u64 total_ns;  /* time inside the faults */
    u64 address;   /* major only */
    u32 tid;
    u32 tgid;
    u32 cpu;
    u32 count;
    u32 cls;
    char comm[TASK_COMM_LEN];  /* major only */
};
BPF_RINGBUF_OUTPUT(fault_records, 64);

static __always_inline bool streaming(u32 mode)
{
    u32 zero = 0;
    u32 *modes = stream_modes.lookup(&zero);
    return modes && (*modes & mode);
}

static __always_inline struct fault_record *reserve(u32 cls)
{
    struct fault_record *r = fault_records.ringbuf_reserve(sizeof(*r));
    if (!r) {
        u64 *lost = lost_by_class.lookup(&cls);
        if (lost)
            (*lost)++;
    }
    return r;
}

/* `n` faults of class `cls` took `dur` together: the class's time, and n faults in its
 * histogram at their mean. (Counts are kept where the faults are seen.) */
static __always_inline void timed(struct thread_faults *t, u32 cls, u64 dur, u32 n)
{
    cls &= CLS_COUNT - 1;
    t->total_ns[cls] += dur;
    u32 slot = cls * 64 + bpf_log2l(dur / (n ? n : 1));
    u64 *c = fault_ns_log2.lookup(&slot);
    if (c)
        *c += n;
}

/* The current thread's context switches so far (task_struct nvcsw + nivcsw, at offsets
 * from the running kernel's BTF: TASK_NVCSW, TASK_NIVCSW); 0 without them. */
static __always_inline u64 switches_now(void)
{
#ifdef FAULTS_SWITCHES
    u64 task = (u64)bpf_get_current_task();
    unsigned long nv = 0, niv = 0;
    bpf_probe_read_kernel(&nv, sizeof(nv), (void *)(task + TASK_NVCSW));
    bpf_probe_read_kernel(&niv, sizeof(niv), (void *)(task + TASK_NIVCSW));
    return nv + niv;
#else
    return 0;
#endif
}

static __always_inline void open_window(struct thread_faults *t, u64 now, u32 count)
{
    t->switches = switches_now();
    t->win_first_ns = now;
    t->win_last_ns = now;
    t->win_total_ns = 0;
    t->win_count = count;
    t->since_read = 1;
}

/* A clock read at a minor fault's entry: the `n` faults since the window's last read
 * (this one included) took `now - win_last_ns`. Dense enough, that stretch is fault time;
 * otherwise (the faults were spread out, or the thread was switched out between them: its
 * context-switch count moved) they are counted, not timed, and the window goes on from here. A window spans at most
 * THRESHOLD_MINOR_WINDOW_NS; one that ends below the threshold is dropped (its faults stay
 * in the counters and histograms). */
static __always_inline void storm_read(struct thread_faults *t, u64 id, u64 now)
{
    u32 n = t->since_read;
    t->entry_ns = now;
    if (!n || now - t->win_first_ns > THRESHOLD_MINOR_WINDOW_NS) {
        t->untimed += n;
        open_window(t, now, 1);
        return;
    }
    u64 gap = now - t->win_last_ns;
    u64 switches = switches_now();
    bool switched = switches != t->switches;
    t->switches = switches;
    t->win_last_ns = now;
    t->since_read = 1;
    /* Outside a storm faults are few, and each may be a major one whose wait is wanted
     * from its start: the clock is read at every one until the faults come densely. */
    t->read_next = switched || gap > (u64)n * THRESHOLD_STORM_GAP_NS;
    if (t->read_next) {
        t->untimed += n;
        return;
    }
    timed(t, CLS_MINOR, gap, n);
    t->win_count += n;
    t->win_total_ns += gap;
    if (t->win_total_ns < THRESHOLD_MINOR_NS)
        return;
    if (streaming(STREAM_MINOR)) {
        struct fault_record *r = reserve(CLS_MINOR);
        if (r) {
            r->ts_ns = t->win_first_ns;
            r->end_ns = now;
            r->total_ns = t->win_total_ns;
            r->address = 0;
            r->tid = (u32)id;
            r->tgid = id >> 32;
            r->cpu = bpf_get_smp_processor_id();
            r->count = t->win_count;
            r->cls = CLS_MINOR;
            r->comm[0] = 0;
            fault_records.ringbuf_submit(r, gj_wake_flags());
        }
    }
    open_window(t, now, 0);
}

/* Every fault's entry: counted as minor (a major completion moves it), timed by storm_read
 * every STORM_READ_EVERY faults of a window. */
static __always_inline int fault_entry(u64 addr)
{
    if ((s64)addr < 0)
        return 0; /* a kernel address: not a fault on user memory */
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!gj_current_watched_cached(id))
        return 0;
    struct thread_faults fresh = {.tgid = tgid};
    struct thread_faults *t = threads.lookup_or_try_init(&tid, &fresh);
    if (!t)
        return 0;
    t->entry_addr = addr;
    t->seen = 0;
    t->wait_ns = 0;
    t->tgid = tgid; /* a recycled thread id may now belong to another process */
    t->count[CLS_MINOR]++;
    if (t->since_read && t->since_read < STORM_READ_EVERY && !t->read_next) {
        t->since_read++;
        t->entry_ns = 0;
        return 0;
    }
    storm_read(t, id, bpf_ktime_get_ns());
    return 0;
}

/* page_fault_user(unsigned long address, struct pt_regs *regs, unsigned long error_code) */
RAW_TRACEPOINT_PROBE(page_fault_user) { return fault_entry(ctx->args[0]); }
/* Faults in kernel mode on user memory too: a read() into an untouched buffer. */
RAW_TRACEPOINT_PROBE(page_fault_kernel) { return fault_entry(ctx->args[0]); }

/* Major faults: classified by what the fault did, timed from its stamp, streamed one by
 * one. Its entry counted it as minor; an address other than the entry's means the entry
 * was not seen (the probe attached mid-fault). */
int on_major_done(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct thread_faults *t = threads.lookup(&tid);
    if (!t || t->entry_addr != ctx->addr)
        return 0;
    if (t->count[CLS_MINOR])
        t->count[CLS_MINOR]--;
    /* from its entry where the clock was read then (outside a storm, always), else from
     * when it began to wait */
    u64 start = t->entry_ns ? t->entry_ns : t->wait_ns;
    t->wait_ns = 0;
    u32 cls = CLS_UNCLASSIFIED;
    if (t->seen & SEEN_FILEMAP)
        cls = CLS_FILE;
    else if (t->seen & SEEN_READ_IO)
        cls = CLS_SWAP;
    t->seen = 0;
    t->count[cls & (CLS_COUNT - 1)]++;
    if (!start) {
        t->untimed++;
        return 0;
    }
    u64 now = bpf_ktime_get_ns();
    u64 dur = now - start;
    timed(t, cls, dur, 1);

    if (cls == CLS_FILE && (dur < THRESHOLD_MAJOR_NS || !streaming(STREAM_FILE)))
        return 0;
    if (cls == CLS_SWAP && (dur < THRESHOLD_SWAPIN_NS || !streaming(STREAM_SWAP)))
        return 0;
    if (cls == CLS_UNCLASSIFIED)
        return 0;
    struct fault_record *r = reserve(cls);
    if (!r)
        return 0;
    r->ts_ns = start;
    r->end_ns = now;
    r->total_ns = dur;
    r->address = t->entry_addr;
    r->tid = tid;
    r->tgid = id >> 32;
    r->cpu = bpf_get_smp_processor_id();
    r->count = 1;
    r->cls = cls;
    bpf_get_current_comm(&r->comm, sizeof(r->comm));
    fault_records.ringbuf_submit(r, gj_wake_flags());
    return 0;
}

/* A file fault or a read during the thread's fault: what kind it is, and (the first of
 * them) when it began to wait. Marks left after a minor fault ended are cleared by the
 * thread's next fault entry, and a major completion only counts the marks of its own. */
static __always_inline void mark_fault(u32 seen)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct thread_faults *t = threads.lookup(&tid);
    if (!t)
        return;
    if (!t->wait_ns)
        t->wait_ns = bpf_ktime_get_ns();
    t->seen |= seen;
}

#ifdef HAVE_FILEMAP_FAULT
/* filemap_fault runs for file-backed faults only; shmem and anonymous memory have their own. */
TRACEPOINT_PROBE(filemap, mm_filemap_fault)
{
    mark_fault(SEEN_FILEMAP);
    return 0;
}
#endif

#ifdef CLASSIFY_SWAP
/* Needs mm_filemap_fault too (the loader defines it only then): file faults read as well.
 * A read submitted by the faulting thread during a fault that is not a file fault: the
 * swap-in read (writes are reclaim swapping other pages out, and are ignored). */
TRACEPOINT_PROBE(block, block_bio_queue)
{
    if (args->rwbs[0] == 'R')
        mark_fault(SEEN_READ_IO);
    return 0;
}
#endif
