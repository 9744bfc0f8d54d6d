"""``raydistill distill``: every bad input is refused in one line with exit status 2 before a model is cut or Ray
starts; the embedded recipe table is the one the committed result files choose (best STS-B dev per student size,
never the 7-STS test average); and one whole run on a tiny teacher leaves a sentence-transformers directory that
encodes as the trained student does, which the same command run again does not train again."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from raydistill.ship.recipe import LABELS, RECIPES, SIZES, STATIC_LABELS, STATIC_SIZE
from tests import distill_fixtures, ray_fixtures

pytest_plugins = ["tests.reliability_log"]

teacher_dir, ray_session = distill_fixtures.teacher_dir, ray_fixtures.ray_session

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
LOST = "nothing: refused before a model was cut or loaded and before Ray started"



def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    from raydistill import cli

    try:
        code = cli.main(argv)
    except SystemExit as exited:  # argparse's own errors
        code = exited.code
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ----------------------------------------------------------------------------------------------------------------
# Refusals


def _eval_sentences(count: int) -> list[str]:
    from raydistill.data import load_dataset

    return [pair.sentence1 for pair in load_dataset("stsb_dev")][:count]


# (case, the arguments that differ from a good command, words the one-line message must hold). In the arguments,
# TEACHER is the tiny teacher (2 layers, 48 wide, heads of 12), CORPUS a good corpus and TMP the test's directory.
REFUSALS = [
    ("unknown teacher", ["--teacher", "mpnet-bsae"],
     ["--teacher 'mpnet-bsae': not a preset (did you mean 'mpnet-base'?)", "pip install 'raydistill[weights]'"]),
    ("teacher directory that does not exist", ["--teacher", "./no/such/teacher"],
     ["--teacher './no/such/teacher'", "does not exist"]),
    ("cut deeper than the teacher", ["--student", "layers:3"],
     ["--student 'layers:3': 3 layers is deeper than the teacher", "(2 layers)"]),
    ("cut wider than the teacher", ["--student", "layers:1,hidden:96"],
     ["--student 'layers:1,hidden:96': hidden 96 is wider than the teacher", "(48)"]),
    ("cut width not whole heads", ["--student", "layers:1,hidden:30"],
     ["hidden 30 must be a multiple of the teacher's head size 12"]),
    ("layers that are not a number", ["--student", "layers:two"],
     ["--student 'layers:two': layers must be a positive integer, got 'two'"]),
    ("zero layers", ["--student", "layers:0"], ["--student 'layers:0': layers must be a positive integer, got 0"]),
    ("misspelled cut", ["--student", "lyers:1"], ["'lyers:1' is not a cut; expected layers:N[,hidden:H][,ffn:F]"]),
    ("student preset wider than the teacher", ["--student", "bert-tiny"],
     ["--student 'bert-tiny' (2 layers x 128) is wider than the teacher", "must not be larger than its teacher"]),
    ("empty corpus", ["--corpus", "TMP/empty.txt"], ["empty.txt: file is empty (no records)"]),
    ("corpus that does not exist", ["--corpus", "TMP/missing.jsonl"],
     ["--corpus 'TMP/missing.jsonl': file not found"]),
    ("corpus of evaluation sentences only", ["--corpus", "TMP/evaluation.txt"],
     ["evaluation.txt", "nothing is left to train on"]),
    ("unknown --labels", ["--labels", "gold"], ["--labels 'gold': unknown; choose from none, nli"]),
    ("misspelled --set field", ["--set", "train.bach_size=16"],
     ["field 'train.bach_size': unknown field (did you mean 'batch_size'?)"]),
    ("--max-sentences 0", ["--max-sentences", "0"], ["argument --max-sentences: expected a positive integer, got 0"]),
    ("evaluation pairs file that does not exist", ["--eval-pairs", "TMP/pairs.tsv"],
     ["--eval-pairs", "pairs.tsv: file not found"]),
    ("--out holding other files", ["--out", "TMP/taken"], ["taken: not empty and not an earlier raydistill package"]),
    ("a budget that is neither time nor steps", ["--budget", "soon"],
     ["--budget 'soon': expected a number of steps (1500, \"1500 steps\") or a wall time"]),
    ("dev pairs that are also evaluation pairs", ["--dev-pairs", "TMP/dev.tsv", "--eval-pairs", "TMP/eval.tsv"],
     ["--dev-pairs", "dev.tsv: 1 of its 2 pairs are also in --eval-pairs", "'a cat sleeps' / 'a cat naps'"]),
]


@pytest.mark.parametrize("case, args, words", REFUSALS, ids=[c[0].replace(" ", "-") for c in REFUSALS])
def test_bad_input_is_refused_in_one_line_before_any_work(case, args, words, teacher_dir, tmp_path, monkeypatch,
                                                           capsys, no_ray_start, reliability):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("a dog runs across the field\ntwo people ride bikes downhill\n")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "evaluation.txt").write_text("\n".join(_eval_sentences(20)) + "\n")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    (tmp_path / "dev.tsv").write_text("a cat sleeps\ta cat naps\t1\na man cooks\tthe sky is blue\t0\n")
    (tmp_path / "eval.tsv").write_text("a cat naps\ta cat sleeps\t4.5\ntwo dogs play\ta car drives\t0.5\n")
    good = {"--teacher": str(teacher_dir), "--student": "layers:1", "--corpus": str(tmp_path / "corpus.txt"),
            "--out": str(tmp_path / "out")}
    given = [arg.replace("TMP", str(tmp_path)) for arg in args]
    options = dict(good)
    extra = []
    for name, value in zip(given[::2], given[1::2]):
        if name in options:
            options[name] = value
        else:
            extra += [name, value]
    argv = ["distill", *[part for item in options.items() for part in item], *extra]

    code, out, err = run_cli(argv, capsys)

    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for word in words:
        assert word.replace("TMP", str(tmp_path)) in lines[0], lines[0]
    assert lines[0].startswith("raydistill distill: ")
    assert "Traceback" not in err + out
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.training").exists()
    shown = shlex.join(["raydistill", *argv]).replace(str(teacher_dir), "TEACHER").replace(str(tmp_path), "<tmp>")
    reliability.record("CLI", f"raydistill distill: {case}", input=shown, did="exited with status 2",
                       message=lines[0].replace(str(teacher_dir), "TEACHER"), lost=LOST)


# ----------------------------------------------------------------------------------------------------------------
# The recipe table against the committed result files


# Stages that learn from labels: a run with one is not label-free, but its first stage (DistilCSE's CKD) is, and the
# job records that stage's scores. (scripts/readme_tables.py LABELLED_STAGES.)
LABELLED_STAGES = {"simcse-sup", "dvbert", "sts-cosine"}
NLI_STAGE = "simcse-sup"
# A label-free first stage run on its own: DistilCSE's first stage is CKD.
FIRST_STAGE_METHOD = {"distilcse": "ckd"}


def _committed_runs() -> list[dict]:
    """Every run on the whole mixed corpus from the recipes' teacher that ``run_distillation`` trains."""
    from raydistill.ship.recipe import SOURCE_CORPUS, SOURCE_TEACHER

    runs = []
    for path in sorted((RESULTS / "mixed").rglob("*.json")):
        record = json.loads(path.read_text())
        training = record.get("training") or {}
        if record.get("kind") != "distill" or record.get("teacher") != SOURCE_TEACHER \
                or training.get("corpus") != SOURCE_CORPUS or record.get("method") == "st-mse":
            continue  # st-mse: sentence-transformers' recipe, trained by a job of its own (the library baseline)
        runs.append({**record, "_file": str(path.relative_to(RESULTS))})
    return runs


