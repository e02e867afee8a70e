"""bench/fuzz.py's record names the library a run checked, and says when it is the sanitized
build (make fuzz-asan): a run against the plain library must not read as a sanitized one."""
import os
import sys

import mojo_train

from _helpers import REPO

sys.path.insert(0, os.path.join(REPO, "bench"))
import fuzz as F  # noqa: E402


def test_the_record_names_the_library_and_whether_it_is_sanitized(monkeypatch):
    for folder, sanitized in ((os.path.join(REPO, "native", "build", "asan"), True),
                              (os.path.join(REPO, "native", "build"), False),
                              ("/opt/elsewhere/asan-like", False)):
        path = os.path.join(folder, "libmojo_train_cpu_identical.so")
        monkeypatch.setattr(mojo_train, "backend_info", lambda numeric_mode, path=path: {"path": path})
        label = F.library("identical")
        assert label.startswith(os.path.relpath(path, REPO) if folder.startswith(REPO) else path)
        assert ("AddressSanitizer + UBSan" in label) == sanitized, label
