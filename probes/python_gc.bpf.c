/* python_gc: CPython cyclic-GC collections of watched threads, from the interpreter's USDT
 * markers python:gc__start (arg: generation) and python:gc__done (arg: objects collected),
 * or, in a build without them, a uprobe and uretprobe on its collector function.
 *
 * Each collection is timed per thread in the kernel: those of THRESHOLD_PAUSE_NS or more are
 * streamed, the others land in a log2 histogram per generation. Collections count per
 * generation. Cost: two uprobe hits per collection (a USDT marker is a nop, emulated without
 * single-stepping), none between collections.
 *
 * Interpreters: one slot per distinct interpreter file (MAX_INTERPRETERS), where that build
 * keeps the markers' arguments (interp_args[slot], written by python_gc.py from the stapsdt
 * note). A marker's program learns the slot from its uprobe-multi link's cookie; on a kernel
 * without such links (< 6.6), from being that slot's own copy (GJ_PER_SLOT: SLOT_PROGRAMS
 * pairs, each ~20 ms of the start's compile).
 */
#include "gpujitter.h"

/* GENERATIONS (python_gc.py): histogram/count slot GENERATIONS is "generation unknown". */
#define LOG2_SLOTS 65

/* Where a marker's argument lives, from its stapsdt spec ("-4@112(%rsp)", "-8@%r12").
 * reg: GC_REG_AX .. GC_REG_IP, one per register read below (REGISTERS in python_gc.py), or
 * REG_NONE: the spec is a constant, `off`. */
struct gc_arg {
    s64 off;      /* displacement from the register (deref) or the constant */
    u8 reg;
    u8 deref;     /* the value is in memory at reg + off */
    u8 size;      /* bytes: 1, 2, 4, 8 */
    u8 is_signed;
    u8 valid;     /* 0: the build gives no usable location; the value reads as -1 */
    u8 pad[3];
};
struct gc_args {
    struct gc_arg generation;
    struct gc_arg collected;
};
BPF_ARRAY(interp_args, struct gc_args, MAX_INTERPRETERS);

struct gc_running {
    u64 ts_ns;
    s32 generation;
    u32 pad;
};
BPF_HASH(running, u32, struct gc_running, GJ_MAX_THREADS);

struct gc_event {
    u64 ts_ns;
    u64 dur_ns;
    s64 collected;
    u32 tid;
    u32 tgid;
    u32 cpu;
    s32 generation;
};
BPF_RINGBUF_OUTPUT(gc_events, 8);

/* Collections below the threshold, slot generation slot * LOG2_SLOTS + log2(ns), as one
 * entry of a per-CPU array: user space copies them in one lookup (probes/log2.py). */
struct gc_hists {
    u64 n[(GENERATIONS + 1) * LOG2_SLOTS];
};
BPF_PERCPU_ARRAY(short_log2, struct gc_hists, 1);
/* collections per generation slot, all durations */
BPF_PERCPU_ARRAY(collections, u64, GENERATIONS + 1);

/* The x86-64 registers a stapsdt spec names, by their index in REGISTERS (python_gc.py).
 * Read from a copy of the registers: a switch on ctx's own fields compiles into arithmetic on
 * the ctx pointer, which the verifier refuses. */
static __always_inline u64 reg_value(struct pt_regs *regs, u8 reg)
{
    switch (reg) {
    case GC_REG_AX: return regs->ax;
    case GC_REG_BX: return regs->bx;
    case GC_REG_CX: return regs->cx;
    case GC_REG_DX: return regs->dx;
    case GC_REG_SI: return regs->si;
    case GC_REG_DI: return regs->di;
    case GC_REG_BP: return regs->bp;
    case GC_REG_SP: return regs->sp;
    case GC_REG_R8: return regs->r8;
    case GC_REG_R9: return regs->r9;
    case GC_REG_R10: return regs->r10;
    case GC_REG_R11: return regs->r11;
    case GC_REG_R12: return regs->r12;
    case GC_REG_R13: return regs->r13;
    case GC_REG_R14: return regs->r14;
    case GC_REG_R15: return regs->r15;
    case GC_REG_IP: return regs->ip;
    }
    return 0;
}

/* The register is read once, whether it holds the value or its address: each of the 16 entry
 * programs inlines this, and a second register switch cost ~0.2 CPU-s of the compile. */
