"""Fixtures shared by the report tests (tests/app/test_report_layout.py, test_report_browser.py): one
fit with its kinematic baseline and one cross-validation per test session, not one per module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.report_fixtures import cv_document, fit_with_baseline


@pytest.fixture(scope="session")
def baseline_fit(tmp_path_factory) -> tuple[dict[str, Any], Path]:
    """(results document, report path) of `tests.helpers.report_fixtures.fit_with_baseline`."""
    return fit_with_baseline(tmp_path_factory.mktemp("baseline-fit"))


@pytest.fixture(scope="session")
def cv_doc(tmp_path_factory) -> dict[str, Any]:
    """`tests.helpers.report_fixtures.cv_document`: two folds of the double and its baseline."""
    return cv_document(tmp_path_factory.mktemp("cv"))
