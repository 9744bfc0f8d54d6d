"""The Trans-Encoder job's targets, checked against the committed result files: results/mutual_tenc/targets.json.

    python scripts/tenc_targets.py                                   # write results/mutual_tenc/targets.json
    python scripts/tenc_targets.py --results-dir DIR --out FILE      # other result files, another output

Runs are found by name. The job names a run ``tenc-<mode>-<families>-<pairs>-<config hash>`` (the hash leaves out
evaluation, resources, tracking and paths), and every result file records that name in ``extra.run_name``:

    default STS run   the shipped mutual_tenc.yaml                  python jobs/mutual_tenc.py
    its self twin     the same config with mode: self (mean labels)  python jobs/mutual_tenc.py --mode self
    QQP run           the shipped mutual_tenc-qqp.yaml              python jobs/mutual_tenc.py --config mutual_tenc-qqp
    MRPC run          the same on MRPC train + validation pairs      python jobs/mutual_tenc.py --config mutual_tenc-qqp
                                                                     --set pairs.source=mrpc
    held-out QQP run  the QQP run split in halves (inductive)       python jobs/mutual_tenc.py --config mutual_tenc-qqp
                                                                     --set pairs.held_out=2000

Best models are chosen as the job chooses them, by STS-B dev among a run's result files: the bi-encoder over every
cycle with a file, cycle 0 (the starting checkpoint) included; the cross-encoder over cycles 1 and later (there is
none before); ties go to the earlier cycle. Scores are 7-STS averages (Spearman x 100); AUCs are ROC AUC x 100 of
the QQP run's pair scores against the gold labels of the pairs it learned from (transductive), or, for the
held-out run, of 2,000 pairs of the other half of QQP dev, which share no sentence with the pairs it learned from.

Targets, per family: the mutual best bi-encoder gains >= 1.0 over the start; it is >= the self-distilled best
bi-encoder; the mutual best cross-encoder is >= the start bi-encoder; on QQP the best cross-encoder's AUC is >= the
start bi-encoder's + 2.0; on the held-out QQP pairs the best bi-encoder's AUC is >= the start's + 1.5 (inductive).
For the default run: wall time <= 3600 s. The MRPC run's AUCs are reported beside them
(``mrpc_*``), with no target of their own. A target whose inputs are missing is "missing"
with a note saying what is absent, never filled in.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEV_SET = "stsb_dev"
GAIN_OVER_START = 1.0  # 7-STS points the mutual bi-encoder must gain over its start
AUC_GAIN_OVER_START = 2.0  # QQP AUC points the best cross-encoder must gain over the start bi-encoder
HELD_OUT_PAIRS = 2000  # the held-out QQP run's pairs.held_out
HELD_OUT_AUC_GAIN = 1.5  # held-out QQP AUC points the best bi-encoder must gain over its start
MAX_WALL_S = 3600.0  # the default run, end to end


def run_names() -> dict[str, dict[str, str]]:
    """The name the job gives each run this script checks, from the shipped configs, and how to produce the run."""
    from raydistill.runtime.entry import self_mode_overrides
    from raydistill.runtime.tenc import TencConfig
    from raydistill.shipped import shipped_config

    default = TencConfig.from_yaml(shipped_config("mutual_tenc"))
    twin = TencConfig.from_yaml(shipped_config("mutual_tenc"), ["mode=self", *self_mode_overrides("self", [])])
    qqp = TencConfig.from_yaml(shipped_config("mutual_tenc-qqp"))
    mrpc = TencConfig.from_yaml(shipped_config("mutual_tenc-qqp"), ["pairs.source=mrpc"])
    held_out = TencConfig.from_yaml(shipped_config("mutual_tenc-qqp"), [f"pairs.held_out={HELD_OUT_PAIRS}"])
    return {
        "mutual": {"run_name": default.default_run_name(), "command": "python jobs/mutual_tenc.py"},
        "self": {"run_name": twin.default_run_name(), "command": "python jobs/mutual_tenc.py --mode self"},
        "qqp": {"run_name": qqp.default_run_name(), "command": "python jobs/mutual_tenc.py --config mutual_tenc-qqp"},
        "mrpc": {"run_name": mrpc.default_run_name(),
                 "command": "python jobs/mutual_tenc.py --config mutual_tenc-qqp --set pairs.source=mrpc"},
        "qqp_held_out": {"run_name": held_out.default_run_name(),
                         "command": "python jobs/mutual_tenc.py --config mutual_tenc-qqp --set "
                                    f"pairs.held_out={HELD_OUT_PAIRS}"},
    }


def default_families() -> list[str]:
    from raydistill.runtime.tenc import TencConfig
    from raydistill.shipped import shipped_config

    return [f.name for f in TencConfig.from_yaml(shipped_config("mutual_tenc")).families]


def load_runs(results_dir: Path) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """(run name -> its Trans-Encoder result records, run name -> its summary.json) found under ``results_dir``."""
    records: dict[str, list[dict]] = {}
    summaries: dict[str, dict] = {}
    for path in sorted(results_dir.rglob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        if data.get("kind") == "mutual_tenc" and "scores" in data:
            data["_file"] = str(path)
            records.setdefault(data.get("extra", {}).get("run_name", "?"), []).append(data)
        elif path.name == "summary.json" and "run_name" in data and "by_family" in data:
            summaries[data["run_name"]] = data
    return records, summaries


def best_record(records: list[dict], family: str, encoder: str) -> dict | None:
    """The job's choice among a run's files: highest dev, ties to the earlier cycle; cross-encoders from cycle 1."""
    candidates = [r for r in records
                  if r.get("extra", {}).get("family") == family and r.get("encoder", "bi") == encoder
                  and isinstance(r.get("training", {}).get("cycle"), int) and DEV_SET in r["scores"]
                  and (encoder == "bi" or r["training"]["cycle"] >= 1)]
    if not candidates:
        return None
    return max(candidates, key=lambda r: (r["scores"][DEV_SET], -r["training"]["cycle"]))


def start_record(records: list[dict], family: str) -> dict | None:
    return next((r for r in records if r.get("extra", {}).get("family") == family
                 and r.get("encoder", "bi") == "bi" and r.get("training", {}).get("cycle") == 0), None)


def _avg(record: dict | None) -> float | None:
    return None if record is None else record["scores"]["avg"]


def _auc(record: dict | None) -> float | None:
    return None if record is None else record.get("extra", {}).get("pair_auc", {}).get("auc")


def _cycle(record: dict | None) -> int | None:
    return None if record is None else record["training"]["cycle"]


def at_least(value: float | None, needed: float | None, rule: str, missing: list[str]) -> dict[str, Any]:
    """One target: ``value >= needed``; "missing" (with what is absent) when either side is unknown."""
    if value is None or needed is None:
        return {"rule": rule, "status": "missing", "value": value, "needed": needed, "missing": missing}
    return {"rule": rule, "status": "met" if value >= needed - 1e-9 else "missed", "value": round(value, 2),
            "needed": round(needed, 2)}


def run_description(key: str, names: dict[str, dict[str, str]], records: dict[str, list[dict]],
                    summaries: dict[str, dict]) -> dict[str, Any]:
    """Which run a key stands for, the files found for it and how they were produced (or that it is missing)."""
    name = names[key]["run_name"]
    files = records.get(name, [])
    described: dict[str, Any] = {"run_name": name, "produced_by": names[key]["command"], "result_files": len(files)}
    if not files:
        described["missing"] = f"no result file with extra.run_name {name}; run `{names[key]['command']}`"
        return described
    described["commands"] = sorted({r.get("command", "?") for r in files})
    described["git_shas"] = sorted({r.get("git_sha", "?") for r in files})
    described["dates"] = [min(r.get("date", "") for r in files), max(r.get("date", "") for r in files)]
    described["summary_json"] = name in summaries
    return described


def build_targets(results_dir: Path) -> dict[str, Any]:
    names = run_names()
    records, summaries = load_runs(results_dir)
    mutual, twin, qqp, mrpc, held_out = (records.get(names[key]["run_name"], [])
                                         for key in ("mutual", "self", "qqp", "mrpc", "qqp_held_out"))

    def absent(key: str, what: str) -> str:
        return f"{what}: no result file of the {key} run {names[key]['run_name']} ({names[key]['command']})"

    families: dict[str, Any] = {}
    for family in default_families():
        start = start_record(mutual, family)
        mutual_bi, self_bi = best_record(mutual, family, "bi"), best_record(twin, family, "bi")
        mutual_cross = best_record(mutual, family, "cross")
        qqp_start, qqp_cross = start_record(qqp, family), best_record(qqp, family, "cross")
        mrpc_start, mrpc_cross = start_record(mrpc, family), best_record(mrpc, family, "cross")
        held_start, held_bi = start_record(held_out, family), best_record(held_out, family, "bi")
        row: dict[str, Any] = {
            "start_bi": _avg(start),
            "mutual_best_bi": _avg(mutual_bi), "mutual_best_bi_cycle": _cycle(mutual_bi),
            "self_best_bi": _avg(self_bi), "self_best_bi_cycle": _cycle(self_bi),
            "mutual_best_cross": _avg(mutual_cross), "mutual_best_cross_cycle": _cycle(mutual_cross),
            "qqp_start_auc": _auc(qqp_start),
            "qqp_best_cross_auc": _auc(qqp_cross), "qqp_best_cross_cycle": _cycle(qqp_cross),
            "mrpc_start_auc": _auc(mrpc_start),
            "mrpc_best_cross_auc": _auc(mrpc_cross), "mrpc_best_cross_cycle": _cycle(mrpc_cross),
            "held_out_start_auc": _auc(held_start),
            "held_out_best_bi_auc": _auc(held_bi), "held_out_best_bi_cycle": _cycle(held_bi),
        }
        notes = {
            "start_bi": absent("mutual", f"{family}-bi-cycle0"),
            "mutual_best_bi": absent("mutual", f"{family} bi-encoder"),
            "self_best_bi": absent("self", f"{family} bi-encoder"),
            "mutual_best_cross": absent("mutual", f"{family} cross-encoder"),
            "qqp_start_auc": (absent("qqp", f"{family}-bi-cycle0") if qqp_start is None
                              else f"qqp_start_auc: {Path(qqp_start['_file']).name} has no extra.pair_auc"),
            "qqp_best_cross_auc": (absent("qqp", f"{family} cross-encoder") if qqp_cross is None
                                   else f"qqp_best_cross_auc: {Path(qqp_cross['_file']).name} has no "
                                        "extra.pair_auc"),
            "held_out_start_auc": absent("qqp_held_out", f"{family}-bi-cycle0"),
            "held_out_best_bi_auc": absent("qqp_held_out", f"{family} bi-encoder"),
        }
        reported = {  # the MRPC AUCs: reported, no target of their own
            "mrpc_start_auc": absent("mrpc", f"{family}-bi-cycle0"),
            "mrpc_best_cross_auc": absent("mrpc", f"{family} cross-encoder"),
        }

        gain_needed = None if row["start_bi"] is None else row["start_bi"] + GAIN_OVER_START
        auc_needed = None if row["qqp_start_auc"] is None else row["qqp_start_auc"] + AUC_GAIN_OVER_START
        held_needed = None if row["held_out_start_auc"] is None else row["held_out_start_auc"] + HELD_OUT_AUC_GAIN
        def missing(*keys: str, row=row, notes=notes) -> list[str]:
            return [notes[k] for k in keys if row[k] is None]

        row["targets"] = {
            "mutual_gain": at_least(row["mutual_best_bi"], gain_needed,
                                    f"mutual_best_bi >= start_bi + {GAIN_OVER_START}",
                                    missing("mutual_best_bi", "start_bi")),
            "mutual_vs_self": at_least(row["mutual_best_bi"], row["self_best_bi"], "mutual_best_bi >= self_best_bi",
                                       missing("mutual_best_bi", "self_best_bi")),
            "cross_vs_start": at_least(row["mutual_best_cross"], row["start_bi"], "mutual_best_cross >= start_bi",
                                       missing("mutual_best_cross", "start_bi")),
            "qqp_cross_auc_gain": at_least(row["qqp_best_cross_auc"], auc_needed,
                                           f"qqp_best_cross_auc >= qqp_start_auc + {AUC_GAIN_OVER_START}",
                                           missing("qqp_best_cross_auc", "qqp_start_auc")),
            "held_out_bi_auc_gain": at_least(row["held_out_best_bi_auc"], held_needed,
                                             "held_out_best_bi_auc >= held_out_start_auc + "
                                             f"{HELD_OUT_AUC_GAIN} (inductive)",
                                             missing("held_out_best_bi_auc", "held_out_start_auc")),
        }
        if row["mutual_best_bi_cycle"] == 0 and row["self_best_bi_cycle"] == 0:
            row["targets"]["mutual_vs_self"]["note"] = ("both runs' best bi-encoder is the start (cycle 0): "
                                                        "neither training improved on it")
        row["missing"] = sorted({note for key, note in notes.items() if row[key] is None})
        row["reported_missing"] = sorted({note for key, note in reported.items() if row[key] is None})
        families[family] = row

    return {
        "generated_by": "python scripts/tenc_targets.py",
        "runs": {key: run_description(key, names, records, summaries) for key in names},
        "selection": f"best = highest {DEV_SET} among a run's result files; bi-encoder: every cycle with a file, "
                     "cycle 0 (the start) included; cross-encoder: cycles >= 1; ties: the earlier cycle",
        "units": "7-STS average (Spearman x 100 over STS12-16, STS-B test, SICK-R test); AUC: ROC AUC x 100 on "
                 "the QQP / MRPC run's own pairs (transductive), or on the held-out run's 2,000 pairs of the other "
                 "half of QQP dev (inductive)",
        "families": families,
        **wall_time(mutual, summaries.get(names["mutual"]["run_name"]), names),
    }


def wall_time(files: list[dict], summary: dict | None, names: dict[str, dict[str, str]]) -> dict[str, Any]:
    """The default run's wall time (its summary.json, else its last result file) against the limit."""
    rule = f"default_wall_s <= {MAX_WALL_S:.0f}"
    if summary is not None and "wall_s_total" in summary:
        runs = len(summary.get("invocations", [])) or 1
        wall = float(summary["wall_s_total"])
        source = ("summary.json wall_s_total (the whole job" + (")" if runs == 1 else
                  f", summed over the {runs} invocations that ran it: a run extended to more cycles counts its "
                  "first part; each invocation's own evaluation counts too)"))
    elif summary is not None:
        wall, source = float(summary["wall_s"]), "summary.json wall_s (the whole job)"
    elif files:
        last = max(files, key=lambda r: r.get("wall_s", 0.0))
        wall = float(last["wall_s"])
        source = (f"wall_s of the last result file written, {Path(last['_file']).name} (the job up to its last "
                  f"evaluation); command: {last.get('command', '?')}")
    else:
        return {"default_wall_s": None,
                "default_wall": {"rule": rule, "status": "missing",
                                 "missing": [f"no result file of the mutual run {names['mutual']['run_name']} "
                                             f"({names['mutual']['command']})"]}}
    return {"default_wall_s": round(wall, 1),
            "default_wall": {"rule": rule, "status": "met" if wall <= MAX_WALL_S else "missed", "source": source}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results-dir", type=Path, default=ROOT / "results" / "mutual_tenc",
                        help="where the result files are (searched recursively)")
    parser.add_argument("--out", type=Path, default=None, help="default: <results-dir>/targets.json")
    args = parser.parse_args(argv)
    targets = build_targets(args.results_dir)
    out = args.out or args.results_dir / "targets.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(targets, indent=2, sort_keys=False) + "\n", encoding="utf-8")
    for family, row in targets["families"].items():
        print(f"{family}: " + ", ".join(f"{name} {t['status']}" for name, t in row["targets"].items()))
    print(f"default wall: {targets['default_wall']['status']} ({targets['default_wall_s']} s)")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
