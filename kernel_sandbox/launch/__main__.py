"""``python -m kernel_sandbox.launch``: see :mod:`kernel_sandbox.launch.launcher`."""

import sys

from .launcher import main

sys.exit(main())
