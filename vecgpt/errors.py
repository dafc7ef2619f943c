"""The one exception type the CLI turns into a one-line message and a non-zero exit."""


class VecgptError(Exception):
    """A problem the user can fix; the message says how."""


class TextConflict(VecgptError):
    """A text's record changed since this process read it: another process wrote it."""
