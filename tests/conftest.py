"""Shared test setup. The tests live in one folder per area (``engine``, ``fit``, ``ingest``, ``synth``,
``plan``, ``app``) and are packages of ``tests``, so pytest puts the repository root on the import path
and every test imports shared code by its package name: ``tests.helpers.engine`` (engine scenes and
rollouts), ``tests.helpers.fit_doubles`` (simulator doubles, also named by fit configs as
``tests.helpers.fit_doubles:<factory>``), ``tests.helpers.ingest_fixtures``, ``tests.helpers.report_fixtures``."""

from __future__ import annotations

import warp as wp

wp.config.quiet = True  # kernel-cache chatter is not test output
