"""raydistill.ship.package on a tiny random student and teacher: the directory sentence-transformers loads with the
same vectors, ONNX files that run with them, a model card with sentence-transformers' front matter and the command,
the terminal table with its margin mark, the user's pairs file checked line by line, and a rerun that replaces the
directory whole. Scored on the Ray tests' 128-pair evaluation sample (conftest), so it stays fast."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from raydistill.data import DATA_ENV, DataError, load_dataset
from raydistill.models import BiEncoder
from raydistill.models.export import load_onnx
from raydistill.ship.card import render_card
from raydistill.ship.package import (
    MANIFEST_FILE,
    NOT_FASTER,
    TEACHER_BASELINES,
    PackageError,
    check_out_dir,
    cpu_instruction_set,
    format_table,
    mark_rows,
    mark_speed,
    package_student,
    read_eval_pairs,
    teacher_baseline,
)

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ["A man is playing a guitar on the street.", "Two dogs run through the snow.", "Hi",
             "The children are playing football in a park near the river, " * 6]
COMMAND = "raydistill distill --teacher tiny-teacher --student tiny-student --out DIR"
CORPUS = {"name": "tiny test corpus", "sentences": 1234, "datasets": ["sentence-transformers/stsb"]}
RECIPE = {"methods": ["congen", "distilcse"], "student": "minilm-l3", "stages": ["congen on the corpus"], "seed": 7}


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


@pytest.fixture(scope="module")
def small_data(request):
    from conftest import _small_eval_data

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(DATA_ENV, str(_small_eval_data(request.config)))
        yield


@pytest.fixture(scope="module")
def student_dir(tiny_bert, tmp_path_factory):
    """Tiny BERT + mean pooling + Dense(32 -> 48, tanh): a trained student's sentence-transformers directory."""
    directory = tmp_path_factory.mktemp("student")
    BiEncoder.from_pretrained(tiny_bert, projection_dim=48).save(directory)
    return directory


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory, small_data):
    path = tmp_path_factory.mktemp("pairs") / "mine.tsv"
    rows = [f"{p.sentence1}\t{p.sentence2}\t{p.score}" for p in load_dataset("stsb_dev")[:60]]
    path.write_text("sentence1\tsentence2\tscore\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def packaged(student_dir, tiny_teacher, pairs_file, tmp_path_factory, small_data):
    """One package, written over what stands for an earlier package of the same DIR (its manifest and a file)."""
    out = tmp_path_factory.mktemp("ship") / "DIR"
    out.mkdir()
    (out / MANIFEST_FILE).write_text("{}")
    (out / "left-from-before.txt").write_text("x")
    lines: list[str] = []
    report = package_student(student_dir, out, teacher=str(tiny_teacher), corpus_info=CORPUS, recipe_info=RECIPE,
                             command=COMMAND, eval_pairs=pairs_file, progress=lines.append,
                             teacher_scores_dir=tmp_path_factory.mktemp("teacher-scores"),
                             speed_sentences_count=24, speed_rounds=1)
    return out, report, lines


def test_directory_loads_in_sentence_transformers_with_the_students_vectors(packaged, student_dir):
    from sentence_transformers import SentenceTransformer

    out, _, _ = packaged
    reference = BiEncoder.from_pretrained(student_dir).encode(SENTENCES)
    loaded = SentenceTransformer(str(out), device="cpu").encode(SENTENCES)
    assert loaded.shape == reference.shape == (len(SENTENCES), 48)
    np.testing.assert_allclose(loaded, reference, rtol=0, atol=1e-5)


def test_onnx_files_run_with_matching_vectors(packaged, student_dir):
    out, report, _ = packaged
    reference = BiEncoder.from_pretrained(student_dir).encode(SENTENCES)
    exports = [row for row in report.rows if row.kind == "export"]
    assert [row.file for row in exports][0] == "onnx/model.onnx" and len(exports) == 2
    for row in exports:
        vectors = load_onnx(out, row.file).encode(SENTENCES)
        bound = 0.999 if row.file == "onnx/model.onnx" else 0.99
        assert cosines(reference, vectors).min() > bound, row.file


def test_rerun_replaces_the_directory_whole_and_a_failed_one_leaves_it(packaged, student_dir):
    from raydistill.models import ModelNotAvailableError

    out, report, lines = packaged
    assert not (out / "left-from-before.txt").exists()
    manifest = json.loads((out / MANIFEST_FILE).read_text())
    assert manifest["eval_pairs"]["pairs"] == 60 and manifest["command"] == COMMAND
    # progress: a line before and after each of the four models' evaluation
    assert sum("evaluating" in line for line in lines) == 4 and lines[-1].startswith(f"package: {out} written")

    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    with pytest.raises(ModelNotAvailableError):
        package_student(student_dir, out, teacher="no-such-teacher", corpus_info=CORPUS, recipe_info=RECIPE,
                        command=COMMAND, progress=None)
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in out.parent.iterdir()] == ["DIR"]  # no .DIR.tmp-<pid> / .DIR.old-<pid> left


