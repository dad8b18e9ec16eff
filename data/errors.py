"""The one exception the data pipeline raises for problems a user can fix."""


class DataError(Exception):
    """Bad input data or data files.

    The message is meant to be shown as is, on one line: it names the file at fault and says what to
    do about it. `python -m data.prepare` prints it to stderr and exits with status 2.
    """
