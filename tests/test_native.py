"""The C ABI and the loader.

Contract under test: mojo_train.h alone is enough for a C host (tests/c/adamw_host.c); the
Python cdef is the header's marked block and every function in it is exported; a loaded
library's identity exports match what was asked, a mismatching file is refused naming the
file and the rebuild command, an explicitly named vendor never falls back, and
backend_info() says what loaded and every path tried; the numeric modes differ where the design says
they may; using the whole API never imports numpy.
"""
import array
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest

import mojo_train
from mojo_train import _native
from mojo_train._native import ffi

from _helpers import ENONFINITE, REPO, bits, f32_array, from_bits

HEADER = os.path.join(REPO, "native", "include", "mojo_train.h")
HOST_C = os.path.join(REPO, "tests", "c", "adamw_host.c")


def header_block():
    with open(HEADER) as f:
        text = f.read()
    return text.split("/* MT_CDEF_BEGIN */", 1)[1].split("/* MT_CDEF_END */", 1)[0]


def declared_functions():
    """Function names declared in the header's cdef block, in order."""
    no_comments = re.sub(r"/\*.*?\*/", "", header_block(), flags=re.S)
    return re.findall(r"\b(mt_\w+)\s*\(", no_comments)


def run_python(code, env_extra=None, drop=()):
    """Run ``code`` in a fresh interpreter at the repository root; returns CompletedProcess."""
    env = dict(os.environ)
    for name in drop:
        env.pop(name, None)
    env.update(env_extra or {})
    path = [REPO, os.path.join(REPO, "tests")] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    env["PYTHONPATH"] = os.pathsep.join(path)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


# ---- the header is the one source of truth ---------------------------------------------------

def test_loader_cdef_is_the_header_block_verbatim():
    assert _native._read_cdef() == header_block()
    names = declared_functions()
    assert len(names) == len(set(names)) >= 15
    with open(os.path.join(REPO, "mojo_train", "_native.py")) as f:
        loader = f.read()
    pasted = [n for n in names if re.search(r"\b(int|char|uint64_t)\s*\*?\s*%s\s*\(" % n, loader)]
    assert pasted == [], "declarations pasted into _native.py: %s" % pasted


def test_every_declared_function_is_exported_by_the_loaded_library(mode):
    lib = mode.backend.lib
    for name in declared_functions():
        fn = getattr(lib, name)            # AttributeError when the symbol is missing
        assert callable(fn), name


def _null_call_args(fn):
    args = []
    for t in ffi.typeof(fn).args:
        if t.kind == "pointer":
            args.append(ffi.NULL)
        elif t.kind == "primitive" and t.cname in ("float", "double"):
            args.append(1.0)
        else:
            args.append(1)
    return args


def test_every_entry_point_with_pointers_refuses_null_and_leaves_a_message(mode):
    lib = mode.backend.lib
    checked = 0
    for name in declared_functions():
        fn = getattr(lib, name)
        if name.endswith("_free") or not any(t.kind == "pointer" for t in ffi.typeof(fn).args):
            continue                       # free(NULL) is a no-op by convention
        rc = fn(*_null_call_args(fn))
        assert rc in (1, 5), "%s(NULL, ...) returned %d, not MT_EINVAL/MT_EUNSUPPORTED" % (name, rc)
        assert ffi.string(lib.mt_last_error()), "%s left no message" % name
        checked += 1
    assert checked >= 10


# ---- identity ------------------------------------------------------------------------------------

def test_identity_exports_agree_with_what_was_asked(mode):
    lib = mode.backend.lib
    assert ffi.string(lib.mt_vendor()).decode() == mode.vendor
    assert ffi.string(lib.mt_numeric_mode()).decode() == mode.numeric_mode
    assert lib.mt_abi_version() == _native.ABI_VERSION == 10
    assert os.path.basename(mode.backend.path) == _native.library_name(mode.vendor, mode.numeric_mode)
    assert int(lib.mt_features()) == mode.backend.features
    for capability in ("optim", "clip", "random"):
        assert mode.has(capability), capability
    if mode.numeric_mode in ("identical", "identical_ftz"):
        assert mode.has("pinned_math") and not mode.has("contraction")
        assert mode.has("flush_rule") == (mode.numeric_mode == "identical_ftz")
    else:
        assert mode.has("contraction") and not mode.has("pinned_math")