def test_card_has_sentence_transformers_front_matter_scores_and_the_command(packaged):
    out, report, _ = packaged
    text = report.card_path.read_text()
    assert report.card_path == out / "README.md" and text.startswith("---\n")
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["library_name"] == "sentence-transformers" and front["pipeline_tag"] == "sentence-similarity"
    assert {"sentence-transformers", "sentence-similarity", "dataset_size:1234"} <= set(front["tags"])
    assert front["base_model"] == "sentence-transformers/all-MiniLM-L6-v2"  # minilm-l3 is derived from it
    assert front["datasets"] == CORPUS["datasets"] and front["metrics"] == ["spearman_cosine"]
    student = next(row for row in report.rows if row.kind == "student")
    results = {r["dataset"]["type"]: r["metrics"][0]["value"] for r in front["model-index"][0]["results"]}
    assert set(results) == {"sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr", "stsb_dev"}
    assert results["stsb_dev"] == round(student.scores["stsb_dev"] / 100, 4)
    body = text.split("---\n", 2)[2]
    assert f"```bash\n{COMMAND}\n```" in body and report.manifest["speed"]["cpu"] in body
    for paper in ("reimers-2019-sentence-bert", "limkonchotiwat-etal-2022-congen", "gao-etal-2021-distilcse",
                  "gao-etal-2021-simcse"):
        assert paper in body
    for row in report.rows:
        assert row.name in body
    assert 'backend="onnx"' in body and "load_onnx" in body


def test_a_teacher_given_as_a_path_is_named_by_its_directory(packaged, tiny_teacher):
    """The fixture's teacher is an absolute path, as a user's local model is: the table, the card's title and its
    model-index name show the directory's name; the manifest keeps the path it was loaded from."""
    out, report, _ = packaged
    name, path = Path(tiny_teacher).name, str(tiny_teacher)
    teacher = next(row for row in report.rows if row.kind == "teacher")
    assert (teacher.name, teacher.file) == (f"teacher {name}", name)
    assert path not in report.table
    text = report.card_path.read_text()
    front = yaml.safe_load(text.split("---\n")[1])
    assert front["model-index"][0]["name"] == f"minilm-l3 distilled from {name}"
    assert f"- **Teacher:** `{name}`" in text
    assert report.manifest["teacher"] == path


