"""Error-message helpers shared by mojo_train modules.

Contract: every user-facing error names where it came from with the
prefix ``mojo_train.<where>:`` so a message read out of context still
says which entry point refused the input.
"""


def where_msg(where, text):
    """Return ``text`` prefixed with ``mojo_train.<where>:``."""
    return "mojo_train.%s: %s" % (where, text)


def refuse_keywords(kwargs, where, reasons, template="%s= is not supported: %s"):
    """Raise TypeError for the first keyword in ``kwargs``: ``template % (name, reason)`` when
    ``reasons`` explains it (a torch argument we do not take), else "unexpected keyword"."""
    for name in kwargs:
        if name in reasons:
            raise TypeError(where_msg(where, template % (name, reasons[name])))
        raise TypeError(where_msg(where, "unexpected keyword argument %r" % name))
