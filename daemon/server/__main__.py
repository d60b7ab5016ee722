"""``python -m inferd.server [options]``: the same as ``inferd serve``."""
import sys

from . import serve_main

sys.exit(serve_main(sys.argv[1:]))
