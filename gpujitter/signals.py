"""The daemon's signals, named once for the CLI (which takes them while `run` imports and
starts) and the runtime (which takes them once it runs): what stops it, and before its probes
are attached how; what reopens its files; what it ignores."""

import os
import signal
import sys

# Stop the daemon: flushed and closed once its probes are attached, at once before
# (stop_while_starting).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOPPED_WHILE_STARTING = 130  # the exit status of a stop before the probes are attached
# Reopen the log and start a new trace file: SIGHUP (systemctl reload), and SIGUSR1, the
# convention of nginx and others that a logrotate postrotate may follow.
RELOAD_SIGNALS = (signal.SIGHUP, signal.SIGUSR1)
# Signals whose default would end the daemon unflushed, which mean nothing to it: a `kill
# -USR2` or an alarm meant for something else. Ignored, each said once.
STRAY_SIGNALS = (signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO)


def stop_while_starting(signum: int, frame: object) -> None:
    """A stop before the probes are attached (their compile, seconds of clang on a thread,
    cannot be cut short): one line and STOPPED_WHILE_STARTING at once. Nothing has been
    analysed or written yet, and what BPF the process holds the kernel detaches as its
    descriptors close. By the default action the process died with no word (143). Written
    with os.write and left by os._exit: the handler may run inside a print of the main
    thread, and an interpreter's exit tears down LLVM under the compile's thread."""
    line = (f"# stopped by {signal.Signals(signum).name} while starting, before the probes "
            "were attached: nothing was analysed or written\n")  # fmt: skip
    # While the compile captures fd 2 (clang's messages), stderr writes through a copy of it.
    target = getattr(sys.stderr, "target_fd", None)
    try:
        os.write(2 if target is None else target(), line.encode())
    finally:
        os._exit(STOPPED_WHILE_STARTING)
