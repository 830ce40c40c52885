"""Build the compiled core. Metadata lives in pyproject.toml.

Three products come from the one C core in ``src/bursarcore/core/``: the Cython
extensions (CPython's fast path; the core's sources compiled into each that binds it), the
cffi module ``bursarcore._cffi_core``, and ``libbursarcore.so``, the shared library C
programs link against (``bursarcore.get_library()``).
"""

import glob
import os
import sys

import numpy as np
import setuptools
from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# pyproject.toml's SPDX `license` and `license-files` need setuptools 77; an older one (a
# direct `python setup.py build_ext --inplace` outside build isolation) fails obscurely
if int(setuptools.__version__.split(".")[0]) < 77:
    sys.exit(f"setup.py: setuptools {setuptools.__version__} is too old: the build needs "
             "setuptools>=77 (pyproject.toml [build-system] requires); "
             "pip install 'setuptools>=77'")

CORE = "src/bursarcore/core"
CORE_SOURCES = sorted(set(glob.glob(f"{CORE}/src/*.c")) - {f"{CORE}/src/unity.c"})
CORE_INCLUDE = [f"{CORE}/include", f"{CORE}/src"]
CORE_HEADERS = sorted(glob.glob(f"{CORE}/include/*.h") + glob.glob(f"{CORE}/src/*.h")
                      + glob.glob(f"{CORE}/src/*.c"))
# Cython modules that bind the core: each includes what it uses (the whole core as
# core/src/unity.c, or the inline rules of a header), so the compiler can inline it;
# _acquire and _results cimport the engine's declarations (_engine.pxd, over engine.h);
# _journalfill reads the public header's codes
BINDS_CORE = {"_buckets", "_flow", "_engine", "_acquire", "_results", "_journalfill"}
LIBRARY = "bursarcore.core.libbursarcore"

extra = ["-O3"] if os.name != "nt" else ["/O2"]
# Distributed binaries carry no debug information: -g0 drops it at compile time (after the
# interpreter's own -g), -s strips the symbol table at link time (GNU ld).
if os.name != "nt":
    extra.append("-g0")
link = ["-s"] if sys.platform.startswith("linux") else []

# BURSAR_BUILD_ONLY=_engine,_flow builds just those (a developer's quick rebuild with
# `python setup.py build_ext --inplace`; `libbursarcore` and `_cffi_core` name the other
# two products); unset, everything is built.
ONLY = os.environ.get("BURSAR_BUILD_ONLY")


def wanted(name):
    return ONLY is None or name in ONLY.split(",")


extensions = [
    Extension(
        f"bursarcore.{name}",
        [f"src/bursarcore/{name}.pyx"],
        include_dirs=[np.get_include()] + (CORE_INCLUDE if name in BINDS_CORE else []),
        depends=CORE_HEADERS if name in BINDS_CORE else [],
        extra_compile_args=extra,
        extra_link_args=link,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for name in sorted(os.path.basename(p)[:-4] for p in glob.glob("src/bursarcore/_*.pyx"))
    if wanted(name)
]
ext_modules = cythonize(
    extensions,
    compiler_directives={"language_level": "3", "boundscheck": False,
                         "wraparound": False, "cdivision": True},
) if extensions else []
if wanted("libbursarcore"):
    ext_modules.append(Extension(LIBRARY, CORE_SOURCES, include_dirs=CORE_INCLUDE,
                                 extra_compile_args=extra + ["-std=c11", "-fwrapv",
                                                             "-ffp-contract=off"],
                                 extra_link_args=link, libraries=["m"]))


class BuildExt(build_ext):
    """``libbursarcore`` is a plain C library: named ``libbursarcore.so`` (no interpreter
    tag, as a linker's ``-lbursarcore`` expects) and exporting only the ABI."""

    def get_ext_filename(self, fullname):
        # the full name for a build, the last part alone for an in-place one
        if fullname in (LIBRARY, LIBRARY.rsplit(".", 1)[1]):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext):
        if ext.name == LIBRARY:
            return []
        return super().get_export_symbols(ext)


setup(
    ext_modules=ext_modules,
    cmdclass={"build_ext": BuildExt},
    cffi_modules=["src/bursarcore/_cffi_build.py:ffibuilder"] if wanted("_cffi_core") else [],
)
