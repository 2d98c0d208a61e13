"""`linnet backends`: the backends this installation found, and the ones it left out and why.

    linnet backends [--format json]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .contract import CONTRACT
from .discovery import GROUP, Discovery, discover


def register_backends(subparsers: Any) -> None:
    """Adds `linnet backends` to the `linnet` CLI (the `linnet.commands` entry point)."""
    p = subparsers.add_parser("backends", help="list the installed backends and skipped plugins")
    p.add_argument("--format", choices=["text", "json"], default="text")
    p.set_defaults(run=backends_command)


def backends_command(args: argparse.Namespace) -> int:
    found = discover()
    print(to_json(found) if args.format == "json" else to_text(found))
    return 0


def to_json(found: Discovery) -> str:
    return json.dumps({"contract": CONTRACT,
                       "available": [f.to_json() for f in found.found],
                       "skipped": [r.to_json() for r in found.skipped]}, indent=2, default=str)


def to_text(found: Discovery) -> str:
    lines = [f"backend contract {CONTRACT}", ""]
    if found.found:
        rows = [("NAME", "VERSION", "CONTRACT", "DISTRIBUTION")]
        rows += [(f.name, str(f.backend.version), str(f.backend.contract),
                  " ".join(p for p in (f.distribution, f.version) if p) or "?")
                 for f in found.found]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        lines.append("available:")
        lines += ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip()
                  for row in rows]
    elif found.skipped:
        lines.append(f"available: none ({len(found.skipped)} skipped: see below)")
    else:
        lines.append(f"available: none (no installed package names one in the {GROUP} "
                     "entry-point group)")
    if found.skipped:
        lines += ["", "skipped:"]
        for record in found.skipped:
            lines.append(f"  {record}")
            lines.append(f"      from {record.path}")
            lines += [f"      {line}" for line in record.detail.splitlines()]
    return "\n".join(lines)