static __always_inline s64 read_arg(struct pt_regs *ctx, struct gc_arg *a)
{
    if (!a->valid)
        return -1;
    u64 raw = a->off;
    if (a->reg != REG_NONE) {
        struct pt_regs regs = {};
        if (bpf_probe_read_kernel(&regs, sizeof(regs), ctx))
            return -1;
        raw = reg_value(&regs, a->reg);
        if (a->deref) {
            /* 8 bytes whatever the size (truncated below): a constant size for the verifier */
            u64 where = raw + a->off;
            raw = 0;
            if (gj_read_user(&raw, sizeof(raw), (void *)where))
                return -1;
        }
    }
    switch (a->size) {
    case 1: return a->is_signed ? (s64)(s8)raw : (s64)(u8)raw;
    case 2: return a->is_signed ? (s64)(s16)raw : (s64)(u16)raw;
    case 4: return a->is_signed ? (s64)(s32)raw : (s64)(u32)raw;
    }
    return (s64)raw;
}

static __always_inline int begin(s64 generation)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!gj_current_watched_cached(id))
        return 0;
    u32 tid = (u32)id;
    struct gc_running r = {.ts_ns = bpf_ktime_get_ns(), .generation = (s32)generation};
    running.update(&tid, &r);
    return 0;
}

static __always_inline int end(s64 collected)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    struct gc_running *r = running.lookup(&tid);
    if (!r)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 dur = now - r->ts_ns;
    s32 gen = r->generation;
    u32 slot = gen >= 0 && gen < GENERATIONS ? gen : GENERATIONS;
    u64 *n = collections.lookup(&slot);
    if (n)
        (*n)++;
    if (dur >= THRESHOLD_PAUSE_NS) {
        struct gc_event *e = gc_events.ringbuf_reserve(sizeof(*e));
        if (!e) {
            gj_count_lost();
        } else {
            e->ts_ns = r->ts_ns;
            e->dur_ns = dur;
            e->collected = collected;
            e->tid = tid;
            e->tgid = id >> 32;
            e->cpu = bpf_get_smp_processor_id();
            e->generation = gen;
            gc_events.ringbuf_submit(e, gj_wake_flags());
        }
    } else {
        u32 h = slot * LOG2_SLOTS + bpf_log2l(dur), zero = 0;
        struct gc_hists *hists = short_log2.lookup(&zero);
        if (hists && h < (GENERATIONS + 1) * LOG2_SLOTS)
            hists->n[h]++;
    }
    running.delete(&tid);
    return 0;
}

static __always_inline int on_marker(struct pt_regs *ctx, u32 interp, bool start)
{
    struct gc_args *args = interp_args.lookup(&interp);
    if (!args)
        return 0;
    if (start)
        return begin(read_arg(ctx, &args->generation));
    return end(read_arg(ctx, &args->collected));
}

#ifdef GJ_PER_SLOT
/* Per interpreter slot, its USDT markers: gc_start_N, gc_done_N (SLOT_PROGRAMS of them). */
#define GJ_INTERP(i)                                                           \
    int gc_start_##i(struct pt_regs *ctx) { return on_marker(ctx, i, true); } \
    int gc_done_##i(struct pt_regs *ctx) { return on_marker(ctx, i, false); }
GJ_INTERP(0) GJ_INTERP(1) GJ_INTERP(2) GJ_INTERP(3)
GJ_INTERP(4) GJ_INTERP(5) GJ_INTERP(6) GJ_INTERP(7)
#else
/* Every interpreter's markers: the link's cookie is the slot. */
int gc_start_any(struct pt_regs *ctx) { return on_marker(ctx, bpf_get_attach_cookie(ctx), true); }
int gc_done_any(struct pt_regs *ctx) { return on_marker(ctx, bpf_get_attach_cookie(ctx), false); }
#endif

/* A build without the markers: entry to and return from its collector function (the
 * generation is the second argument of gc_collect_main in CPython 3.8-3.12, the return
 * value the objects collected and uncollectable). */
int gc_enter(struct pt_regs *ctx) { return begin((s32)PT_REGS_PARM2(ctx)); }
int gc_leave(struct pt_regs *ctx) { return end((s64)PT_REGS_RC(ctx)); }
