# The cffi binding of the C core (built from core/ by _cffi_build.py): its ``ffi`` and
# ``lib`` objects, whose functions are the C ABI's (bursarcore.h).
from typing import Any

ffi: Any
lib: Any
