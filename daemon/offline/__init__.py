"""gpujitter.daemon.offline: what the offline commands read (any recording gpujitter writes, as
one stream of events) and the views they write of it (Perfetto timeline, HTML report)."""
