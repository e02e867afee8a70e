"""What ``mojo_train.torch.nn`` and ``mojo_train.torch.functional`` say about a name they lack.

Contract: ``not_here`` raises AttributeError (so ``hasattr`` and ``getattr(m, name, default)``
work): for a name torch's namespace has, saying that mojo_train has no arithmetic for it and
that torch's own is ``torch.<namespace>.<name>`` -- a silent fallback would run torch's
arithmetic where the user asked for mojo_train's; for any other name, Python's usual words.
"""
from .._errors import where_msg


def not_here(module_name, torch_namespace, name):
    """Raise the AttributeError for ``module_name.name`` (see the module docstring)."""
    short = module_name.split(".", 1)[1]
    if not name.startswith("__") and hasattr(torch_namespace, name):
        raise AttributeError(where_msg(short, "has no %s: mojo_train has no arithmetic of its own for it; use "
                                       "%s.%s explicitly where torch's arithmetic will do"
                                       % (name, torch_namespace.__name__, name)))
    raise AttributeError("module %r has no attribute %r" % (module_name, name))
