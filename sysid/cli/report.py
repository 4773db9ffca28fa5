"""``sysid report``: re-render the HTML report from the results JSON that ``sysid fit`` writes."""

from __future__ import annotations

import argparse
from pathlib import Path

from ingest.clikit import input_clash
from sysid.cli.common import Subparsers, check_outputs
from sysid.errors import ConfigError, ResultsError


def add_parser(subparsers: Subparsers) -> argparse.ArgumentParser:
    """Add ``report`` to the ``sysid`` command's subparsers; returns its parser."""
    rp = subparsers.add_parser(
        "report",
        help="re-render the HTML report from a saved results JSON",
        description="Render the self-contained HTML report from the results JSON that `sysid fit` writes.",
        epilog="examples (after `sysid fit --config examples/fit.yaml`, which writes reports/pallet-sample/):\n"
        "  sysid report reports/pallet-sample/report.json -o report.html\n"
        "  sysid report reports/pallet-sample/report.json   # writes reports/pallet-sample/report.html",
    )
    rp.add_argument("results", metavar="RESULTS.JSON", help="results file written by `sysid fit`")
    rp.add_argument("--output", "-o", metavar="REPORT.HTML", help="HTML output (default: RESULTS with .html)")
    rp.set_defaults(func=run)
    return rp


def run(args: argparse.Namespace) -> int:
    """Execute ``sysid report``: read the results, render, write the page."""
    from ingest.fileio import atomic_write_text
    from sysid.app.report import render_report
    from sysid.app.results import load_results

    out = Path(args.output) if args.output else Path(args.results).with_suffix(".html")
    check_outputs(("-o/--output", str(out)))
    problem = input_clash([("the report" if args.output is None else "-o/--output", out)],
                          [("the results file", args.results)])
    if problem:
        raise ConfigError(f"{problem}; nothing was written (give the report another path with -o/--output)")
    doc = load_results(args.results)
    try:
        html = render_report(doc, base=out.parent)
    except (KeyError, IndexError, TypeError, ValueError) as exc:  # a field of the file's, not of a fresh fit
        raise ResultsError(f"results file {args.results!r} lacks or garbles a field the report needs "
                           f"({type(exc).__name__}: {exc}); it was cut short or edited: run sysid fit again to "
                           "write a complete one") from exc
    atomic_write_text(out, html)
    print(f"wrote {out}")
    return 0
