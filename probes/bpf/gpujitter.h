/* Shared by every probe's .bpf.c: the watched set, the CPU -> NUMA node map and the
 * lost-event counter. The maps are owned by watch.bpf.c (loaded first, exported to the
 * process); probes reference them as extern, so one user-space update reaches all probes.
 *
 * The loader pastes this file into each .bpf.c (bcc rewrites map calls only in the main
 * file). Options arrive as -D flags from the loader (thresholds in ns).
 */
#ifndef GPUJITTER_H
#define GPUJITTER_H

#include <uapi/linux/ptrace.h>

/* Not <linux/sched.h> for this: clang parsing it took 0.75 s of each probe's ~1.1 s compile
 * (docs/performance.md); a probe that needs kernel structures includes their header itself. */
#ifndef TASK_COMM_LEN
#define TASK_COMM_LEN 16
#endif

/* bpf_probe_read_user under a name of ours: bcc 0.26's rewriter rebuilds a hash of all the
 * kernel's symbols (~120k) at every call it sees by that name (a check of the helper that
 * only matters on s390x), 0.1-0.2 CPU-s a call site: the four in the probes cost ~0.6 s of
 * each start (docs/performance.md). On a kernel without the helper (before 5.5), bcc's
 * prologue defines the name as a macro for bpf_probe_read: the same fallback here. */
#ifdef bpf_probe_read_user
#define gj_read_user bpf_probe_read
#else
static long (*gj_read_user)(void *dst, u32 size, const void *unsafe_ptr) =
    (void *)BPF_FUNC_probe_read_user;
#endif

#define GJ_MAX_WATCHED 16384
#define GJ_MAX_CPUS 1024
#define GJ_MAX_THREADS 65536

/* gj_config's slots GJ_CFG_FLAGS, GJ_CFG_SELF_TGID, GJ_CFG_GEN and the GJ_CFG_FLAGS bit
 * GJ_WATCH_ALL are defined ahead of this header by the loader (probes/contract.py). */

#ifdef GJ_CORE
BPF_TABLE_PUBLIC("hash", u32, u8, gj_watched, GJ_MAX_WATCHED);
BPF_TABLE_PUBLIC("array", u32, u64, gj_config, 4);
BPF_TABLE_PUBLIC("array", u32, u32, gj_cpu_node, GJ_MAX_CPUS);
BPF_TABLE_PUBLIC("array", u32, u64, gj_pending, 1);
#else
BPF_TABLE("extern", u32, u8, gj_watched, GJ_MAX_WATCHED);
BPF_TABLE("extern", u32, u64, gj_config, 4);
BPF_TABLE("extern", u32, u32, gj_cpu_node, GJ_MAX_CPUS);
BPF_TABLE("extern", u32, u64, gj_pending, 1);
#endif

/* Ring-buffer use, in every probe (bcc rewrites map calls, so no macro can wrap them):
 *     struct rec *e = ring.ringbuf_reserve(sizeof(*e));
 *     if (!e) { gj_count_lost(); return 0; }
 *     ...
 *     ring.ringbuf_submit(e, gj_wake_flags());
 * User space drains the rings on a timer (probes/runner.py), so a record wakes nobody
 * (BPF_RB_NO_WAKEUP: no wake-up, a syscall and a context switch, per record) unless the
 * records since the last drain, counted across all rings in gj_pending (zeroed by user
 * space after each drain), reach GJ_WAKE_RECORDS: the first record to find the count there
 * wakes the drain early, so a burst cannot fill a ring while the timer waits, and latches
 * the count (GJ_WOKEN), so that a burst costs one wake-up a drain, not one a record. 256 is
 * half of the smallest ring's records (8 pages of 64-byte records). Two records that race
 * may both wake (harmless). A record is rare next to the events the probes filter (≤ 5k a
 * second by design), so the shared line costs little. */
#define GJ_WAKE_RECORDS 256
#define GJ_WOKEN (1ULL << 62)

static __always_inline u64 gj_config_get(u32 slot)
{
    u64 *v = gj_config.lookup(&slot);
    return v ? *v : 0;
}

/* Is process `tgid` watched? The idle task and gpujitter itself never are. */
static __always_inline bool gj_tgid_watched(u32 tgid)
{
    if (tgid == 0 || tgid == (u32)gj_config_get(GJ_CFG_SELF_TGID))
        return false;
    if (gj_config_get(GJ_CFG_FLAGS) & GJ_WATCH_ALL)
        return true;
    return gj_watched.lookup(&tgid) != NULL;
}

static __always_inline bool gj_current_watched(void)
{
    return gj_tgid_watched(bpf_get_current_pid_tgid() >> 32);
}

/* The watched-set answer for the current thread, cached per CPU for the thread asked about
 * last under the watched set's generation (GJ_CFG_GEN): the same thread is asked about again
 * and again on a CPU (every fault of a storm, every switch-out of a ping-pong's end), and the
 * hash lookup behind gj_tgid_watched cost ~100 ns a time on the development VM
 * (docs/performance.md). `id` is bpf_get_current_pid_tgid(). */
