"""Build the compiled core. Metadata lives in pyproject.toml."""

import glob
import os
import sys

import numpy as np
import setuptools
from Cython.Build import cythonize
from setuptools import Extension, setup

# pyproject.toml's SPDX `license` and `license-files` need setuptools 77; an older one (a
# direct `python setup.py build_ext --inplace` outside build isolation) fails obscurely
if int(setuptools.__version__.split(".")[0]) < 77:
    sys.exit(f"setup.py: setuptools {setuptools.__version__} is too old: the build needs "
             "setuptools>=77 (pyproject.toml [build-system] requires); "
             "pip install 'setuptools>=77'")

extra = ["-O3"] if os.name != "nt" else ["/O2"]
# Distributed binaries carry no debug information: -g0 drops it at compile time (after the
# interpreter's own -g), -s strips the symbol table at link time (GNU ld).
if os.name != "nt":
    extra.append("-g0")
link = ["-s"] if sys.platform.startswith("linux") else []

extensions = [
    Extension(
        f"bursarcore.{name}",
        [f"src/bursarcore/{name}.pyx"],
        include_dirs=[np.get_include()],
        extra_compile_args=extra,
        extra_link_args=link,
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    )
    for name in sorted(os.path.basename(p)[:-4] for p in glob.glob("src/bursarcore/_*.pyx"))
    # BURSAR_BUILD_ONLY=_engine,_flow builds just those (a developer's quick rebuild with
    # `python setup.py build_ext --inplace`); unset, every extension is built.
    if name in os.environ.get("BURSAR_BUILD_ONLY", name).split(",")
]

setup(
    ext_modules=cythonize(
        extensions,
        compiler_directives={"language_level": "3", "boundscheck": False,
                             "wraparound": False, "cdivision": True},
    ),
)
