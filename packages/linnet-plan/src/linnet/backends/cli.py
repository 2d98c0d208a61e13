"""`linnet backends`: the backends that can run on this machine, the ones that loaded but
cannot (and why, target by target), and the plugins left out (and why).

    linnet backends [--format json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .contract import CONTRACT
from .discovery import GROUP, Discovery, SkipRecord, discover
from .here import Survey, outcome_text, survey


def register_backends(subparsers: Any) -> None:
    """Adds `linnet backends` to the `linnet` CLI (the `linnet.commands` entry point)."""
    p = subparsers.add_parser(
        "backends", help="list the backends that can run here, and why the others cannot"
    )
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(run=backends_command)


def backends_command(args: argparse.Namespace) -> int:
    found = discover()
    report = survey(found)
    print(to_json(found, report) if args.format == "json" else to_text(found, report))
    return 0


def to_json(found: Discovery, report: Survey | None = None) -> str:
    """``linnet backends --format json``: ``available`` holds the backends that can run on
    this machine (each with ``targets``: what its probe answered for each target),
    ``unavailable`` the ones that loaded but run on none of its targets, ``skipped`` the
    plugins that did not load, ``machine`` the targets asked about.

    >>> data = json.loads(to_json(discover()))
    >>> sorted(data)
    ['available', 'contract', 'machine', 'skipped', 'unavailable']
    """
    report = survey(found) if report is None else report
    return json.dumps(
        {
            "contract": CONTRACT,
            "machine": report.machine.to_json(),
            "available": [a.to_json() for a in report.runnable],
            "unavailable": [a.to_json() for a in report.not_runnable],
            "skipped": [r.to_json() for r in found.skipped],
        },
        indent=2,
        default=str,
    )


def to_text(found: Discovery, report: Survey | None = None) -> str:
    """``linnet backends``' text: "available" means the backend can run on this machine.

    >>> print(to_text(discover()).splitlines()[0])
    backend contract 1
    """
    report = survey(found) if report is None else report
    lines = [f"backend contract {CONTRACT}"]
    if found.found:
        lines.append(f"this machine: {report.machine.describe()}")
    lines.append("")
    codes: set[str] = set()
    if report.runnable:
        rows = [("NAME", "VERSION", "CONTRACT", "DISTRIBUTION", "RUNS ON")]
        rows += [
            (
                a.name,
                str(a.found.backend.version),
                str(a.found.backend.contract),
                _origin(a.found.distribution, a.found.version),
                ", ".join(t.device or t.kind for t in a.runs_on),
            )
            for a in report.runnable
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines.append("available (can run here):")
        lines += [
            "  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows
        ]
        # Declining some targets is normal (a CUDA backend and the CPU); a probe at fault is not.
        for a in report.runnable:
            for result in a.results:
                if result.state == "fault":
                    codes.add(result.code)
                    lines.append(f"  {a.name} on {outcome_text(result)}")
                    lines += [f"      {line}" for line in result.detail.splitlines()]
    elif found.found:
        lines.append(f"available: none ({len(found.found)} loaded, none can run here: see below)")
    elif found.skipped:
        lines.append(f"available: none ({len(found.skipped)} skipped: see below)")
    else:
        lines.append(
            f"available: none (no installed package names one in the {GROUP} entry-point group)"
        )
    if report.not_runnable:
        lines += ["", "unavailable (loaded, but cannot run here):"]
        for a in report.not_runnable:
            lines.append(
                f"  {a.name} {a.found.backend.version} "
                f"({_origin(a.found.distribution, a.found.version)})"
            )
            for result in a.results:
                codes.add(result.code)
                lines.append(f"      {outcome_text(result)}")
                lines += [f"        {line}" for line in result.detail.splitlines()]
    if found.skipped:
        lines += ["", "skipped:"]
        for record in found.skipped:
            codes.add(record.code)
            lines.append(f"  {_record_text(record)}")
            lines.append(f"      from {record.path}")
            lines += [f"      {line}" for line in record.detail.splitlines()]
    for code in sorted(codes - {""}):
        lines += [
            "",
            f"{code}: a plugin's fault, for its author to fix; `linnet explain {code}` says more",
        ]
    return "\n".join(lines)


def _origin(distribution: str, version: str) -> str:
    return " ".join(p for p in (distribution, version) if p) or "?"


def _record_text(record: SkipRecord) -> str:
    if not record.code:
        return str(record)
    origin = " ".join(part for part in (record.distribution, record.version) if part)
    return (
        f"{record.name} ({origin or 'unknown distribution'}): error[{record.code}]: {record.reason}"
    )
