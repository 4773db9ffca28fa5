"""Shared test setup. The tests live in one folder per area (``engine``, ``fit``, ``ingest``, ``synth``,
``plan``, ``app``) and are packages of ``tests``, so pytest puts the repository root on the import path
and every test imports shared code by its package name: ``tests.helpers.engine`` (engine scenes and
rollouts), ``tests.helpers.fit_doubles`` (simulator doubles, also named by fit configs as
``tests.helpers.fit_doubles:<factory>``, allowed here), ``tests.helpers.ingest_fixtures``,
``tests.helpers.report_fixtures``."""

from __future__ import annotations

import warp as wp

from sysid.simulators.protocol import allow_simulator

wp.config.quiet = True  # kernel-cache chatter is not test output

# the doubles configs name by path, allowed as `--allow-simulator` would (a fan-out hands them to Ray's workers)
for _factory in ("make_double", "make_unconverged_double"):
    allow_simulator(f"tests.helpers.fit_doubles:{_factory}")
