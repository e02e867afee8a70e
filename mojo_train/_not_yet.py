"""Placeholders for the training surface that is planned but not built yet.

Each name raises NotImplementedError naming itself, so a caller gets a clear answer instead
of an AttributeError or a plausible number; README.md's feature table lists the same names
as "not yet".
"""


def placeholder(name, area):
    """A function that refuses with NotImplementedError naming `name` and its area."""
    def refuse(*args, **kwargs):
        raise NotImplementedError("mojo_train.%s is not implemented yet (%s); see README.md's "
                                  "feature table" % (name, area))
    refuse.__name__ = name.rsplit(".", 1)[-1]
    refuse.__qualname__ = refuse.__name__
    refuse.__doc__ = "Not implemented yet (%s): raises NotImplementedError." % area
    refuse.not_implemented = True
    return refuse


def placeholder_class(name, area):
    """A class whose construction refuses like `placeholder`."""
    refuse = placeholder(name, area)
    return type(name.rsplit(".", 1)[-1], (), {"__init__": lambda self, *a, **k: refuse(),
                                              "__doc__": refuse.__doc__, "not_implemented": True})
