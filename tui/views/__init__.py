"""The app's views (GPUs, Gaps, CPUs, Audit), the gap breakdown and the status line. Each view
draws from the NodeModel when told that its part changed; none of them reads a socket."""