def _candidates(runs: list[dict], labels: str) -> list[dict]:
    """``{model, file, stage, method, stsb_dev, sts7, record}`` of every model a recipe of ``labels`` could be."""
    found = []
    for record in runs:
        stages = record["training"].get("stages") or []
        labelled = [stage["method"] for stage in stages if stage.get("method") in LABELLED_STAGES]
        base = {"model": record["model"], "file": record["_file"], "record": record}
        if labels == "nli" and labelled and set(labelled) == {NLI_STAGE}:
            found.append({**base, "stage": None, "method": record["method"], "stsb_dev": record["scores"]["stsb_dev"],
                          "sts7": record["scores"]["avg"]})
        elif labels == "none" and not labelled:
            found.append({**base, "stage": None, "method": record["method"], "stsb_dev": record["scores"]["stsb_dev"],
                          "sts7": record["scores"]["avg"]})
        elif labels == "none" and stages and stages[0].get("method") not in LABELLED_STAGES \
                and (stages[0].get("scores") or {}).get("stsb_dev") is not None:
            found.append({**base, "stage": 1, "method": FIRST_STAGE_METHOD.get(record["method"], stages[0]["method"]),
                          "stsb_dev": stages[0]["scores"]["stsb_dev"], "sts7": stages[0]["scores"]["avg"]})
    return found


# The static student's recipe rows are checked by a case of their own, skipped while their run is not committed.
TRANSFORMER_RECIPES = [recipe for recipe in RECIPES if recipe.size != STATIC_SIZE]
STATIC_RECIPES = [recipe for recipe in RECIPES if recipe.size == STATIC_SIZE]


