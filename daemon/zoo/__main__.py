"""``python -m inferd.zoo``: same as ``inferd zoo``."""

from __future__ import annotations

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
