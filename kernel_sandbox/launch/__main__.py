"""``python -m kernel_sandbox.launch``: see :mod:`kernel_sandbox.launch`."""

import sys

from . import main

sys.exit(main())
