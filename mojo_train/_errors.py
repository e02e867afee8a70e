"""Error-message helpers shared by mojo_train modules.

Contract: every user-facing error names where it came from with the
prefix ``mojo_train.<where>:`` so a message read out of context still
says which entry point refused the input.
"""


def where_msg(where, text):
    """Return ``text`` prefixed with ``mojo_train.<where>:``."""
    return "mojo_train.%s: %s" % (where, text)
