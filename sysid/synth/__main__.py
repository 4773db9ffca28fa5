"""``python -m sysid.synth``: the `sysid synth` command on its own."""

import sys

from .cli import main

sys.exit(main())
