"""The text of a module that bundles several probes' .bpf.c files (probes/bundle.py): each
part's clashing names made its own, its tracepoint programs named after it, its options and
macros confined to it. Compiling and attaching it is tests/kernel/test_startstop.py's."""

from __future__ import annotations

import re
from pathlib import Path

from gpujitter.probes import base
from gpujitter.probes.bundle import ModulePart, bundle_text

ONE = """#include "gpujitter.h"
#define SLOTS 4
struct thread { u64 threads_seen; };
BPF_HASH(threads, u32, struct thread, 16);
static __always_inline int helper(u32 k) { struct thread *t = threads.lookup(&k); return !t; }
RAW_TRACEPOINT_PROBE(sched_switch) { return helper(0) + THRESHOLD_X_NS; }
"""
TWO = """#include "gpujitter.h"
BPF_ARRAY(threads, u64, 1);
struct other { u64 threads; };
static __always_inline int helper(struct other *o) { return o->threads + o[0].threads; }
RAW_TRACEPOINT_PROBE(sched_switch) { return 0; }
TRACEPOINT_PROBE(sched, sched_waking) { return 0; }
"""


def parts(tmp_path: Path) -> list[ModulePart]:
    (tmp_path / "one.bpf.c").write_text(ONE)
    (tmp_path / "two.bpf.c").write_text(TWO)
    return [
        ModulePart("one", tmp_path / "one.bpf.c", ("-DTHRESHOLD_X_NS=5ULL", "-DFLAG")),
        ModulePart("two", tmp_path / "two.bpf.c"),
    ]


def test_names_two_parts_define_are_renamed_in_each(tmp_path: Path) -> None:
    text, renamed = bundle_text(parts(tmp_path))
    # gpujitter.h's per-probe half: the lost counter, and the task filter a part may opt into
    per_probe = {"gj_lost", "gj_count_lost", "gj_task_bits", "gj_task_word", "gj_task_bit"}
    per_probe |= {"gj_task_bit_set", "gj_task_bit_clear", "gj_task_ptr_bit"}
    assert renamed["one"] == renamed["two"] == {"threads", "helper"} | per_probe
    assert "BPF_HASH(one__threads," in text and "BPF_ARRAY(two__threads," in text
    assert "one__threads.lookup(&k)" in text and "return one__helper(0)" in text
    # members of the same name are left alone, and so is a struct only one part defines
    assert "o->threads + o[0].threads" in text and "u64 threads_seen;" in text
    assert "struct thread *t" in text


def test_tracepoint_programs_are_named_after_their_part(tmp_path: Path) -> None:
    text, _ = bundle_text(parts(tmp_path))
    assert text.count("#undef RAW_TRACEPOINT_PROBE") == 2
    assert "int one__raw_tracepoint__##event(" in text
    assert "int two__raw_tracepoint__##event(" in text
    assert "int two__tracepoint__##category##__##event(" in text


def test_options_and_macros_stay_inside_their_part(tmp_path: Path) -> None:
    text, _ = bundle_text(parts(tmp_path))
    one, two = text.split('#line 1 "' + str(tmp_path / "two.bpf.c"))
    assert "#define THRESHOLD_X_NS 5ULL" in one and "#define FLAG" in one
    for macro in ("THRESHOLD_X_NS", "FLAG", "SLOTS"):
        assert f"#undef {macro}" in one
    assert "THRESHOLD_X_NS" not in two
    assert "#undef GJ_MAX_THREADS" not in text  # gpujitter.h's stay for every part


def test_parts_are_announced_and_a_part_calls_what_another_defines(tmp_path: Path) -> None:
    # two's program calls one's function, declared ahead of its definition: the declaration
    # is no definition of two's (renamed, it would name nothing); each part knows its number.
    (tmp_path / "one.bpf.c").write_text(ONE + "static __always_inline int shared_work(u32 k)\n{\n"
                                              "    return helper(k);\n}\n")  # fmt: skip
    (tmp_path / "two.bpf.c").write_text(
        "#ifdef GJ_PART_ONE\nstatic __always_inline int shared_work(u32 k);\n#endif\n"
        "RAW_TRACEPOINT_PROBE(sched_waking) { return shared_work(GJ_THIS_PART); }\n"
    )
    pair = [ModulePart("one", tmp_path / "one.bpf.c"), ModulePart("two", tmp_path / "two.bpf.c")]
    text, renamed = bundle_text(pair)
    assert "shared_work" not in renamed["one"] | renamed["two"]
    assert text.startswith("#define GJ_PART_ONE 1\n#define GJ_PART_TWO 1\n")
    one = text.index("#define GJ_THIS_PART 1")
    assert one < text.index("#undef GJ_THIS_PART") < text.index("#define GJ_THIS_PART 2")


def test_no_probe_calls_bpf_probe_read_user_by_name() -> None:
    # bcc 0.26 rebuilds its table of every kernel symbol at each call of the helper by that
    # name (0.1-0.2 CPU-s a call site, at every start): the probes call gj_read_user
    by_name = re.compile(r"\bbpf_probe_read_user(?:_str)?\s*\(")
    sources = sorted(Path(base.__file__).parent.glob("*.bpf.c"))
    assert sources
    calls = {s.name: by_name.findall(base.bpf_source(s)) for s in sources}
    assert {name: found for name, found in calls.items() if found} == {}
