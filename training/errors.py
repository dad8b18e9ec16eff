"""The one exception training raises for problems a user can fix."""


class RunError(Exception):
    """A problem with the run's settings or output directory; the message is one line."""