def test_loader_refuses_a_library_of_another_numeric_mode_naming_the_file_and_the_rebuild_command(mode, tmp_path):
    other = [t for t in _native.NUMERIC_MODES if t != mode.numeric_mode][0]
    impostor = tmp_path / _native.library_name(mode.vendor, other)
    shutil.copyfile(mode.backend.path, impostor)
    out = run_python("""
        import array, mojo_train
        try:
            mojo_train.AdamW(array.array('f', [1.0]))
        except mojo_train.BackendError as e:
            print('REFUSED'); print(e)
        else:
            print('LOADED')
    """, {"MOJO_TRAIN_LIBRARY_PATH": str(tmp_path), "MOJO_TRAIN_VENDOR": mode.vendor,
          "MOJO_TRAIN_NUMERIC_MODE": other})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REFUSED"), out.stdout
    msg = out.stdout
    assert str(impostor) in msg
    assert repr(mode.numeric_mode) in msg and repr(other) in msg
    assert _native.rebuild_command(mode.vendor, other) in msg
    assert "make" in msg


def test_loader_refuses_a_misplaced_library_in_process_and_keeps_working_after(mode, tmp_path, monkeypatch):
    other = [t for t in _native.NUMERIC_MODES if t != mode.numeric_mode][0]
    impostor = tmp_path / _native.library_name(mode.vendor, other)
    shutil.copyfile(mode.backend.path, impostor)
    saved_loaded, saved_attempts = dict(_native._loaded), dict(_native._attempts)
    try:
        _native._forget()
        monkeypatch.setenv("MOJO_TRAIN_LIBRARY_PATH", str(tmp_path))
        with pytest.raises(mojo_train.BackendError) as info:
            _native.load(other, mode.vendor)
        assert str(impostor) in str(info.value)
        assert "make" in str(info.value)
    finally:
        monkeypatch.delenv("MOJO_TRAIN_LIBRARY_PATH")
        with _native._lock:
            _native._loaded.clear()
            _native._loaded.update(saved_loaded)
            _native._attempts.clear()
            _native._attempts.update(saved_attempts)
    assert _native.load(mode.numeric_mode, mode.vendor) is mode.backend


def _absent_vendor():
    for vendor in _native.VENDORS:
        try:
            _native.load("identical", vendor)
        except _native.BackendError:
            return vendor
    return None


def test_an_explicitly_named_absent_vendor_raises_listing_every_path_tried(tmp_path, monkeypatch):
    vendor = _absent_vendor()
    if vendor is None:
        pytest.skip("every vendor's library loads here")
    monkeypatch.setenv("MOJO_TRAIN_LIBRARY_PATH", str(tmp_path))
    with pytest.raises(mojo_train.BackendError) as info:
        _native.load("identical", vendor)
    msg = str(info.value)
    name = _native.library_name(vendor, "identical")
    for d in (str(tmp_path), os.path.join(REPO, "mojo_train", "lib"), os.path.join(REPO, "native", "build")):
        assert os.path.join(d, name) in msg
    assert "Build it with" in msg
    assert isinstance(info.value, ImportError)


