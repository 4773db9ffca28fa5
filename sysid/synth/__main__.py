"""``python -m sysid.synth``: the `sysid synth` command on its own."""

import sys

from sysid.synth.cli import main

sys.exit(main())
