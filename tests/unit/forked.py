"""Running a call as a user with fewer rights than the test's (root in CI), in a forked child:
what it returned, or what escaped it, comes back pickled."""

from __future__ import annotations

import ctypes
import os
import pickle
from collections.abc import Callable

NOBODY = 65534
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2  # linux/capability.h


def as_nobody() -> None:
    """Become nobody: another user's files (mode 0640, root's) refuse it."""
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def without_dac_override() -> None:
    """Stay root but meet permission bits: files made unreadable (chmod 0) refuse it, while
    pytest's private tmp_path, which root owns, can still be walked."""
    libc = ctypes.CDLL(None, use_errno=True)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    caps = (ctypes.c_uint32 * 6)()  # (effective, permitted, inheritable) x 2
    libc.capget(header, caps)
    caps[0] &= ~(1 << CAP_DAC_OVERRIDE | 1 << CAP_DAC_READ_SEARCH)
    if libc.capset(header, caps):
        raise OSError(ctypes.get_errno(), "capset")


def in_child(call: Callable[[], object], become: Callable[[], None]) -> object:
    """What `call` returns in a forked child that first runs `become` (when this process is
    root; a user who is not already has fewer rights); an exception that escapes it comes
    back as "escaped: TYPE: MESSAGE"."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: everything it needs is imported already
        try:
            os.close(read)
            try:
                if os.geteuid() == 0:
                    become()
                said: object = call()
            except BaseException as err:  # what escaped is the finding
                said = f"escaped: {type(err).__name__}: {err}"
            os.write(write, pickle.dumps(said))
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        said = pickle.loads(f.read())
    os.waitpid(pid, 0)
    return said
