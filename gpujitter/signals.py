"""The daemon's signals besides SIGTERM and SIGINT, named once for the CLI (which ignores them
while `run` imports and starts) and the runtime (which takes them once it runs)."""

import signal

# Reopen the log and start a new trace file: SIGHUP (systemctl reload), and SIGUSR1, the
# convention of nginx and others that a logrotate postrotate may follow.
RELOAD_SIGNALS = (signal.SIGHUP, signal.SIGUSR1)
# Signals whose default would end the daemon unflushed, which mean nothing to it: a `kill
# -USR2` or an alarm meant for something else. Ignored, each said once.
STRAY_SIGNALS = (signal.SIGUSR2, signal.SIGALRM, signal.SIGVTALRM, signal.SIGPROF, signal.SIGIO)
