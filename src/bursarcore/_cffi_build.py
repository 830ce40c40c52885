"""The cffi binding of the C core: ``bursarcore._cffi_core``, built from the same sources as
the Cython binding and the shared library (``core/``), declared from the public header as
written (the part between its ``cdef begin`` and ``cdef end`` markers).

setup.py builds it (``cffi_modules``); by hand: ``python src/bursarcore/_cffi_build.py``
from the project root. API mode (out-of-line, compiled), so it runs on CPython and on PyPy
without CPython-only tricks.
"""

from __future__ import annotations

import os
import sys

from cffi import FFI

HERE = os.path.dirname(os.path.abspath(__file__))
CORE = os.path.join(HERE, "core")
HEADER = os.path.join(CORE, "include", "bursarcore.h")
# the admission engine's state and its cffi-facing functions (private: not the public ABI)
ENGINE_HEADERS = [os.path.join(CORE, "src", "engine.h"), os.path.join(CORE, "src", "engine_ffi.h")]
SOURCES = [os.path.join(CORE, "src", "unity.c")]       # the whole core, one unit


def _sections(text: str) -> str:
    """What lies between a header's ``cdef begin`` and ``cdef end`` markers."""
    parts = text.split("/* --- cdef begin")[1:]
    return "".join(p.split("\n", 1)[1].split("/* --- cdef end", 1)[0] for p in parts)


def declarations() -> str:
    """The declarations cffi reads: the public header's cdef sections and the integer
    constants it defines, then the engine's (its state and functions, ``static`` as they
    are compiled into the module itself)."""
    with open(HEADER, encoding="utf-8") as f:
        text = f.read()
    consts = [line.split()[1] for line in text.splitlines()
              if line.startswith("#define BC_") or line.startswith("#define BURSARCORE_ABI")]
    out = "".join(f"#define {name} ...\n" for name in consts) + _sections(text)
    for path in ENGINE_HEADERS:
        with open(path, encoding="utf-8") as f:
            out += _sections(f.read()).replace("static ", "")
    return out


def _rel(path: str) -> str:
    # setuptools wants sources relative to the project root, where it runs this script
    return os.path.relpath(path)


ffibuilder = FFI()
ffibuilder.cdef(declarations())
ffibuilder.set_source(
    "bursarcore._cffi_core",
    '#include "bursarcore.h"\n#include "engine_ffi.h"',
    sources=[_rel(p) for p in SOURCES],
    include_dirs=[_rel(os.path.join(CORE, "include")), _rel(os.path.join(CORE, "src"))],
    extra_compile_args=(["-O3", "-g0", "-fwrapv", "-ffp-contract=off"] if os.name != "nt"
                        else ["/O2"]),
    libraries=["m"] if os.name != "nt" else [],
    # a distributed binary carries no symbol table (GNU ld's -s), as setup.py's others
    extra_link_args=["-s"] if sys.platform.startswith("linux") else [],
)

if __name__ == "__main__":
    ffibuilder.compile(tmpdir=os.path.join(HERE, os.pardir, os.pardir, "build", "cffi"),
                       verbose=True)
