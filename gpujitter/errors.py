"""The one exception type that reaches users as a one-line message instead of a traceback."""


class GpujitterError(Exception):
    """Bad input or an unusable environment, said in one line the user can act on."""
