"""The bench's one error: it cannot run as asked (one line for the user, exit 1)."""


class BenchError(RuntimeError):
    """The bench cannot run as asked; one line for the user."""