struct gj_watch_cache {
    u64 gen;
    u32 tid;
    u32 watched;
};
BPF_PERCPU_ARRAY(gj_watch_cache, struct gj_watch_cache, 1);

static __always_inline bool gj_current_watched_cached(u64 id)
{
    /* The idle task (an interrupt that woke an idle CPU, the idle side of every switch) is
     * answered before the cache: asked about in between, it would evict the thread the CPU
     * runs otherwise, and each return of that thread would miss. */
    if (!(u32)id)
        return false;
    u32 zero = 0, slot = GJ_CFG_GEN;
    u64 *gen = gj_config.lookup(&slot);
    struct gj_watch_cache *c = gj_watch_cache.lookup(&zero);
    if (!gen || !c)
        return gj_tgid_watched(id >> 32);
    if (c->tid == (u32)id && c->gen == *gen)
        return c->watched;
    c->gen = *gen;
    c->tid = (u32)id;
    c->watched = gj_tgid_watched(id >> 32);
    return c->watched;
}

/* The watched set changed: lookups cached under the previous generation are stale. */
static __always_inline void gj_watched_changed(void)
{
    u32 slot = GJ_CFG_GEN;
    u64 *gen = gj_config.lookup(&slot);
    if (gen)
        __sync_fetch_and_add(gen, 1);
}

/* The flags for a record's ringbuf_submit: see "Ring-buffer use" above. */
static __always_inline u64 gj_wake_flags(void)
{
    u32 zero = 0;
    u64 *n = gj_pending.lookup(&zero);
    if (!n)
        return BPF_RB_NO_WAKEUP;
    __sync_fetch_and_add(n, 1);
    if (*n < GJ_WAKE_RECORDS || *n >= GJ_WOKEN)
        return BPF_RB_NO_WAKEUP;
    *n = GJ_WOKEN; /* one wake-up until user space zeroes the count */
    return BPF_RB_FORCE_WAKEUP;
}

/* A watched thread's wake-up onto an idle CPU, as cstate's share of a switch-in hands it to
 * the probe that carries that share (sched), for the record that probe streams anyway: one
 * record where there were two (cstate.bpf.c, woken_in). state: the idle state plus one; 0:
 * none to report. */
struct gj_idle_wake {
    u64 idle_ns;
    u64 in_state_ns;
    u32 state;
};

/* NUMA node of a CPU as user space configured it (topology override honoured); 0 if unset. */
static __always_inline u32 gj_node_of(u32 cpu)
{
    u32 *node = gj_cpu_node.lookup(&cpu);
    return node ? *node : 0;
}

#endif /* GPUJITTER_H */

/* Per probe, so outside the guard: a module of several probes (probes/bundle.py) has this
 * once for each, under names of that probe. */

#ifdef GJ_TASK_BITS
/* A probe's filter in front of its per-thread hash, for hooks that name a task other than
 * current (the thread switched in, the thread woken): one bit per key, set (atomically: a
 * lost set would hide a thread) when the probe enters a thread in its hash, tested before
 * the hash is. An array lookup is inlined by the verifier; the hash lookup it saves on
 * every event of a task the probe never entered cost 50-100 ns here (docs/performance.md).
 * 2^22 bits (PID_MAX_LIMIT: one per thread id), 512 KiB. */
#define GJ_TASK_BITS_WORDS (1 << 16)
BPF_ARRAY(gj_task_bits, u64, GJ_TASK_BITS_WORDS);

static __always_inline u64 *gj_task_word(u32 bit)
{
    u32 word = (bit >> 6) & (GJ_TASK_BITS_WORDS - 1);
    return gj_task_bits.lookup(&word);
}

static __always_inline bool gj_task_bit(u32 bit)
{
    u64 *w = gj_task_word(bit);
    return w && (*w >> (bit & 63)) & 1;
}

static __always_inline void gj_task_bit_set(u32 bit)
{
    u64 *w = gj_task_word(bit);
    u64 mask = 1ULL << (bit & 63);
    if (w && !(*w & mask)) /* tested first: a write would dirty a line other CPUs read */
        __sync_fetch_and_or(w, mask);
}

static __always_inline void gj_task_bit_clear(u32 bit)
{
    u64 *w = gj_task_word(bit);
    u64 mask = 1ULL << (bit & 63);
    if (w && (*w & mask))
        __sync_fetch_and_and(w, ~mask);
}

/* A task pointer's bit (Fibonacci hashing onto the 2^22): for hooks that hand over task
 * pointers, so that a task the probe never entered costs no read through its pointer.
 * task_structs are slab objects reused in place: a probe clears a task's bit at its last
 * switch, or the task that takes its place next passes the filter at every event. */
static __always_inline u32 gj_task_ptr_bit(u64 task)
{
    return (u32)((task * 0x9E3779B97F4A7C15ULL) >> 42);
}
#endif

/* Events this probe lost, per CPU: ring-buffer reserve failures, and what its maps could not
 * hold (a full map, malloc's call displaced from its slot); user space sums and reports them. */
BPF_PERCPU_ARRAY(gj_lost, u64, 1);

static __always_inline void gj_count_lost(void)
{
    u32 zero = 0;
    u64 *n = gj_lost.lookup(&zero);
    if (n)
        (*n)++;
}