def test_table_has_every_row_and_marks_an_export_below_the_margin(packaged):
    _, report, _ = packaged
    names = ["teacher", "student (torch fp32)", "onnx fp32", "onnx int8"]
    lines = report.table.splitlines()
    assert all(any(line.startswith(name) for line in lines) for name in names)
    assert "own pairs" in lines[0] and "sent/s" in lines[0]
    assert "more than 0.5 points below the student" in report.table
    assert all(len(row.scores) >= 10 for row in report.rows)  # 7 sets, avg, STS-B dev, own pairs

    # An export made to fall short on purpose: 0.51 below on 7-STS is marked, exactly 0.5 on STS-B dev is not.
    rows = [dataclasses.replace(row, scores=dict(row.scores), marked=[]) for row in report.rows]
    student = next(row for row in rows if row.kind == "student")
    bad = rows[-1]
    bad.scores.update(avg=round(student.scores["avg"] - 0.51, 2), stsb_dev=round(student.scores["stsb_dev"] - 0.5, 2),
                      eval_pairs=student.scores["eval_pairs"])
    mark_rows(rows, 0.5)
    assert bad.marked == ["avg"] and all(not row.marked for row in rows[:-1])
    table = format_table(rows, margin=0.5, speed=report.manifest["speed"])
    bad_line = next(line for line in table.splitlines() if line.startswith(bad.name))
    assert f"{bad.scores['avg']:.2f} *" in bad_line and bad_line.count("*") == 1


def test_speed_says_what_it_timed_and_labels_an_export_no_faster_than_the_student(packaged):
    """The footer and the card name the pipeline (raydistill's runner, load_onnx), the sentences, batch and threads,
    and the CPU's instruction set; an export with no more sentences per CPU second than the student is "not faster
    here" in the table, the card and the manifest, and one just above it is not."""
    out, report, _ = packaged
    speed = report.manifest["speed"]
    assert "load_onnx" in speed["pipeline"] and speed["instruction_set"] == cpu_instruction_set()
    footer = report.table.split("\n-")[-1]
    assert "load_onnx" in footer and speed["instruction_set"]["summary"] in footer
    assert f"{speed['sentences']} STS sentences, batch {speed['batch_size']}" in footer
    card = report.card_path.read_text()
    assert "load_onnx" in card and speed["instruction_set"]["summary"] in card
    manifest_rows = json.loads((out / MANIFEST_FILE).read_text())["rows"]
    assert [row["faster_here"] is None for row in manifest_rows] == [row.kind != "export" for row in report.rows]

    rows = [dataclasses.replace(row) for row in report.rows]
    student = next(row for row in rows if row.kind == "student")
    fp32, int8 = (row for row in rows if row.kind == "export")
    fp32.sentences_per_cpu_s = student.sentences_per_cpu_s  # the same work: not faster
    int8.sentences_per_cpu_s = round(student.sentences_per_cpu_s + 0.1, 1)
    mark_speed(rows)
    assert (fp32.faster_here, int8.faster_here, student.faster_here) == (False, True, None)
    lines = format_table(rows, margin=0.5, speed=speed).splitlines()
    assert "vs student" in lines[0]
    assert next(line for line in lines if line.startswith(fp32.name)).endswith(f"1.00x {NOT_FASTER}")
    assert NOT_FASTER not in next(line for line in lines if line.startswith(int8.name))

    manifest = {**report.manifest, "rows": [row.to_dict() for row in rows]}
    card_lines = render_card(manifest).splitlines()
    assert next(line for line in card_lines if line.startswith(f"| {fp32.name} |")).endswith(f"{NOT_FASTER} |")
    assert NOT_FASTER not in next(line for line in card_lines if line.startswith(f"| {int8.name} |"))
    assert f"Not faster here: {fp32.name}." in "\n".join(card_lines)


def test_a_card_from_a_manifest_without_the_speed_verdicts_still_renders(packaged):
    """A manifest written before the pipeline, the instruction set and ``faster_here`` were recorded: the card
    renders, and an export's label follows from its recorded rates."""
    _, report, _ = packaged
    old = json.loads(json.dumps(report.manifest))
    for key in ("pipeline", "instruction_set", "runner"):
        del old["speed"][key]
    student = next(row for row in old["rows"] if row["kind"] == "student")
    for row in old["rows"]:
        del row["faster_here"]
        if row["kind"] == "export":
            row["sentences_per_cpu_s"] = student["sentences_per_cpu_s"] / 2
    card = render_card(old)
    assert "## Exports and speed" in card and "load_onnx(" in card
    assert sum(line.endswith(f"{NOT_FASTER} |") for line in card.splitlines()) == 2


