"""What the daemon hands back after compiling its probes: the compiler's read-only code, and
nothing of Python's, nor any mapping it wrote to."""

from __future__ import annotations

from gpujitter.probes.base import compiler_code
from gpujitter.probes.procfs import parse_maps

# /proc/PID/maps of a daemon after its compile (Debian's bcc: LLVM and clang as libraries).
MAPS = """\
55d0c0a00000-55d0c0a6b000 r--p 00000000 fe:01 1311       /usr/bin/python3.11
55d0c0a6b000-55d0c0d2c000 r-xp 0006b000 fe:01 1311       /usr/bin/python3.11
7f1a20000000-7f1a21000000 rw-p 00000000 00:00 0
7f1a30000000-7f1a30800000 r--p 00000000 fe:01 2200       /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f1a30800000-7f1a33000000 r-xp 00800000 fe:01 2200       /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f1a33000000-7f1a33100000 rw-p 03000000 fe:01 2200       /usr/lib/x86_64-linux-gnu/libLLVM-14.so.1
7f1a34000000-7f1a35000000 r-xp 00000000 fe:01 2300       /usr/lib/llvm-14/lib/libclang-cpp.so.14
7f1a36000000-7f1a36100000 r-xp 00000000 fe:01 2400       /usr/lib/x86_64-linux-gnu/libbcc.so.0.26.0
7f1a37000000-7f1a37100000 r-xp 00000000 fe:01 2500       /usr/lib/x86_64-linux-gnu/libc.so.6
7f1a38000000-7f1a38001000 ---p 00000000 00:00 0
7ffd1000000-7ffd1021000 rw-p 00000000 00:00 0            [stack]
"""


def test_only_the_compilers_read_only_mappings_are_chosen() -> None:
    assert compiler_code(parse_maps(MAPS)) == [
        (0x7F1A30000000, 0x800000),
        (0x7F1A30800000, 0x2800000),
        (0x7F1A34000000, 0x1000000),
        (0x7F1A36000000, 0x100000),
    ]


def test_a_file_named_like_the_compiler_in_a_path_is_not_the_compiler() -> None:
    line = "7f1a36000000-7f1a36100000 r-xp 00000000 fe:01 9 /opt/libLLVM-stuff/libfoo.so\n"
    assert compiler_code(parse_maps(line)) == []
