"""``python -m kernel_sandbox.cli``: the ``kernel-sandbox`` command."""

import sys

from . import main

sys.exit(main())
