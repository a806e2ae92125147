"""What a download of numbers is: an `Export` (a file stem, the CSV text, the JSON) and the CSV writer
that every export uses (lab.export's views, lab.inside's cell, lab.patching's sweep). A module of its
own so that the parts of a session that make downloads need nothing of lab.export, which reads the
session.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np


@dataclass
class Export:
    """One download: `name` a file stem ([A-Za-z0-9_-] only), `csv` the table, `json` everything
    (JSON-serialisable: `json_text()` refuses NaN and infinities)."""

    name: str
    csv: str
    json: dict

    def json_text(self) -> str:
        return json.dumps(self.json, ensure_ascii=False, allow_nan=False, indent=1)

    def write(self, folder: Path) -> tuple[Path, Path]:
        """Write `<name>.csv` (UTF-8 with a byte-order mark, so spreadsheets read ␣ and ⏎ right)
        and `<name>.json` (UTF-8) into `folder`; returns both paths."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        csv_path, json_path = folder / f"{self.name}.csv", folder / f"{self.name}.json"
        csv_path.write_text(self.csv, encoding="utf-8-sig", newline="")
        json_path.write_text(self.json_text(), encoding="utf-8")
        return csv_path, json_path


# ------------------------------------------------------------------------------- the CSV


def _cell(value: Any) -> str:
    """A CSV cell: empty for None, true/false for booleans, floats at full precision."""
    if value is None:
        return ""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return "" if not math.isfinite(value) else repr(value)
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    return str(value)


def to_csv(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """RFC 4180 CSV (csv module, "\\r\\n" line ends): a header, then one line per row. None and
    non-finite floats are empty cells; text is quoted only where it needs to be."""
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow([_cell(c) for c in columns])
    writer.writerows([_cell(v) for v in row] for row in rows)
    return out.getvalue()
