"""gpujitter.tui: the Textual app, a client of the daemon's stream or of a recorded trace."""
