"""gpujitter.daemon.analysis: events in, findings out: GPU idle-gap detection, the attribution
engine and its causes, the records both produce, and how they read (words, remedies)."""
