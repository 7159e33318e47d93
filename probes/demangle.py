"""C++ names as their source spells them (at::native::add_kernel(...)), through the C++
runtime's own demangler (libstdc++'s __cxa_demangle, loaded once through ctypes); a name
stays as it is where that library is missing or the name does not demangle. Since GCC 10
that demangler bounds its own work (names over ~1 KB, deep nesting: refused, status -2),
which a name in a file that any user's process maps needs."""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable

RUNTIME = "libstdc++.so.6"
MANGLED_PREFIX = "_Z"  # the Itanium C++ ABI's mark of a mangled name

Demangler = Callable[[bytes], bytes | None]


@functools.cache
def _runtime_demangler(library: str) -> Demangler | None:
    """The __cxa_demangle of C++ runtime `library` as a function of a mangled name (None:
    it does not demangle); None when that library cannot be loaded."""
    try:
        runtime, libc = ctypes.CDLL(library), ctypes.CDLL(None)
        cxa_demangle, free = runtime.__cxa_demangle, libc.free
    except (OSError, AttributeError):
        return None
    cxa_demangle.restype = ctypes.c_void_p  # freed here, so not converted to bytes by ctypes
    cxa_demangle.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_int)]  # fmt: skip
    free.restype, free.argtypes = None, [ctypes.c_void_p]

    def demangled(name: bytes) -> bytes | None:
        status = ctypes.c_int(0)
        out = cxa_demangle(name, None, None, ctypes.byref(status))
        if not out:
            return None
        try:
            return ctypes.string_at(out) if status.value == 0 else None
        finally:
            free(out)

    return demangled


def demangle(name: str, runtime: str = RUNTIME) -> str:
    """`name` demangled by C++ runtime library `runtime` where it is a mangled C++ name that
    demangles, else `name` itself."""
    if not name.startswith(MANGLED_PREFIX):
        return name
    run = _runtime_demangler(runtime)
    out = run(name.encode(errors="replace")) if run is not None else None
    return out.decode(errors="replace") if out else name
