"""Regenerate the README tables from the committed result files.

Every number in README comes from a file under results/; this script is the only writer of the regions between
`<!-- table:NAME -->` and `<!-- /table:NAME -->`. Run it after committing new results:

    python scripts/readme_tables.py            # rewrite README.md in place
    python scripts/readme_tables.py --check    # exit 1 if README is stale (used by the tests)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STS7 = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")


def load_results(results_dir: Path = ROOT / "results") -> list[dict]:
    records = []
    for path in sorted(results_dir.glob("*.json")):
        if path.name.startswith("bench-"):
            continue
        record = json.loads(path.read_text())
        record["_file"] = path.name
        records.append(record)
    return records


def _score_row(record: dict) -> str:
    scores = record["scores"]
    cells = [f"{scores[name]:.2f}" for name in STS7] + [f"**{scores['avg']:.2f}**"]
    dev = scores.get("stsb_dev")
    return " | ".join(
        [
            f"`{record['model']}`",
            record.get("encoder", "bi"),
            f"{record['params_m']:.1f}",
            *cells,
            f"{dev:.2f}" if dev is not None else "–",
            f"[{record['_file']}](results/{record['_file']})",
        ]
    )


def baselines_table(records: list[dict]) -> str:
    rows = [r for r in records if r["kind"] == "baseline"]
    rows.sort(key=lambda r: -r["scores"]["avg"])
    header = "| model | enc | params (M) | " + " | ".join(STS7) + " | avg | STS-B dev | result file |"
    rule = "|" + "---|" * (len(STS7) + 6)
    return "\n".join([header, rule] + [f"| {_score_row(r)} |" for r in rows])


TABLES = {"baselines": baselines_table}


def render(readme: str, records: list[dict]) -> str:
    for name, make in TABLES.items():
        pattern = re.compile(rf"(<!-- table:{name} -->\n).*?(<!-- /table:{name} -->)", re.S)
        readme = pattern.sub(lambda m: m.group(1) + make(records) + "\n" + m.group(2), readme)
    return readme


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if README.md is not what the results say")
    args = parser.parse_args()
    readme_path = ROOT / "README.md"
    current = readme_path.read_text()
    updated = render(current, load_results())
    if args.check:
        if updated != current:
            print("README.md tables are stale: run python scripts/readme_tables.py", file=sys.stderr)
            return 1
        return 0
    readme_path.write_text(updated)
    return 0


if __name__ == "__main__":
    sys.exit(main())
