/* python_stacks' sample budget: whether a thread's period that just ended is sampled. Kept
 * apart from the walk (python_stacks.bpf.c) so that the unit tests compile this same code
 * with cc and drive it with periods ending at times of their choosing
 * (tests/unit/test_python_stacks_budget.py). Needs u32/u64/s64, bool, bpf_get_prandom_u32
 * and, as -D, THRESHOLD_SPACING_NS, OTHERS_SPACING_NS, BURST_SAMPLES, THIN_WINDOW_NS, THIN_PCT.
 *
 * A cap: one sample per THRESHOLD_SPACING_NS in all, bursts of BURST_SAMPLES at most; while
 * feeders are known the others together get one per OTHERS_SPACING_NS of it. A cap alone
 * goes to whichever timer fires once it has refilled, so with more demand than budget the
 * timers' phases set the shares (a thread whose period ends just after another's can get
 * none). So a non-feeder's period first passes a random thinning: it stays a candidate with
 * the chance (the rate the non-feeders may take) / (the rate their periods ended at in the
 * last THIN_WINDOW_NS), the same for every period, so each thread's samples follow its CPU
 * time; the cap then takes what is left and refuses little (the candidates arrive at about
 * its rate, at random times). Feeders are not thinned: every period of theirs is sampled
 * while the cap allows.
 */
#ifndef PYTHON_STACKS_BUDGET_H
#define PYTHON_STACKS_BUDGET_H

#define PY_MAX_WINDOW_NS 1000000000ULL /* a longer quiet stretch counts as this: no overflow */

struct py_budget {
    u64 last_ns;
    s64 credit_ns;          /* all threads */
    s64 others_ns;          /* the non-feeders, while feeders are known */
    u64 window_ns;          /* when the window counting the non-feeders' periods began */
    u64 periods;            /* the non-feeders' periods ended in it */
    u64 skip;               /* the chance to drop one, in 2^-32, from the window before */
};

/* Whether a non-feeder's period is dropped before the cap: at random, with the chance set
 * at the end of the window before from its periods and its span. None is dropped while the
 * periods come slower than the spacing allowed; faster, the candidates are aimed at
 * THIN_PCT % of that rate, so that the cap, which refuses by arrival order, rarely binds. */
static inline bool py_thinned(struct py_budget *b, u64 now, u64 spacing_ns)
{
    u64 span = now - b->window_ns;
    if (span >= THIN_WINDOW_NS) {
        if (span > PY_MAX_WINDOW_NS)
            span = PY_MAX_WINDOW_NS;
        u64 asked = b->periods * spacing_ns;
        b->skip = asked > span ? (1ULL << 32) - (span << 32) / asked * THIN_PCT / 100 : 0;
        b->window_ns = now;
        b->periods = 0;
    }
    b->periods++;
    return bpf_get_prandom_u32() < b->skip;
}

/* Whether the budget allows a sample of a thread's period that ended at `now`; spends it if
 * so. feeder: the thread feeds; known: feeders are known. */
static inline bool py_budget_spend(struct py_budget *b, u64 now, bool feeder, bool known)
{
    bool held = !feeder && known;
    if (!feeder && py_thinned(b, now, held ? OTHERS_SPACING_NS : THRESHOLD_SPACING_NS))
        return false;
    s64 elapsed = b->last_ns ? (s64)(now - b->last_ns) : BURST_SAMPLES * THRESHOLD_SPACING_NS;
    b->last_ns = now;
    s64 credit = b->credit_ns + elapsed, others = b->others_ns + elapsed;
    if (credit > BURST_SAMPLES * THRESHOLD_SPACING_NS)
        credit = BURST_SAMPLES * THRESHOLD_SPACING_NS;
    if (others > BURST_SAMPLES * OTHERS_SPACING_NS)
        others = BURST_SAMPLES * OTHERS_SPACING_NS;
    bool take = credit >= THRESHOLD_SPACING_NS;
    if (take && held) {
        take = others >= OTHERS_SPACING_NS;
        if (take)
            others -= OTHERS_SPACING_NS;
    }
    if (take)
        credit -= THRESHOLD_SPACING_NS;
    b->credit_ns = credit;
    b->others_ns = others;
    return take;
}

#endif
