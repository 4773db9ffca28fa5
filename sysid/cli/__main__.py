"""``python -m sysid.cli``: the same entry point as the ``sysid`` command."""

from sysid.cli import main

raise SystemExit(main())
