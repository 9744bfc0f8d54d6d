"""scripts/tenc_targets.py on synthetic result files: which runs it reads, which models it takes as best, which
targets it calls met, missed or missing, and that it never fills in a number it did not find."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "tenc_targets.py"
STS7 = ("sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr")


def script():
    """scripts/tenc_targets.py, imported: its functions run here, without a process start per call."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import tenc_targets
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return tenc_targets


def run_names() -> dict[str, str]:
    return {key: value["run_name"] for key, value in script().run_names().items()}


def default_families() -> list[str]:
    return script().default_families()


def write_record(results: Path, run_name: str, family: str, encoder: str, cycle: int, avg: float, dev: float,
                 wall_s: float = 100.0, auc: float | None = None) -> None:
    extra = {"run_name": run_name, "family": family, "cycle": cycle}
    if auc is not None:
        extra["pair_auc"] = {"auc": auc, "source": "qqp", "transductive": True}
    record = {"kind": "mutual_tenc", "method": "tenc-mutual", "model": family, "encoder": encoder, "params_m": 1.0,
              "scores": {**{name: avg for name in STS7}, "avg": avg, "stsb_dev": dev}, "extra": extra,
              "training": {"cycle": cycle, "mode": "self" if "-self-" in run_name else "mutual"},
              "wall_s": wall_s, "command": "python jobs/mutual_tenc.py", "git_sha": "abc", "date": "2026-01-01"}
    path = results / run_name / f"{family}-{encoder}-cycle{cycle}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def targets_of(results: Path, *, command_line: bool = False) -> dict:
    """The script's targets.json for ``results``: from its command line (a process of its own), or from its ``main``
    in this process (the same code, without a process start)."""
    out = results / "targets.json"
    argv = ["--results-dir", str(results), "--out", str(out)]
    if command_line:
        done = subprocess.run([sys.executable, str(SCRIPT), *argv], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
    else:
        assert script().main(argv) == 0
    return json.loads(out.read_text())


def test_targets_from_synthetic_result_files(tmp_path):
    names = run_names()
    results = tmp_path / "results"
    mutual, twin, qqp, mrpc, held_out = (names[key] for key in ("mutual", "self", "qqp", "mrpc", "qqp_held_out"))
    # the shipped default's two families: the first plays the one that gains, the second the one that does not
    gains, stays = default_families()
    # the first family, mutual: cycle 1 has the best dev (85.0), so it is the best bi-encoder although cycle 2 has the
    # higher 7-STS; the cross-encoder of cycle 2 has the best dev
    write_record(results, mutual, gains, "bi", 0, avg=75.0, dev=84.0)
    write_record(results, mutual, gains, "bi", 1, avg=76.5, dev=85.0)
    write_record(results, mutual, gains, "bi", 2, avg=77.0, dev=84.5, wall_s=3400.0)
    write_record(results, mutual, gains, "cross", 1, avg=74.0, dev=80.0)
    write_record(results, mutual, gains, "cross", 2, avg=76.0, dev=82.0)
    # the second, mutual: training made dev worse, so the start (cycle 0) stays the best bi-encoder
    write_record(results, mutual, stays, "bi", 0, avg=68.0, dev=78.0)
    write_record(results, mutual, stays, "bi", 1, avg=70.0, dev=77.0)
    write_record(results, mutual, stays, "cross", 1, avg=69.0, dev=79.0)
    # the self twin
    write_record(results, twin, gains, "bi", 0, avg=75.0, dev=84.0)
    write_record(results, twin, gains, "bi", 1, avg=76.0, dev=84.5)
    write_record(results, twin, stays, "bi", 0, avg=68.0, dev=78.0)
    # QQP: the first family only; its best-dev cross-encoder (cycle 1) has AUC 83
    write_record(results, qqp, gains, "bi", 0, avg=74.0, dev=83.0, auc=80.0)
    write_record(results, qqp, gains, "cross", 1, avg=72.0, dev=70.0, auc=83.0)
    write_record(results, qqp, gains, "cross", 2, avg=73.0, dev=69.0, auc=90.0)
    # MRPC: reported beside the targets, with none of its own
    assert mrpc != qqp
    write_record(results, mrpc, gains, "bi", 0, avg=74.0, dev=83.0, auc=70.0)
    write_record(results, mrpc, gains, "cross", 1, avg=72.0, dev=71.0, auc=72.5)
    # held-out QQP: its own run (another hash); the best-dev bi-encoder (cycle 1) gains 1.6 AUC over the start
    assert len({qqp, held_out, mrpc}) == 3
    write_record(results, held_out, gains, "bi", 0, avg=74.0, dev=83.0, auc=80.0)
    write_record(results, held_out, gains, "bi", 1, avg=74.5, dev=84.0, auc=81.6)
    write_record(results, held_out, gains, "bi", 2, avg=74.0, dev=83.5, auc=90.0)
    write_record(results, held_out, stays, "bi", 0, avg=68.0, dev=78.0, auc=70.0)
    write_record(results, held_out, stays, "bi", 1, avg=68.5, dev=79.0, auc=71.0)
    # a run of another config and a stale targets file are not read as any of the runs
    write_record(results, f"tenc-mutual-{gains}+{stays}-p500-00000000", gains, "bi", 1, avg=99.0, dev=99.0)
    (results / "targets.json").write_text(json.dumps({"families": {gains: {"start_bi": 1.0}}}))

    targets = targets_of(results)
    minilm, bert = targets["families"][gains], targets["families"][stays]
    assert (minilm["start_bi"], minilm["mutual_best_bi"], minilm["mutual_best_bi_cycle"]) == (75.0, 76.5, 1)
    assert (minilm["self_best_bi"], minilm["mutual_best_cross"], minilm["mutual_best_cross_cycle"]) == (76.0, 76.0, 2)
    assert (minilm["qqp_start_auc"], minilm["qqp_best_cross_auc"], minilm["qqp_best_cross_cycle"]) == (80.0, 83.0, 1)
    assert {name: t["status"] for name, t in minilm["targets"].items()} == {
        "mutual_gain": "met", "mutual_vs_self": "met", "cross_vs_start": "met", "qqp_cross_auc_gain": "met",
        "held_out_bi_auc_gain": "met"}
    assert (minilm["held_out_start_auc"], minilm["held_out_best_bi_auc"], minilm["held_out_best_bi_cycle"]) == \
        (80.0, 81.6, 1)
    assert minilm["missing"] == [] and minilm["reported_missing"] == []
    assert (minilm["mrpc_start_auc"], minilm["mrpc_best_cross_auc"], minilm["mrpc_best_cross_cycle"]) == (70.0, 72.5, 1)
    assert not any(name.startswith("mrpc") for name in minilm["targets"])

    assert (bert["start_bi"], bert["mutual_best_bi"], bert["mutual_best_bi_cycle"]) == (68.0, 68.0, 0)
    assert bert["self_best_bi"] == 68.0 and bert["mutual_best_cross"] == 69.0
    assert bert["qqp_start_auc"] is None and bert["qqp_best_cross_auc"] is None  # never invented
    assert bert["mrpc_start_auc"] is None and any("mrpc" in note for note in bert["reported_missing"])
    assert {name: t["status"] for name, t in bert["targets"].items()} == {
        "mutual_gain": "missed", "mutual_vs_self": "met", "cross_vs_start": "met", "qqp_cross_auc_gain": "missing",
        "held_out_bi_auc_gain": "missed"}
    assert bert["targets"]["held_out_bi_auc_gain"]["needed"] == 71.5
    assert "neither training improved" in bert["targets"]["mutual_vs_self"]["note"]
    assert bert["targets"]["mutual_gain"]["needed"] == 69.0
    assert any(qqp in note and f"{stays}-bi-cycle0" in note for note in bert["missing"])
    assert all(run in (mutual, twin, qqp, mrpc, held_out) for run in (d["run_name"] for d in targets["runs"].values()))

    # wall time: no summary.json, so the last result file's (3400 s); with one, the whole job's
    assert targets["default_wall_s"] == 3400.0 and targets["default_wall"]["status"] == "met"
    summary = {"run_name": mutual, "by_family": {}, "wall_s": 3700.0}
    (results / mutual / "summary.json").write_text(json.dumps(summary))
    targets = targets_of(results)
    assert targets["default_wall_s"] == 3700.0 and targets["default_wall"]["status"] == "missed"
    assert targets["runs"]["mutual"]["summary_json"] is True
    # a run extended by a second invocation (more cycles): the whole of it counts
    summary.update(wall_s=1000.0, wall_s_total=3500.0, invocations=[{"wall_s": 2500.0}, {"wall_s": 1000.0}])
    (results / mutual / "summary.json").write_text(json.dumps(summary))
    targets = targets_of(results)
    assert targets["default_wall_s"] == 3500.0 and targets["default_wall"]["status"] == "met"
    assert "2 invocations" in targets["default_wall"]["source"]


def test_targets_without_any_run_are_all_missing(tmp_path):
    targets = targets_of(tmp_path / "empty", command_line=True)
    for row in targets["families"].values():
        assert {t["status"] for t in row["targets"].values()} == {"missing"}
        assert row["start_bi"] is None and row["mutual_best_bi"] is None and row["qqp_start_auc"] is None
        assert row["missing"]
    assert targets["default_wall_s"] is None and targets["default_wall"]["status"] == "missing"
    assert all("missing" in run for run in targets["runs"].values())


def test_the_docs_targets_quote_the_committed_targets_file():
    """docs/trans-encoder.md's Targets list quotes results/mutual_tenc/targets.json: each family's start, best mutual
    bi- and cross-encoder and QQP AUCs, each target's status, and the default run's wall time. A rerun that
    changes the file and not the prose fails here (the file itself is checked against the result files by
    test_docs' table check and by running the script)."""
    targets = json.loads((ROOT / "results" / "mutual_tenc" / "targets.json").read_text())
    docs = (ROOT / "docs" / "trans-encoder.md").read_text()
    prose = docs[docs.index("**Targets.**"):docs.index("**History.**")]
    for family, row in targets["families"].items():
        for key in ("start_bi", "mutual_best_bi", "mutual_best_cross", "qqp_start_auc", "qqp_best_cross_auc"):
            if row.get(key) is not None:
                assert f"{row[key]:.2f}" in prose, f"{family} {key} {row[key]:.2f} is not quoted in the Targets list"
        for name, target in row["targets"].items():
            assert f"**{target['status']} for" in prose or f"**{target['status']}**" in prose, (family, name)
    assert f"{int(targets['default_wall_s'] + 0.5):,} s" in prose and f"**{targets['default_wall']['status']}**" in prose


def test_the_committed_targets_file_is_what_the_committed_results_give():
    """results/mutual_tenc/targets.json is regenerated whenever a run is committed or moved: a stale file would
    quote a best model, or count result files, that the tree no longer holds."""
    committed = json.loads((ROOT / "results" / "mutual_tenc" / "targets.json").read_text())
    assert committed == json.loads(json.dumps(script().build_targets(ROOT / "results" / "mutual_tenc"))), \
        "stale: run python scripts/tenc_targets.py"
