"""``python -m bursarcore.service``: the same as ``bursar serve``."""

import sys

from .cli import main

sys.exit(main())
