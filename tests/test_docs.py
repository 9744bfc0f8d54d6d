"""The front page and the docs stay true to the repository: generated tables match the result files, the README is
a front page (not a report), and nothing points at planning labels or files outside the project."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_generated_tables_match_the_result_files():
    check = subprocess.run([sys.executable, str(ROOT / "scripts" / "readme_tables.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_readme_is_a_front_page():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "bash scripts/setup.sh && .venv/bin/python jobs/mutual_tenc.py" in text
    assert "bash scripts/setup.sh && .venv/bin/python -m pytest -q" in text  # what .ci/run runs
    assert not re.search(r"\b[0-9a-f]{7,40}\b(?<![0-9]{7})", re.sub(r"<!-- table:job_log -->.*?<!-- /table:job_log -->",
                                                                      "", text, flags=re.S)), "a commit hash"
    for link in re.findall(r"\]\(((?:docs|results)/[^)#]+)\)", text):
        assert (ROOT / link).exists(), f"README links {link}, which does not exist"


# Labels of the project's planning, and paths outside the repository, have no meaning to a reader of the code.
PLANNING = re.compile("|".join([r"\b[Ii]ssue \d+\b", r"\bR[12]\b(?!\w)", r"\b[Ss]ession \d+\b",
                                r"\.\./" + "shared/"]))
SCANNED = ("raydistill", "jobs", "bench", "scripts", "tests", "docs")
SUFFIXES = {".py", ".md", ".yaml", ".sh", ".toml"}


def test_no_planning_labels_or_outside_references():
    hits = []
    for top in SCANNED:
        for path in (ROOT / top).rglob("*"):
            if path.suffix not in SUFFIXES or path == Path(__file__).resolve() or "__pycache__" in path.parts:
                continue
            for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
                if PLANNING.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert not hits, "\n".join(hits)


def test_a_compared_student_whose_result_file_was_rerun_since_says_so():
    """docs/benchmarks.md's side-by-side table keeps what was measured; a row whose result file a rerun replaced
    since (another git sha in the file than the bench recorded) is footnoted, not silently relabelled."""
    import copy
    import json

    sys.path.insert(0, str(ROOT))
    from scripts.readme_tables import compare_public_table

    row = {"name": "mpnet-base", "label": "teacher", "family": "teacher", "sts7_avg": 80.5, "params_m": 109.5,
           "sentences_per_s": {"wall": 20.0, "cpu": 10.0}, "vs_teacher": {"speed": 1.0, "speed_cpu": 1.0, "sts7": 0.0},
           "sts7_source": "results/baseline-mpnet-base.json", "speed_model": {"preset": "mpnet-base"},
           "result_git_sha": json.loads((ROOT / "results/baseline-mpnet-base.json").read_text())["git_sha"]}
    record = {"batch": 128, "threads": 2, "sentences": 4, "machine": {"cpu": "test CPU"}, "models": [row]}
    assert "the file changed since" not in compare_public_table([], record=copy.deepcopy(record))
    row["result_git_sha"] = "0" * 40  # measured from an earlier version of that file
    table = compare_public_table([], record=record)
    assert "**80.50** †" in table and "the file changed since (rerun" in table


def test_a_targets_comparison_on_the_unfiltered_corpus_says_so_in_its_own_cell():
    """README's targets row links the label-free student's file; a SimCSE or st-mse run it is compared with that
    trained before the evaluation-text filter is marked in its own cell, not passed off as the same corpus."""
    sys.path.insert(0, str(ROOT))
    from scripts.readme_tables import BEFORE_FILTER_SENTENCES, scale_targets_table

    def run(method: str, avg: float, sentences: int, teacher: str | None = "mpnet-base") -> dict:
        scores = {"avg": avg, "stsb_dev": avg + 5}
        return {"kind": "distill", "model": "bert-mini", "method": method, "teacher": teacher, "scores": scores,
                "training": {"corpus": "mixed", "sentences": sentences}, "_file": f"mixed/{method}.json"}

    baseline = {"kind": "baseline", "model": "bert-mini", "scores": {"avg": 72.0}, "training": {}}
    records = [baseline, run("congen", 77.0, 269_340), run("simcse", 73.5, BEFORE_FILTER_SENTENCES, None),
               run("st-mse", 70.2, 269_340)]
    row = next(line for line in scale_targets_table(records).splitlines() if line.startswith("| `bert-mini`"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[5] == "73.50 (before the filter)"  # SimCSE
    assert cells[7] == "70.20"  # st-mse, on the filtered corpus


def test_the_quick_start_prints_the_recipe_the_package_carries():
    """The quick start's recipe line is what ``raydistill distill`` prints for a minilm-l3-sized student today: the
    embedded recipe, whose scores tests/test_distill_command.py holds to the committed result file."""
    from raydistill.ship.recipe import RECIPES

    recipe = next(r for r in RECIPES if r.size == "minilm-l3" and r.labels == "none")
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"[distill] recipe of the minilm-l3 size, label-free: {recipe.describe()}\n" in readme


def test_the_quick_start_shows_a_committed_run_of_its_command_from_a_clean_tree():
    """The quick start's session is generated from the manifest its command wrote (scripts/readme_tables.py): the
    README command, run on a committed checkout, with the teacher, the student and each export measured."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from readme_tables import QUICKSTART_MANIFEST, quickstart_session

    manifest = json.loads(QUICKSTART_MANIFEST.read_text(encoding="utf-8"))
    assert manifest["kind"] == "raydistill_package" and "code_diff_sha256" not in manifest
    assert re.fullmatch(r"[0-9a-f]{40}", manifest["git_sha"]), manifest["git_sha"]
    assert manifest["command"] == ("raydistill distill --teacher minilm-l6 --student layers:3 --corpus mixed "
                                   "--max-sentences 20000 --out minilm-l6-l3")
    kinds = [row["kind"] for row in manifest["rows"]]
    assert kinds[:2] == ["teacher", "student"] and kinds.count("export") >= 2, kinds
    assert all(row["sentences_per_s"] > 0 and "avg" in row["scores"] for row in manifest["rows"])
    session = quickstart_session()
    # a run that trained the recipe's epochs shows the option that asks for them today (distill's default is a
    # time budget); a run with a budget shows its command as it was
    shown = manifest["command"] + ("" if manifest["recipe"].get("budget", "epochs") != "epochs" else " --budget epochs")
    assert f"$ .venv/bin/{shown}\n" in session
    assert session in (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_main_job_table_shows_the_transductive_and_the_inductive_run():
    """The front page reports the main job both ways, each labelled: trained on the unlabeled test pairs (the
    paper's setting), and on pairs with no evaluation sentence in them, so a reader sees what transduction buys; a
    default whose inductive run is not committed yet says so."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = re.search(r"<!-- table:tenc_main -->\n(.*?)<!-- /table:tenc_main -->", readme, re.S).group(1)
    rows = [[cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]]
    for family in ("bert-tiny", "bert-small"):
        sources = {row[0].split(" ", 1)[1] for row in rows if row[1] == family}
        assert "transductive (trained on the unlabeled test pairs)" in sources, (family, sources)
        if "inductive (no evaluation sentence)" not in sources:  # then the page says so, and where the last one is
            assert "its inductive run is not committed yet" in readme.replace("\n", " "), (family, sources)


def test_the_inductive_run_is_described_by_its_table():
    """docs/trans-encoder.md says the inductive run's kept models are within half a point of the transductive
    run's: true of every row of the generated table beneath it, or the sentence must change."""
    page = (ROOT / "docs" / "trans-encoder.md").read_text(encoding="utf-8")
    assert "within half a point of each\nother on 7-STS" in page
    table = re.search(r"<!-- table:tenc_inductive -->\n(.*?)<!-- /table:tenc_inductive -->", page, re.S).group(1)
    differences = [float(line.strip("|").split("|")[-1]) for line in table.splitlines()[2:]]
    assert len(differences) == 4 and max(abs(d) for d in differences) <= 0.5, differences


def test_the_public_comparison_prose_holds_for_the_committed_run():
    """docs/benchmarks.md's words under the comparison table, checked against results/bench-compare_public.json:
    every raydistill student above Model2Vec and above sentence-transformers' recipe of its size; the DistilCSE
    models timed at 32 tokens, ConGen's minilm-l3 and st-mse's at 64, where those two encode at about one rate."""
    record = json.loads((ROOT / "results" / "bench-compare_public.json").read_text(encoding="utf-8"))
    rows = record["models"]
    ours = [r for r in rows if r["family"] == "raydistill"]
    size = {id(r): (r.get("speed_model") or {}).get("preset") for r in rows}
    for other in (r for r in rows if r["family"] in ("model2vec", "st-mse")):
        rivals = [o for o in ours if other["family"] == "model2vec" or size[id(o)] == size[id(other)]]
        assert rivals and all(o["sts7_avg"] > other["sts7_avg"] for o in rivals), other["label"]
    by_label = {r["label"]: r for r in rows}
    assert all(r["max_length"] == 32 for r in ours if r["method"] == "distilcse")
    congen, st_mse = by_label["congen minilm-l3"], by_label["st-mse minilm-l3"]
    assert congen["max_length"] == st_mse["max_length"] == 64
    assert 1 / 1.15 < congen["sentences_per_s"]["cpu"] / st_mse["sentences_per_s"]["cpu"] < 1.15
    prose = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    assert "at 64 tokens those two minilm-l3 students\nencode at about the same rate" in prose


def test_every_front_page_number_comes_from_a_file_whose_code_is_identified():
    """README's tables (the best students, the targets, the main job's runs) read only result files written from a
    clean commit, or from one plus a change they identify by its hash; docs/results.md counts the older ones."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from readme_tables import _front_page_files, _main_job_runs, load_results

    records = load_results()
    by_file = {r["_file"]: r for r in records}
    linked = [by_file[name] for name in _front_page_files(records)]
    main_job = [r for slots in _main_job_runs(records)[1].values() for r in slots.values()]
    assert linked and main_job
    for record in linked + main_job:
        sha = record["git_sha"]
        assert re.fullmatch(r"[0-9a-f]{40}", sha) or (sha.endswith("-dirty") and record.get("code_diff_sha256")), \
            (record["_file"], sha)
