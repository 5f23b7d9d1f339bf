"""``python -m pitfalls ...``: the ``pitfalls`` command."""

import sys

from pitfalls.cli import main

sys.exit(main())