def _size_of(model: str) -> str:
    """The recipe size a committed run's student is: any static name ("static", "static:256") is the static size."""
    from raydistill.models.static_embedding import static_width

    return STATIC_SIZE if static_width(model) is not None else model


def _check_best_committed(recipe, runs: list[dict]) -> None:
    candidates = [c for c in _candidates(runs, recipe.labels) if _size_of(c["model"]) == recipe.size]
    assert candidates, f"no committed {recipe.labels} run of {recipe.size}"
    best = max(candidates, key=lambda c: c["stsb_dev"])
    assert (recipe.source, recipe.stage, recipe.method) == (best["file"], best["stage"], best["method"]), (
        f"{recipe.size} ({recipe.labels}): the best committed run by STS-B dev is {best['file']} stage "
        f"{best['stage']} ({best['method']}, dev {best['stsb_dev']}), the table says {recipe.source}")
    assert (recipe.stsb_dev, recipe.sts7) == (best["stsb_dev"], best["sts7"])


def test_the_recipe_table_is_the_best_committed_run_by_stsb_dev():
    runs = _committed_runs()
    assert runs, "no committed runs on the mixed corpus"
    assert {(r.size, r.labels) for r in RECIPES} == {(size, labels) for size in SIZES for labels in LABELS} | {
        (STATIC_SIZE, labels) for labels in STATIC_LABELS}
    for recipe in TRANSFORMER_RECIPES:
        _check_best_committed(recipe, runs)


def _committed_static_runs() -> list[dict]:
    """The static student's runs from the recipes' teacher (results/static/): on the part of ``mixed`` whose teacher
    vectors were cached, not the whole corpus (raydistill/ship/recipe.py says so beside the row)."""
    from raydistill.ship.recipe import SOURCE_TEACHER

    return [{**record, "_file": str(path.relative_to(RESULTS))}
            for path in sorted((RESULTS / "static").glob("*.json"))
            for record in [json.loads(path.read_text())]
            if record.get("kind") == "distill" and record.get("teacher") == SOURCE_TEACHER
            and _size_of(record.get("model", "")) == STATIC_SIZE]


@pytest.mark.parametrize("recipe", STATIC_RECIPES, ids=[f"{r.size}-{r.labels}" for r in STATIC_RECIPES])
def test_the_static_recipe_is_its_committed_run(recipe):
    """The static rows, as the others: the best committed run by STS-B dev, and its settings but the corpus."""
    _check_best_committed(recipe, _committed_static_runs())
    _check_source_settings(recipe, same_corpus=False)


def _set_pairs(command: str) -> dict[str, str]:
    words = shlex.split(command)
    return dict(words[i + 1].split("=", 1) for i, word in enumerate(words) if word == "--set")


def test_each_recipe_reproduces_its_source_run_settings():
    """Each recipe's config (its shipped config + overrides, the source's student and teacher) trains what the source
    run recorded; only the precision and the resources (where it ran) may differ."""
    for recipe in TRANSFORMER_RECIPES:
        _check_source_settings(recipe)


def _check_source_settings(recipe, same_corpus: bool = True) -> None:
    from raydistill.config.job import JobConfig
    from raydistill.methods import stage_config, validate_method
    from raydistill.ship.recipe import SOURCE_TEACHER
    from raydistill.shipped import shipped_config

    record = json.loads((RESULTS / recipe.source).read_text())
    training = record["training"]
    command = record["command"]
    script = re.search(r"jobs/(\w+)\.py", command).group(1)
    config = re.search(r"--config (\S+)", command)
    assert recipe.config == (config.group(1) if config else script), command
    # train.lr is compared below like the epochs; the evaluation interval (which checkpoints dev chooses among) is
    # carried by the recipe as the run set it; checkpoint_every only says when a resumable state is written.
    sets = _set_pairs(command)
    allowed = {"student", "train.precision", "train.epochs", "train.lr", "train.eval_every", "train.checkpoint_every",
               "resources.learner.threads", "extra.stage2.train.epochs", "extra.stage2.data.max_sentences"}
    assert not set(sets) - allowed - (set() if same_corpus else {"data.corpus"}), (
        f"{recipe.source} sets what the recipe check does not compare: {command}")
    if "train.eval_every" in sets:
        assert f"train.eval_every={sets['train.eval_every']}" in recipe.overrides, recipe.overrides

    cfg = validate_method(JobConfig.from_yaml(shipped_config(recipe.config), list(recipe.overrides) + [
        f"student={recipe.size}", f"teacher={SOURCE_TEACHER}"]))
    stage = training["stages"][0] if recipe.stage == 1 else training
    assert cfg.method == recipe.method
    if same_corpus:
        assert (cfg.data.corpus, cfg.data.max_sentences) == (training["corpus"], None)
    assert dict(cfg.data.views) == training["views"]
    assert list(cfg.data.teacher_views) == training["teacher_views"]
    assert cfg.data.max_length == training["max_length"]
    assert cfg.student_projection_init == training["student_projection_init"]
    assert cfg.seed == training["seed"]
    assert {key: cfg.loss.get(key) for key in training["loss"]} == training["loss"]
    assert (cfg.train.epochs, cfg.train.lr, cfg.train.batch_size) == (stage["epochs"], stage["lr"],
                                                                     stage["batch_size"]), recipe.source
    stages = training["stages"][1:] if recipe.stage is None else []
    for index, recorded in enumerate(stages, start=1):
        later = stage_config(cfg, index)
        assert later.method == recorded["method"]
        assert (later.train.epochs, later.train.lr, later.train.batch_size) == (
            recorded["epochs"], recorded["lr"], recorded["batch_size"]), recipe.source
        if later.data.max_sentences is not None:
            assert recorded["rows"] == later.data.max_sentences, recipe.source
    assert recipe.stage is not None or len(stages) == len(training["stages"]) - 1


