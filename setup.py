"""Packaging for mojo_train: runs ``make`` and ships the native libraries inside the package.

``pip install .`` builds the CPU libraries (every numeric mode) with the Makefile, then places every
``native/build/libmojo_train_*`` library in ``mojo_train/lib/``, the headers in
``mojo_train/include/`` (the loader reads its cdef from ``mojo_train.h``) and the cards in
``mojo_train/fixtures/``. GPU libraries built beforehand (``make cuda``, ``make hip``) are
packaged the same way. The Python side is cffi in ABI mode, so nothing links against Python,
but the wheel holds native code and is therefore tagged for the platform, never pure.

``pip install -e .`` runs ``make`` too; the package then stays in the checkout and the loader
finds the libraries in ``native/build/`` and the header in ``native/include/``.
"""
import glob
import os
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SUFFIX = ".dylib" if sys.platform == "darwin" else ".so"


def read_version():
    """The one version string, from mojo_train/__init__.py."""
    with open(os.path.join(HERE, "mojo_train", "__init__.py")) as f:
        return re.search(r'^__version__ = "([^"]+)"', f.read(), re.M).group(1)


def read_readme():
    path = os.path.join(HERE, "README.md")
    if not os.path.isfile(path):
        return ""
    with open(path, encoding="utf-8") as f:
        return f.read()


def run_make():
    """Build the CPU libraries (all numeric modes) into native/build/; fail loudly if make fails."""
    make = os.environ.get("MAKE", "make")
    subprocess.check_call([make, "-C", HERE])


def native_files():
    """(source path, folder inside the package) for every file the installed package needs."""
    libs = sorted(glob.glob(os.path.join(HERE, "native", "build", "libmojo_train_*" + SUFFIX)))
    pairs = [(p, "lib") for lib in libs for p in (lib, lib + ".sha256")]   # the loader checks the digest
    headers = ("mojo_train.h", "mt_pinned.h", "mt_pinned_math.h", "mt_pinned_layers.h", "mt_pinned_elementwise.h",
               "mt_ftz.h")
    pairs += [(os.path.join(HERE, "native", "include", h), "include") for h in headers]
    pairs += [(p, "fixtures") for p in sorted(glob.glob(os.path.join(HERE, "fixtures", "*.card")))]
    ftz = os.path.join("fixtures", "identical_ftz")    # identical_ftz's cards (native/contracts/ftz.md)
    pairs += [(p, ftz) for p in sorted(glob.glob(os.path.join(HERE, ftz, "*.card")))]
    return pairs


class BuildPyWithNative(build_py):
    """build_py that runs ``make`` first and copies libraries, headers and cards into the package."""

    def run(self):
        run_make()
        super().run()
        if getattr(self, "editable_mode", False):
            return  # editable: the loader uses native/build and native/include of the checkout
        libs = [p for p, sub in native_files() if sub == "lib"]
        if not libs:
            raise RuntimeError("mojo_train: make produced no native/build/libmojo_train_*%s" % SUFFIX)
        for sub in ("lib", "include", "fixtures"):  # no stale file from an earlier build
            shutil.rmtree(os.path.join(self.build_lib, "mojo_train", sub), ignore_errors=True)
        for src, sub in native_files():
            dest_dir = os.path.join(self.build_lib, "mojo_train", sub)
            self.mkpath(dest_dir)
            self.copy_file(src, os.path.join(dest_dir, os.path.basename(src)))


class BinaryDistribution(Distribution):
    """The wheel carries native libraries, so it must be platform-specific."""

    def has_ext_modules(self):
        return True


CMDCLASS = {"build_py": BuildPyWithNative}

try:  # setuptools >= 70.1 ships bdist_wheel; older ones take it from the wheel package
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

if bdist_wheel is not None:
    class BdistWheelAnyPython(bdist_wheel):
        """Tag ``py3-none-<platform>``: the libraries are loaded by cffi's dlopen, not linked
        against any one Python, so one wheel serves every Python 3 on the platform."""

        def get_tag(self):
            _, _, plat = super().get_tag()
            return "py3", "none", plat

    CMDCLASS["bdist_wheel"] = BdistWheelAnyPython


setup(
    name="mojo_train",
    version=read_version(),
    description="Neural-network training primitives with bit-identical float32 results on every vendor",
    long_description=read_readme(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["mojo_train", "mojo_train.*"]),
    package_data={"mojo_train": ["data/*.txt"]},   # the demo's training text
    python_requires=">=3.9",
    install_requires=["cffi"],
    extras_require={"torch": ["torch"]},   # mojo_train.torch and mojo_train.distributed
    distclass=BinaryDistribution,
    cmdclass=CMDCLASS,
    zip_safe=False,
)
