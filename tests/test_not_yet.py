"""What is not built yet says so by name, instead of failing obscurely or returning numbers."""
import pytest

import mojo_train as mt

NOT_YET = [n for n in mt.__all__ if getattr(getattr(mt, n), "not_implemented", False)]
BUILT = [n for n in mt.__all__ if n not in NOT_YET and not n.startswith("__")]


@pytest.mark.parametrize("name", NOT_YET)
def test_a_planned_name_raises_not_implemented_naming_itself(name):
    with pytest.raises(NotImplementedError, match=r"mojo_train\.%s is not implemented yet" % name):
        getattr(mt, name)(1, 2)


def test_the_readme_feature_table_lists_every_planned_name_as_not_yet():
    import os
    readme = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read()
    for name in NOT_YET:
        line = next((l for l in readme.splitlines() if l.startswith("|") and "`%s`" % name in l), None)
        assert line is not None and "not yet" in line, name


def test_the_readme_feature_table_lists_no_built_name_as_not_yet_on_the_cpu_oracle():
    import os
    readme = open(os.path.join(os.path.dirname(os.path.dirname(__file__)), "README.md")).read()
    for name in BUILT:
        for l in readme.splitlines():
            if l.startswith("|") and "`%s`" % name in l:
                assert l.split("|")[2].strip() != "not yet", name