def test_an_explicitly_named_absent_vendor_never_falls_back_in_a_fresh_process():
    vendor = _absent_vendor()
    if vendor is None:
        pytest.skip("every vendor's library loads here")
    out = run_python("""
        import array, mojo_train
        p = array.array('f', [1.0, 2.0])
        try:
            opt = mojo_train.AdamW(p)
        except mojo_train.BackendError as e:
            print('REFUSED'); print(e)
        else:
            print('FELL BACK to', opt._backend.vendor)
    """, {"MOJO_TRAIN_VENDOR": vendor, "MOJO_TRAIN_NUMERIC_MODE": "identical"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("REFUSED"), out.stdout
    assert _native.library_name(vendor, "identical") in out.stdout


# ---- backend_info ----------------------------------------------------------------------------------

def test_backend_info_reports_vendor_numeric_mode_path_and_the_paths_tried(mode):
    info = mojo_train.backend_info(numeric_mode=mode.numeric_mode)
    assert info["vendor"] == mode.vendor
    assert info["numeric_mode"] == mode.numeric_mode
    assert info["path"] == mode.backend.path
    assert info["abi_version"] == _native.ABI_VERSION
    assert info["features"] == mode.backend.features
    assert info["asked_vendor"] == mode.vendor
    assert info["threads"] >= 1
    assert info["tried"], info
    assert info["tried"][-1] == {"vendor": mode.vendor, "path": mode.backend.path, "outcome": "loaded"}
    assert all(t["outcome"] != "loaded" for t in info["tried"][:-1])


def test_backend_info_lists_paths_tried_whatever_the_vendor_spelling(mode):
    """load() accepts ' CPU ' as 'cpu'; backend_info must describe the same attempt."""
    info = mojo_train.backend_info(numeric_mode=mode.numeric_mode, vendor=mode.vendor.upper())
    assert info["vendor"] == mode.vendor
    assert info["tried"] and info["tried"][-1]["path"] == mode.backend.path


def test_backend_info_under_auto_lists_every_search_path_of_every_vendor_tried(tmp_path):
    out = run_python("""
        import json, mojo_train
        print(json.dumps(mojo_train.backend_info()))
    """, {"MOJO_TRAIN_LIBRARY_PATH": str(tmp_path), "MOJO_TRAIN_VENDOR": "auto",
          "MOJO_TRAIN_NUMERIC_MODE": "identical"})
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert info["asked_vendor"] == "auto" and "auto" in info["reason"]
    dirs = [str(tmp_path), os.path.join(REPO, "mojo_train", "lib"), os.path.join(REPO, "native", "build")]
    expected = []
    for vendor in _native.AUTO_ORDER:
        for d in dirs:
            path = os.path.join(d, _native.library_name(vendor, "identical"))
            expected.append((vendor, path))
            if path == info["path"]:
                break
        if vendor == info["vendor"]:
            break
    assert [(t["vendor"], t["path"]) for t in info["tried"]] == expected
    assert info["tried"][-1]["outcome"] == "loaded"


# ---- selection by environment ----------------------------------------------------------------

@pytest.mark.parametrize("variable, value", [("MOJO_TRAIN_NUMERIC_MODE", "exact"),
                                             ("MOJO_TRAIN_NUMERIC_MODE", "identical-ish"),
                                             ("MOJO_TRAIN_VENDOR", "tpu")])
def test_a_bad_environment_value_is_refused_by_name(monkeypatch, variable, value):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ValueError) as info:
        _native.load()
    assert variable in str(info.value) and repr(value) in str(info.value)
    with pytest.raises(ValueError) as info:
        mojo_train.AdamW(array.array("f", [1.0]))
    assert variable in str(info.value)


def test_a_bad_numeric_mode_argument_is_refused_by_name():
    p = array.array("f", [1.0, 2.0])
    with pytest.raises(ValueError) as info:
        mojo_train.SGD(p, numeric_mode="bitwise")
    assert "numeric_mode" in str(info.value) and "'bitwise'" in str(info.value)
    assert p.tolist() == [1.0, 2.0]


# ---- validated where given: the environment at import, numeric_mode= at construction -----------

BAD_ENVIRONMENT = [("MOJO_TRAIN_NUMERIC_MODE", "bogus", "one of identical, deterministic, fast"),
                   ("MOJO_TRAIN_VENDOR", "bogus", "one of auto, cpu, cuda, hip, metal"),
                   ("MOJO_TRAIN_NUM_THREADS", "abc", "a whole number >= 1"),
                   ("MOJO_TRAIN_NUM_THREADS", "0", "a whole number >= 1"),
                   ("MOJO_TRAIN_NUM_THREADS", "4x", "a whole number >= 1"),
                   ("MOJO_TRAIN_CPU_GEMM", "sse", "one of avx512, avx2, scalar"),
                   ("MOJO_TRAIN_LR_EXACT_ONLY", "yes", "one of 0, 1"),
                   ("MOJO_TRAIN_CE_GLOBAL", "true", "one of 0, 1"),
                   ("MOJO_TRAIN_LM_ONE_STREAM", "2", "one of 0, 1"),
                   ("MOJO_TRAIN_RMS_ONE_PASS", "no", "one of 0, 1"),
                   ("MOJO_TRAIN_RMS_RELAY", "on", "one of 0, 1"),
                   ("MOJO_TRAIN_MAP_RING", "2", "one of 0, 1")]


@pytest.mark.parametrize("variable, value, allowed", BAD_ENVIRONMENT)
def test_a_bad_environment_value_fails_the_import_naming_the_variable_and_the_allowed_values(variable, value,
                                                                                          allowed):
    out = run_python("import mojo_train", {variable: value})
    assert out.returncode == 1
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: mojo_train: the environment variable %s must be %s" % (variable, allowed))
    assert "got %r" % value in last


def _variables_read():
    """Every MOJO_TRAIN_* variable the package's Python or native sources read."""
    found = set()
    for folder, pattern in (("mojo_train", r"environ(?:\.get\(|\[)\s*\"(MOJO_TRAIN_\w+)\""),
                            ("native", r"getenv\(\s*\"(MOJO_TRAIN_\w+)\"")):
        for dirpath, _, files in os.walk(os.path.join(REPO, folder)):
            for name in files:
                if name.endswith((".py", ".c", ".h", ".cu", ".cuh", ".m", ".mm", ".metal")):
                    with open(os.path.join(dirpath, name), encoding="utf-8", errors="replace") as f:
                        found.update(re.findall(pattern, f.read()))
    return found


def test_every_environment_variable_the_library_reads_is_validated_at_import():
    read = _variables_read()
    assert {"MOJO_TRAIN_NUMERIC_MODE", "MOJO_TRAIN_VENDOR", "MOJO_TRAIN_NUM_THREADS"} <= read
    assert read - {"MOJO_TRAIN_LIBRARY_PATH"} <= set(_native._ENVIRONMENT), \
        "read but not validated: %s" % sorted(read - {"MOJO_TRAIN_LIBRARY_PATH"} - set(_native._ENVIRONMENT))


def test_allowed_environment_values_import_and_take_effect(mode):
    out = run_python("""
        import json, mojo_train
        print(json.dumps(mojo_train.backend_info()))
    """, {"MOJO_TRAIN_NUMERIC_MODE": " %s " % mode.numeric_mode.title(), "MOJO_TRAIN_VENDOR": mode.vendor.upper(),
          "MOJO_TRAIN_NUM_THREADS": "3", "MOJO_TRAIN_CPU_GEMM": "scalar", "MOJO_TRAIN_LR_EXACT_ONLY": "0",
          "MOJO_TRAIN_CE_GLOBAL": "0", "MOJO_TRAIN_CE_CLUSTER": "0", "MOJO_TRAIN_LM_ONE_STREAM": "1",
          "MOJO_TRAIN_RMS_ONE_PASS": "0", "MOJO_TRAIN_RMS_RELAY": "0",
          "MOJO_TRAIN_MAP_RING": "0"})
    assert out.returncode == 0, out.stderr
    info = json.loads(out.stdout)
    assert (info["vendor"], info["numeric_mode"]) == (mode.vendor, mode.numeric_mode)
    if mode.has("threads"):
        assert info["threads"] == 3


def _f32(*values):
    return array.array("f", values)


CONSTRUCTORS = {
    "SGD": lambda nm, p: mojo_train.SGD([p], numeric_mode=nm),
    "Adam": lambda nm, p: mojo_train.Adam([p], numeric_mode=nm),
    "AdamW": lambda nm, p: mojo_train.AdamW([p], numeric_mode=nm),
    "Generator": lambda nm, p: mojo_train.Generator(0, numeric_mode=nm),
    "Embedding": lambda nm, p: mojo_train.Embedding(2, 3, generator=mojo_train.Generator(0), numeric_mode=nm),
    "DeviceArray": lambda nm, p: mojo_train.DeviceArray((2,), numeric_mode=nm),
}


@pytest.mark.parametrize("name", list(CONSTRUCTORS))
@pytest.mark.parametrize("bad", ["bogus", 3])
def test_every_constructor_refuses_a_bad_numeric_mode_when_constructed(name, bad):
    p = _f32(1.0, 2.0)
    with pytest.raises(ValueError) as info:
        CONSTRUCTORS[name](bad, p)
    msg = str(info.value)
    assert msg.startswith("mojo_train.%s: numeric_mode must be one of identical, deterministic, fast, identical_ftz, "
                          "got %r" % (name, bad)), msg
    assert p.tolist() == [1.0, 2.0]


@pytest.mark.parametrize("name", ["Generator", "Embedding"])
def test_a_constructor_that_loads_nothing_keeps_the_numeric_mode_in_its_canonical_spelling(mode, name):
    obj = CONSTRUCTORS[name](" %s " % mode.numeric_mode.upper(), _f32(1.0))
    assert obj.numeric_mode == mode.numeric_mode


FUNCTIONS = {
    "clip_grad_norm_": lambda nm, g: mojo_train.clip_grad_norm_([g], 1.0, numeric_mode=nm),
    "add": lambda nm, g: mojo_train.add(g, g, numeric_mode=nm),
    "silu_forward": lambda nm, g: mojo_train.silu_forward(g, numeric_mode=nm),
    "to_device": lambda nm, g: mojo_train.to_device(g, numeric_mode=nm),
    "transfer_bytes": lambda nm, g: mojo_train.transfer_bytes(numeric_mode=nm),
    "memory_stats": lambda nm, g: mojo_train.memory_stats(numeric_mode=nm),
    "release_device_cache": lambda nm, g: mojo_train.release_device_cache(numeric_mode=nm),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_a_function_refuses_a_bad_numeric_mode_naming_itself(name):
    g = _f32(3.0, 4.0)
    with pytest.raises(ValueError) as info:
        FUNCTIONS[name]("bogus", g)
    assert str(info.value).startswith("mojo_train.%s: numeric_mode must be one of identical, deterministic, "
                                      "fast, identical_ftz, got 'bogus'" % name), str(info.value)
    assert g.tolist() == [3.0, 4.0]


def test_numeric_mode_names_are_case_and_space_insensitive(mode):
    assert _native.load(" %s " % mode.numeric_mode.upper(), mode.vendor) is mode.backend


# ---- the numeric modes really differ ---------------------------------------------------------------------

def _one_step(cls, numeric_mode, **kwargs):
    p = f32_array(8192, 1, -2.0, 2.0)
    g = f32_array(8192, 2, -3.0, 3.0)
    opt = getattr(mojo_train, cls)(p, numeric_mode=numeric_mode, **kwargs)
    for _ in range(2):
        opt.step(g)
    return p.tobytes() + opt.exp_avg.tobytes() + opt.exp_avg_sq.tobytes()


def _identical_twin(mode):
    if not mode.has("contraction"):
        pytest.skip("this numeric mode does not contract")
    try:
        return _native.load("identical", mode.vendor)
    except _native.BackendError:
        pytest.skip("no identical library for %s" % mode.vendor)


@pytest.mark.parametrize("cls, kwargs", [("AdamW", dict(lr=0.1, weight_decay=0.1)),
                                         ("Adam", dict(lr=0.1, weight_decay=0.1))])
def test_a_contracting_numeric_mode_differs_from_identical_in_some_bits(mode, cls, kwargs):
    _identical_twin(mode)
    a = _one_step(cls, "identical", **kwargs)
    b = _one_step(cls, mode.numeric_mode, **kwargs)
    assert len(a) == len(b)
    differing = sum(1 for i in range(0, len(a), 4) if a[i:i + 4] != b[i:i + 4])
    assert differing > 0


@pytest.mark.parametrize("cls", ["AdamW", "Adam", "SGD"])
def test_every_numeric_mode_gives_the_same_bits_twice(mode, cls):
    kwargs = dict(lr=0.1, weight_decay=0.1)
    if cls == "SGD":
        kwargs["momentum"] = 0.9
        p1, p2 = f32_array(8192, 1), f32_array(8192, 1)
        g = f32_array(8192, 2)
        for p in (p1, p2):
            opt = mojo_train.SGD(p, numeric_mode=mode.numeric_mode, **kwargs)
            opt.step(g)
            opt.step(g)
        assert p1.tobytes() == p2.tobytes()
        return
    assert _one_step(cls, mode.numeric_mode, **kwargs) == _one_step(cls, mode.numeric_mode, **kwargs)


# ---- no numpy -------------------------------------------------------------------------------------

def test_the_whole_api_used_in_a_fresh_process_never_imports_numpy(mode):
    out = run_python("""
        import array, pickle, sys
        import mojo_train
        from mojo_train import Array, SGD, Adam, AdamW, clip_grad_norm_, backend_info
        from mojo_train._native import ffi, load
        numeric_mode = %r
        info = backend_info(numeric_mode=numeric_mode)
        ps = [array.array('f', [0.5] * 300), Array.from_list([0.25] * 7).reshape(7)]
        gs = [array.array('f', [0.1] * 300), Array.from_list([-2.0] * 7)]
        mv = memoryview(bytearray(array.array('f', [1.0] * 12).tobytes())).cast('f', (3, 4))
        opts = [SGD(ps, lr=0.1, momentum=0.9, nesterov=True, numeric_mode=numeric_mode),
                SGD(ps, lr=0.1, momentum=0.5, dampening=0.1, weight_decay=0.1, maximize=True, numeric_mode=numeric_mode),
                Adam(ps, weight_decay=0.1, numeric_mode=numeric_mode), AdamW(ps, numeric_mode=numeric_mode),
                AdamW([mv], numeric_mode=numeric_mode)]
        for opt in opts[:4]:
            assert opt.step(gs) is None
            assert opt.step(gs, max_norm=0.5) > 0
            s = pickle.loads(pickle.dumps(opt.state_dict()))
            opt.load_state_dict(s)
            try:
                opt.step([array.array('d', [0.0] * 300), gs[1]])
            except TypeError:
                pass
        opts[4].step([memoryview(bytearray(48)).cast('f', (3, 4))])
        opts[0].zero_grad(gs)
        gs[0][0] = 3.0
        assert clip_grad_norm_(gs, 1.0, numeric_mode=numeric_mode) == 3.0
        try:
            clip_grad_norm_(gs, 1.0, norm_type=1.0)
        except NotImplementedError:
            pass
        a = Array((2, 3), 'float32'); a2 = pickle.loads(pickle.dumps(a)); memoryview(a.memview())
        lib = load(numeric_mode).lib
        out = ffi.new('uint32_t[4]'); lib.mt_philox4x32_10(out, ffi.new('uint32_t[4]'), ffi.new('uint32_t[2]'))
        buf = ffi.new('float[100]'); lib.mt_uniform_fill(buf, 1, 2, 3, 0.0, 1.0, 100)
        one = ffi.new('float[1]'); lib.mt_one_minus_pow(one, 0.9, 10)
        print('numpy' in sys.modules)
    """ % mode.numeric_mode)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


# ---- a C host through the header alone -------------------------------------------------------

def _compile_host(tmp_path_factory, backend):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    inc = tmp_path_factory.mktemp("include")
    shutil.copyfile(HEADER, inc / "mojo_train.h")       # the header alone, nothing beside it
    exe = str(tmp_path_factory.mktemp("host") / "adamw_host")
    libdir = os.path.dirname(backend.path)
    libname = os.path.basename(backend.path)[3:].rsplit(".", 1)[0]
    cmd = [cc, "-std=c11", "-Wall", "-Wextra", "-Werror", "-pthread", "-I", str(inc), HOST_C,
           "-L", libdir, "-l" + libname, "-Wl,-rpath," + libdir, "-o", exe]
    res = subprocess.run(cmd, capture_output=True, text=True)
    assert res.returncode == 0, "%s\n%s" % (" ".join(cmd), res.stderr)
    return exe


@pytest.fixture(scope="module")
def host_output(tmp_path_factory):
    try:
        backend = _native.load("identical", "cpu")
    except _native.BackendError:
        pytest.skip("the C host links the CPU oracle, which is not built")
    exe = _compile_host(tmp_path_factory, backend)
    res = subprocess.run([exe], capture_output=True, text=True, timeout=300)
    lines = {}
    for line in res.stdout.splitlines():
        key, _, rest = line.partition(" ")
        lines[key] = rest
    return res, lines


def test_c_host_source_includes_only_the_public_header():
    with open(HOST_C) as f:
        includes = re.findall(r'#\s*include\s*([<"][^>"]+[>"])', f.read())
    project = [i for i in includes if i.startswith('"')]
    assert project == ['"mojo_train.h"']
    assert all(i.strip("<>").split("/")[0] in ("math.h", "pthread.h", "stdint.h", "stdio.h", "stdlib.h", "string.h")
               for i in includes if i.startswith("<"))


def test_c_host_passes_its_own_checks(host_output):
    res, lines = host_output
    assert res.returncode == 0, res.stdout + res.stderr
    assert "OK" in lines and "FAIL" not in res.stdout
    assert lines["IDENTITY"].split()[:3] == ["cpu", "identical", str(_native.ABI_VERSION)]


def test_c_host_refusal_reports_enonfinite_and_a_message(host_output):
    _, lines = host_output
    code, _, message = lines["REFUSED"].partition(" ")
    assert int(code) == ENONFINITE
    assert "grads[1]" in message


def test_c_host_threads_reproduce_the_serial_bits(host_output):
    _, lines = host_output
    assert lines.get("THREADS") == "4"


def _host_recipe():
    n0, n1 = 100, 37
    params = [array.array("f", [((i % 17) - 8) / 16.0 for i in range(0, n0)]),
              array.array("f", [((i % 17) - 8) / 16.0 for i in range(n0, n0 + n1)])]

    def grads(step):
        flat = [(((i * 7 + step * 3) % 13) - 6) / 8.0 for i in range(n0 + n1)]
        return [array.array("f", flat[:n0]), array.array("f", flat[n0:])]
    return params, grads


def test_c_host_bits_equal_the_python_api_on_every_identical_vendor(host_output, identical):
    _, lines = host_output
    params, grads = _host_recipe()
    opt = mojo_train.AdamW(params, lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1,
                           numeric_mode=identical.numeric_mode)
    norms = []
    for step in (1, 2, 3):
        g = grads(step)
        total = opt.step(g, max_norm=2.0)
        assert total == opt.total_norm_
        norms += [opt.total_norm_, opt.clip_coef_]

    def hexes(values):
        return " ".join("%08x" % bits(v) for v in values)
    assert lines["PARAMS"] == hexes(params[0].tolist() + params[1].tolist())
    assert lines["EXP_AVG"] == hexes(opt.exp_avg.tolist())
    assert lines["EXP_AVG_SQ"] == hexes(opt.exp_avg_sq.tolist())
    assert lines["GRADS"] == hexes(g[0].tolist() + g[1].tolist())
    assert lines["NORMS"] == hexes(norms)
    assert from_bits(int(lines["NORMS"].split()[3], 16)) < 1.0      # clipping really happened
