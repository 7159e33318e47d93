/* faults and swap: page faults of watched threads, timed from entry to completion.
 *
 * Entry: the perf software event "page-faults" (do_user_addr_fault, before the fault is
 * handled); completion: "minor-faults" / "major-faults" (mm_account_fault, once the fault is
 * resolved, retries included), each with a BPF program and sample_period=1, in the faulting
 * thread's context. All three carry the faulting address, which pairs a completion with its
 * entry. During a major fault two tracepoints classify it: filemap:mm_filemap_fault (a file
 * page) and block:block_bio_queue with a read (no file fault, but a read issued: a swap-in).
 *
 * One BPF object serves both registry entries: counters and histograms always run, and the
 * stream_modes map says which records to stream (minor windows and file majors for `faults`,
 * swap-ins for `swap` or, alone, `faults`), so one real fault yields at most one record.
 * Minor faults come in storms: they are summed per thread into windows, streamed when a
 * window's fault time reaches THRESHOLD_MINOR_NS; a window's time includes the stretches
 * between faults that follow each other within THRESHOLD_STORM_GAP_NS. Cost: three perf-event programs run for
 * every fault on the node (a filter lookup for unwatched threads), plus one map lookup per
 * file fault and per block read.
 */
#include "gpujitter.h"

/* The perf-event programs' context, struct bpf_perf_event_data of
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

/* Fault classes: index into counters, histograms and lost counts (FAULT_CLASSES in faults.py). */
enum { CLS_MINOR, CLS_FILE, CLS_SWAP, CLS_UNCLASSIFIED, CLS_COUNT };

/* What the fault in progress did (seen bits). */
#define SEEN_FILEMAP 1
#define SEEN_READ_IO 2

/* stream_modes bits, set by user space as the faults and swap probes start and stop. */
#define STREAM_MINOR 1
#define STREAM_FILE 2
#define STREAM_SWAP 4

struct thread_faults {
    u64 entry_ns;      /* fault in progress began; 0 when none */
    u64 entry_addr;
    u64 win_first_ns;  /* current minor-fault window */
    u64 win_last_ns;
    u64 win_total_ns;
    u32 win_count;
    u32 seen;
    u32 tgid;
    u32 untimed;       /* completions whose entry was not seen */
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

int on_fault_entry(struct bpf_perf_event_data *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = (u32)id;
    if (!gj_tgid_watched(tgid))
        return 0;
    struct thread_faults fresh = {.tgid = tgid};
    struct thread_faults *t = threads.lookup_or_try_init(&tid, &fresh);
    if (!t)
        return 0;
    t->entry_ns = bpf_ktime_get_ns();
    t->entry_addr = ctx->addr;
    t->seen = 0;
    t->tgid = tgid; /* a recycled thread id may now belong to another process */
    return 0;
}

static __always_inline void account(struct thread_faults *t, u32 cls, u64 dur)
{
    cls &= CLS_COUNT - 1;
    t->count[cls]++;
    t->total_ns[cls] += dur;
    u32 slot = cls * 64 + bpf_log2l(dur);
    u64 *n = fault_ns_log2.lookup(&slot);
    if (n)
        (*n)++;
}

/* Minor faults: summed into the thread's window. A window spans at most
 * THRESHOLD_MINOR_WINDOW_NS; one that ends below the threshold is dropped (its faults stay
 * in the counters and histograms). */
static __always_inline void minor_done(struct thread_faults *t, u64 id, u64 start, u64 now)
{
    u64 dur = now - start;
    account(t, CLS_MINOR, dur);
    if (t->win_count && now - t->win_first_ns > THRESHOLD_MINOR_WINDOW_NS)
        t->win_count = 0;
    if (!t->win_count) {
        t->win_first_ns = start;
        t->win_total_ns = 0;
    } else if (start >= t->win_last_ns && start - t->win_last_ns < THRESHOLD_STORM_GAP_NS) {
        /* Back to back with the window's previous fault: the return to user space and the
         * next trap in between, which no hook times, are the storm's cost too. */
        t->win_total_ns += start - t->win_last_ns;
    }
    t->win_last_ns = now;
    t->win_count++;
    t->win_total_ns += dur;
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
            fault_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
        }
    }
    t->win_count = 0;
}

/* Major faults: classified by what the fault did, streamed one by one. */
static __always_inline void major_done(struct thread_faults *t, u64 id, u64 start, u64 now)
{
    u64 dur = now - start;
    u32 cls = CLS_UNCLASSIFIED;
    if (t->seen & SEEN_FILEMAP)
        cls = CLS_FILE;
    else if (t->seen & SEEN_READ_IO)
        cls = CLS_SWAP;
    account(t, cls, dur);

    if (cls == CLS_FILE && (dur < THRESHOLD_MAJOR_NS || !streaming(STREAM_FILE)))
        return;
    if (cls == CLS_SWAP && (dur < THRESHOLD_SWAPIN_NS || !streaming(STREAM_SWAP)))
        return;
    if (cls == CLS_UNCLASSIFIED)
        return;
    struct fault_record *r = reserve(cls);
    if (!r)
        return;
    r->ts_ns = start;
    r->end_ns = now;
    r->total_ns = dur;
    r->address = t->entry_addr;
    r->tid = (u32)id;
    r->tgid = id >> 32;
    r->cpu = bpf_get_smp_processor_id();
    r->count = 1;
    r->cls = cls;
    bpf_get_current_comm(&r->comm, sizeof(r->comm));
    fault_records.ringbuf_submit(r, BPF_RB_NO_WAKEUP);
}

/* A completion ends the fault whose entry the thread recorded; none is recorded for
 * unwatched threads, and an address that differs from the entry's means the entry was
 * missed (counted as untimed). */
static __always_inline int fault_done(struct bpf_perf_event_data *ctx, bool major)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct thread_faults *t = threads.lookup(&tid);
    if (!t || !t->entry_ns)
        return 0;
    u64 start = t->entry_ns;
    t->entry_ns = 0;
    if (t->entry_addr != ctx->addr) {
        t->untimed++;
        return 0;
    }
    u64 now = bpf_ktime_get_ns();
    if (major)
        major_done(t, id, start, now);
    else
        minor_done(t, id, start, now);
    return 0;
}

int on_minor_done(struct bpf_perf_event_data *ctx) { return fault_done(ctx, false); }
int on_major_done(struct bpf_perf_event_data *ctx) { return fault_done(ctx, true); }

static __always_inline void mark_fault(u32 seen)
{
    u32 tid = (u32)bpf_get_current_pid_tgid();
    struct thread_faults *t = threads.lookup(&tid);
    if (t && t->entry_ns)
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
