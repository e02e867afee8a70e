"""bench/device_steps.sh, the steps of a GPU call: what can be checked without a GPU (its usage,
an unknown step reported in the archive it returns)."""
import os
import shutil
import subprocess
import tarfile

import pytest

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench", "device_steps.sh")


@pytest.fixture
def bash():
    path = shutil.which("bash")
    if path is None or shutil.which("tar") is None:
        pytest.skip("bash or tar is not installed")
    return path


def test_no_step_prints_the_usage_and_exits_2(bash):
    out = subprocess.run([bash, SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    for step in ("cards", "suite", "test=FILE", "bench=NAME", "ncu=KERNEL:NAME", "sanitize", "prepare"):
        assert step in out.stdout, step


def test_an_unknown_step_is_named_in_the_archive(bash, tmp_path):
    """On a copy of the tree (_tree below): the checkout's own CUDA libraries may be mid-rebuild,
    and a stale one stops the script before any step, as it should."""
    if shutil.which("make") is None or shutil.which("sha256sum") is None:
        pytest.skip("make or sha256sum is not installed")
    tree, _ = _tree(tmp_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = dict(os.environ, OUT=str(out_dir))
    out = subprocess.run([bash, str(tree / "bench" / "device_steps.sh"), "no_such_step"], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    with tarfile.open(out_dir / "logs.tgz") as t:
        steps = t.extractfile("logs/steps.txt").read().decode()
    assert "unknown step no_such_step" in steps and "no_such_step done" in steps
    assert not (out_dir / "logs").exists()   # only the archive comes back


def _tree(tmp_path):
    """A copy of what the script's stamp check reads: the script, the Makefile, the native
    sources (the ftz rewrite among them), and three stand-in CUDA libraries stamped as `make
    cuda-sources` says now."""
    root = os.path.dirname(os.path.dirname(SCRIPT))
    tree = tmp_path / "tree"
    (tree / "bench").mkdir(parents=True)
    shutil.copy(SCRIPT, tree / "bench")
    shutil.copy(os.path.join(root, "Makefile"), tree)
    for part in ("cuda", "include", "common"):
        shutil.copytree(os.path.join(root, "native", part), tree / "native" / part)
    os.makedirs(tree / "native" / "cpu_oracle")         # the ftz rewrite builds the identical_ftz host code
    shutil.copy(os.path.join(root, "native", "cpu_oracle", "mt_ftz_ir.py"), tree / "native" / "cpu_oracle")
    (tree / "native" / "build").mkdir()
    stamp = subprocess.run(["make", "-s", "--no-print-directory", "cuda-sources"], cwd=tree, capture_output=True,
                           text=True, timeout=60, check=True).stdout
    libs = [tree / "native" / "build" / ("libmojo_train_cuda_%s.so" % m) for m in ("identical", "deterministic", "fast")]
    for lib in libs:
        lib.write_bytes(b"stand-in")
        (tree / "native" / "build" / (lib.name + ".sources")).write_text(stamp)
        os.utime(lib, (1_000_000_000, 1_000_000_000))    # older than every source
    return tree, libs


@pytest.mark.parametrize("stale", [False, True])
def test_a_library_stamped_from_other_sources_stops_the_steps_untouched(bash, tmp_path, stale):
    """On the device the script touches the CUDA libraries (so that make does not rebuild them
    from the copy's newer sources) only when their stamps name this tree's sources and Makefile;
    a stale stamp stops it (exit 4) naming the library, and nothing is touched."""
    if shutil.which("make") is None or shutil.which("sha256sum") is None:
        pytest.skip("make or sha256sum is not installed")
    tree, libs = _tree(tmp_path)
    if stale:
        with open(tree / "native" / "cuda" / "mt_gpu_runtime.cu", "a") as f:
            f.write("\n/* edited after the build */\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = subprocess.run([bash, str(tree / "bench" / "device_steps.sh"), "no_such_step"], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, OUT=str(out_dir)))
    if stale:
        assert out.returncode == 4 and "libmojo_train_cuda_identical.so was not built from these sources" in out.stdout
        assert "mt_gpu_runtime.cu" in out.stdout and all(os.stat(lib).st_mtime == 1_000_000_000 for lib in libs)
    else:
        assert out.returncode == 0, out.stdout + out.stderr
        assert all(os.stat(lib).st_mtime > 1_000_000_000 for lib in libs)


@pytest.mark.parametrize("staged_here", [True, False])
def test_the_staged_libraries_are_the_build_only_where_they_were_not_staged_from(bash, tmp_path, staged_here):
    """The script puts .whl/build's staged libraries into native/build on the device (whose
    native/build is not the one `prepare` staged them from: .whl/stage_id), over whatever an
    earlier call left there; where they were staged from, native/build stays as it is: once a
    copy put the staged, older libraries back over newer builds whenever this file's tests ran
    the script here."""
    if shutil.which("make") is None or shutil.which("sha256sum") is None:
        pytest.skip("make or sha256sum is not installed")
    tree, libs = _tree(tmp_path)
    staged = tree / ".whl" / "build"
    staged.mkdir(parents=True)
    (tree / ".whl" / "stage_id").write_text("1733400000-42\n")
    if staged_here:       # prepare leaves the id in the native/build it staged
        (tree / "native" / "build" / ".stage_id").write_text("1733400000-42\n")
    (staged / "libmojo_train_cpu_identical.so").write_bytes(b"staged")
    target = tree / "native" / "build" / "libmojo_train_cpu_identical.so"
    target.write_bytes(b"built here")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    out = subprocess.run([bash, str(tree / "bench" / "device_steps.sh"), "no_such_step"], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, OUT=str(out_dir)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert target.read_bytes() == (b"built here" if staged_here else b"staged")


@pytest.mark.parametrize("only", [None, "vB", "vA,vB"])
def test_an_ab_step_runs_the_variants_it_names_or_every_one(bash, tmp_path, only):
    """`ab=NAME` runs bench/NAME.py over the tree's libraries and then each variant folder
    .whl/v*/, three rounds; `ab=NAME:vX,vY` over the named variants only (a call's .whl can hold
    variants for several A/Bs, and each costs device time)."""
    if shutil.which("make") is None or shutil.which("sha256sum") is None:
        pytest.skip("make or sha256sum is not installed")
    tree, _ = _tree(tmp_path)
    (tree / "bench" / "probe.py").write_text(
        "import os\nprint('libraries:', os.environ.get('MOJO_TRAIN_LIBRARY_PATH', 'tree'))\n")
    for v in ("vA", "vB"):
        (tree / ".whl" / v).mkdir(parents=True)
        (tree / ".whl" / v / "libmojo_train_cuda_identical.so").write_bytes(b"variant")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    step = "ab=probe" + (":" + only if only else "")
    out = subprocess.run([bash, str(tree / "bench" / "device_steps.sh"), step], capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, OUT=str(out_dir)))
    assert out.returncode == 0, out.stdout + out.stderr
    with tarfile.open(out_dir / "logs.tgz") as t:
        log = t.extractfile("logs/ab_probe.txt").read().decode()
    ran = [line.split()[-1] for line in log.splitlines() if line.startswith("== round")]
    expected = ["tree"] + (only.split(",") if only else ["vA", "vB"])
    assert ran == expected * 3, log
    assert log.count("libraries: tree") == 3
    for v in expected[1:]:
        assert log.count("libraries: %s/.whl/%s/" % (tree, v)) == 3, log


def test_an_abenv_step_alternates_the_tree_with_and_without_the_variables(bash, tmp_path):
    """`abenv=NAME:VAR=V,...` runs bench/NAME.py three rounds, each first as the environment has
    it, then with the variables set (a switch the library reads: no second library to build)."""
    if shutil.which("make") is None or shutil.which("sha256sum") is None:
        pytest.skip("make or sha256sum is not installed")
    tree, _ = _tree(tmp_path)
    (tree / "bench" / "probe.py").write_text(
        "import os\nprint('seen:', os.environ.get('MT_PROBE_A', '-'), os.environ.get('MT_PROBE_B', '-'))\n")
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    env = dict(os.environ, OUT=str(out_dir))
    env.pop("MT_PROBE_A", None)
    env.pop("MT_PROBE_B", None)
    out = subprocess.run([bash, str(tree / "bench" / "device_steps.sh"), "abenv=probe:MT_PROBE_A=0,MT_PROBE_B=x"],
                         capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    with tarfile.open(out_dir / "logs.tgz") as t:
        log = t.extractfile("logs/abenv_probe.txt").read().decode()
    seen = [line for line in log.splitlines() if line.startswith(("== round", "seen:"))]
    assert seen == ["== round %d tree" % r if i == 0 else "seen: - -" if i == 1 else
                    "== round %d MT_PROBE_A=0,MT_PROBE_B=x" % r if i == 2 else "seen: 0 x"
                    for r in (1, 2, 3) for i in range(4)], log
