"""Build the compiled core. Metadata lives in pyproject.toml."""

import glob
import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

extra = ["-O3"] if os.name != "nt" else ["/O2"]

extensions = [
    Extension(
        f"bursarcore.{name}",
        [f"src/bursarcore/{name}.pyx"],
        include_dirs=[np.get_include()],
        extra_compile_args=extra,
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