# ----------------------------------------------------------------------------------------------------------------
# The whole command


TINY = ["--max-sentences", "160", "--budget", "epochs", "--set", "train.batch_size=16", "--set", "loss.queue_size=32",
        "--set", "train.eval_every=10", "--set", "train.checkpoint_every=5", "--set", "data.max_length=32",
        "--set", "data.teacher_max_length=32", "--set", "tracking.enabled=false", "--set", "runtime.log_every=10",
        "--set", "resources.learner.threads=1", "--set", "resources.teacher.threads=1"]


@pytest.mark.ray
def test_distill_trains_packages_and_a_second_run_resumes(teacher_dir, ray_session, real_sentences, one_thread,
                                                         tmp_path, capsys):
    import numpy as np
    from sentence_transformers import SentenceTransformer

    from raydistill.data import load_dataset
    from raydistill.models import BiEncoder
    from raydistill.runtime.engine import checkpoint as ckpt

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(real_sentences[:1000]) + "\n")
    out = tmp_path / "model"
    argv = ["distill", "--teacher", str(teacher_dir), "--student", "layers:1,hidden:24", "--corpus", str(corpus),
            "--out", str(out), *TINY, "--set", f"cache_dir={tmp_path / 'embeddings'}"]

    with distill_fixtures.quick_train_polls():
        code, printed, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "[distill] recipe of the bert-tiny size, label-free: ckd" in printed
    assert "[distill] student cut: layers [1] of the teacher's 2, 24 wide" in printed
    assert re.search(r"\[ckd\] teacher cache: 0 hits, 160 misses", printed), printed
    assert "[ckd] step 30/30" in printed  # 160 sentences / 16 a batch x the recipe's 3 epochs
    assert "[ckd] evaluating" in printed and "package:" in printed
    run_dir = out.with_name("model.training")
    record = json.loads((run_dir / "result.json").read_text())
    assert record["training"]["steps"] == 30 and record["method"] == "ckd"
    report_table = json.loads((run_dir / "distill.json").read_text())["table"]
    assert report_table in printed

    sentences = [pair.sentence1 for pair in load_dataset("stsb_train")][:16]
    packaged = SentenceTransformer(str(out), device="cpu").encode(sentences, normalize_embeddings=True)
    trained = BiEncoder.from_pretrained(record["model_dir"]).encode(sentences, normalize=True)
    np.testing.assert_allclose(packaged, trained, atol=1e-5)

    latest = ckpt.latest_checkpoint(run_dir)
    package_manifest = (out / "raydistill_package.json").stat().st_mtime_ns
    code, printed, err = run_cli(argv, capsys)
    assert code == 0, err
    assert "is complete" in printed and report_table in printed
    assert "[ckd] step" not in printed and "teacher cache" not in printed and "student cut" not in printed
    assert ckpt.latest_checkpoint(run_dir) == latest
    assert (out / "raydistill_package.json").stat().st_mtime_ns == package_manifest

    # Another packaging request (own evaluation pairs) packages again from the finished training, not training it.
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("".join(f"{p.sentence1}\t{p.sentence2}\t{p.score}\n" for p in load_dataset("stsb_train")[:40]))
    code, printed, err = run_cli([*argv, "--eval-pairs", str(pairs)], capsys)
    assert code == 0, err
    assert "training already complete" in printed and "not trained again" in printed
    assert "[ckd] step" not in printed and "teacher cache" not in printed
    assert ckpt.latest_checkpoint(run_dir) == latest
    assert json.loads((out / "raydistill_package.json").read_text())["eval_pairs"]["pairs"] == 40