@pytest.mark.parametrize(("flags", "machine", "summary", "preset"), [
    ({"avx", "avx2", "fma"}, "x86_64", "AVX2, no AVX-512, no VNNI, no bf16", "avx2"),
    ({"avx2", "avx_vnni"}, "x86_64", "AVX2, no AVX-512, VNNI, no bf16", "avx2"),
    ({"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}, "x86_64", "AVX2, AVX-512, VNNI, bf16",
     "avx512_vnni"),
    ({"asimd", "asimddp"}, "aarch64", "NEON, dot product, no i8mm, no bf16", "arm64"),
    (set(), "x86_64", "x86_64: instruction set unknown (no CPU flags readable)", "avx2"),
])
def test_the_instruction_set_is_named_from_the_cpu_flags(flags, machine, summary, preset):
    facts = cpu_instruction_set(flags, machine)
    assert (facts["summary"], facts["int8_preset"]) == (summary, preset)


def test_a_teachers_scores_are_kept_by_its_files_and_reused_set_by_set(tiny_teacher, tmp_path, monkeypatch,
                                                                        small_data):
    """A later package with the same teacher files (here reached through another path) encodes only the sets it has
    not scored: the user's new pairs, not the STS sets again."""
    import shutil

    import raydistill.ship.package as package

    teacher = BiEncoder.from_pretrained(tiny_teacher)
    sts = package.evaluation_pairs(None)
    scored: list[list[str]] = []
    score_model = package.score_model
    monkeypatch.setattr(package, "score_model",
                        lambda model, sets, batch: scored.append(sorted(sets)) or score_model(model, sets, batch))
    first, reused = package.score_teacher(str(tiny_teacher), teacher, sts, 32, cache_dir=tmp_path / "scores")
    assert reused == [] and scored == [sorted(sts)] and "avg" in first

    elsewhere = shutil.copytree(tiny_teacher, tmp_path / "elsewhere")
    mine = list(sts["stsb_dev"][:40])
    again, reused = package.score_teacher(str(elsewhere), teacher, {**sts, "eval_pairs": mine}, 32,
                                          cache_dir=tmp_path / "scores")
    assert scored[1:] == [["eval_pairs"]] and reused == list(sts)
    assert {name: again[name] for name in first} == first


def test_the_jobs_own_scores_of_the_student_are_not_computed_again(student_dir, tiny_teacher, tmp_path, monkeypatch,
                                                                     small_data):
    """The command hands over the training job's 7-STS and STS-B dev of the same directory: the student is then
    timed and exported but not evaluated a second time; incomplete scores, or other evaluation data, are scored."""
    import raydistill.ship.package as package

    from raydistill.evaluation import STS7

    job = {**{name: 50.0 + i for i, name in enumerate(STS7)}, "avg": 53.0, "stsb_dev": 61.5}
    monkeypatch.setattr(package, "_bundled_evaluation", lambda: True)
    assert package._job_scores(({**job, "stsb_dev": None}, "r.json")) == (None, "")
    lines: list[str] = []
    report = package_student(student_dir, tmp_path / "DIR", teacher=str(tiny_teacher), corpus_info=CORPUS,
                             recipe_info=RECIPE, command=COMMAND, student_scores=(job, "run/result.json"),
                             progress=lines.append, teacher_scores_dir=tmp_path / "teacher-scores",
                             speed_sentences_count=8, speed_rounds=1)
    student = next(row for row in report.rows if row.kind == "student")
    assert student.scores == job and "run/result.json (the training job's evaluation)" in student.scores_source
    assert sum("evaluating" in line for line in lines) == 3  # teacher and the two exports, not the student
    monkeypatch.setattr(package, "_bundled_evaluation", lambda: False)
    assert package._job_scores((job, "r.json")) == (None, "")


def test_eval_pairs_errors_name_file_line_and_field(tmp_path):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("A man plays.\tSomeone plays.\t4.5\nA dog.\tA cat.\tabc\n")
    with pytest.raises(DataError, match=r"pairs\.tsv:2: field 'score': expected a number, got a string \"abc\""):
        read_eval_pairs(tsv)
    tsv.write_text("sentence1\tsentence2\tscore\nA man plays.\tSomeone plays.\t4.5\nA dog.\t\t1\n")
    with pytest.raises(DataError, match=r"pairs\.tsv:3: field 'sentence2': is empty"):
        read_eval_pairs(tsv)
    tsv.write_text("A man plays.\tSomeone plays.\t4.5\textra\n")
    with pytest.raises(DataError, match=r"pairs\.tsv:1: has 4 tab-separated fields, expected 3"):
        read_eval_pairs(tsv)
    jsonl = tmp_path / "pairs.jsonl"
    jsonl.write_text('{"sentence1": "a b", "sentence2": "c d", "score": 1}\n{"sentence1": "a", "score": 2}\n')
    with pytest.raises(DataError, match=r"pairs\.jsonl:2: field 'sentence2': missing"):
        read_eval_pairs(jsonl)
    csv = tmp_path / "pairs.csv"
    csv.write_text('sentence1,sentence2,score\n"A man, playing.",Someone plays.,4\nA dog.,A cat.,\n')
    with pytest.raises(DataError, match=r"pairs\.csv:3: field 'score'"):
        read_eval_pairs(csv)
    csv.write_text('sentence1,sentence2,score\n"A man, playing.",Someone plays.,4\nA dog.,A cat.,4\n')
    with pytest.raises(DataError, match=r"pairs\.csv: field 'score': 2 pair\(s\) with 1 distinct"):
        read_eval_pairs(csv)
    # Good files of each format read the same pairs (quotes inside a TSV cell are text, not CSV quoting).
    tsv.write_text('"Quoted" man.\tSomeone.\t4.5\nA dog.\tA cat.\t1\n')
    jsonl.write_text('{"sentence1": "\\"Quoted\\" man.", "sentence2": "Someone.", "score": 4.5}\n'
                     '{"sentence1": "A dog.", "sentence2": "A cat.", "score": 1}\n')
    assert read_eval_pairs(tsv) == read_eval_pairs(jsonl)
    assert [p.score for p in read_eval_pairs(tsv)] == [4.5, 1.0]


def test_bad_inputs_fail_before_anything_is_written(tmp_path, student_dir):
    bad = tmp_path / "bad.tsv"
    bad.write_text("a\tb\tnot-a-number\n")
    out = tmp_path / "DIR"
    with pytest.raises(DataError, match="bad.tsv:1"):
        package_student(student_dir, out, teacher="x", corpus_info={}, recipe_info={}, command="c", eval_pairs=bad,
                        progress=None)
    assert not out.exists()
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    with pytest.raises(PackageError, match="not an earlier raydistill package"):
        check_out_dir(tmp_path / "mine")
    assert check_out_dir(tmp_path / "new") == tmp_path / "new"


def test_embedded_teacher_scores_are_the_committed_baselines(monkeypatch, request):
    files = sorted((ROOT / "results").glob("baseline-*.json"))
    assert {f.stem.removeprefix("baseline-") for f in files} == set(TEACHER_BASELINES)
    for path in files:
        record = json.loads(path.read_text())
        assert TEACHER_BASELINES[record["model"]] == record["scores"], path.name
    monkeypatch.delenv(DATA_ENV, raising=False)
    assert teacher_baseline("mpnet-base") == TEACHER_BASELINES["mpnet-base"]
    assert teacher_baseline("/some/teacher/dir") is None
    from conftest import _small_eval_data

    monkeypatch.setenv(DATA_ENV, str(_small_eval_data(request.config)))  # other data: scores would not apply
    assert teacher_baseline("mpnet-base") is None
