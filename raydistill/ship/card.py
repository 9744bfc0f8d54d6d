"""The model card (README.md) of a packaged student, written the way sentence-transformers writes its cards.

Contract: ``render_card(manifest, out_name)`` returns the card's text from the manifest ``package_student`` writes
(raydistill.ship.package): YAML front matter with sentence-transformers' fields (``library_name:
sentence-transformers``, ``pipeline_tag: sentence-similarity``, ``tags``, ``base_model``, ``datasets``, ``metrics``
and a ``model-index`` with each evaluation set's Spearman of cosine similarity, as a fraction, as sentence-transformers
records it), then the body: how the student was made (recipe, the exact command, teacher, corpus and its size), the
7-STS (per set and average) and STS-B dev of teacher and student, each export's quality and encode speed on the
machine that packaged it (the CPU and its instruction set named, the pipeline that was timed said, an export no faster
than the student per CPU second labelled "not faster here"), how to load each, and the BibTeX of the papers behind
the recipe's methods. A manifest written before the pipeline, instruction set and ``faster_here`` were recorded
renders without them (an export's label then follows from its recorded rates).
Scores in the body are Spearman x 100, as everywhere else in raydistill. Pure: it reads nothing but its arguments.

A static student's card (the manifest's ``model.static``) names it a static embedding model: its width, its
vocabulary (the teacher's tokenizer), its teacher, that sentence-transformers (StaticEmbedding) and
``model2vec.StaticModel`` load it, and why it has no ONNX export (the manifest's ``onnx.reason``); its ``base_model``
is the teacher's, whose token outputs its table was built from."""

from __future__ import annotations

from typing import Any

import yaml

from raydistill.config.job import model_short_name
from raydistill.evaluation import DEV_SET, STS7

__all__ = ["render_card", "CITATIONS", "METHOD_PAPERS", "base_model_id"]

SET_NAMES = {"sts12": "STS12", "sts13": "STS13", "sts14": "STS14", "sts15": "STS15", "sts16": "STS16",
             "stsb": "STS-B", "sickr": "SICK-R", DEV_SET: "STS-B dev", "eval_pairs": "own pairs"}

CITATIONS: dict[str, str] = {
    "Sentence-BERT": """@inproceedings{reimers-2019-sentence-bert,
    title = "Sentence-BERT: Sentence Embeddings using Siamese BERT-Networks",
    author = "Reimers, Nils and Gurevych, Iryna",
    booktitle = "Proceedings of the 2019 Conference on Empirical Methods in Natural Language Processing",
    month = "11",
    year = "2019",
    publisher = "Association for Computational Linguistics",
    url = "https://arxiv.org/abs/1908.10084",
}""",
    "ConGen": """@inproceedings{limkonchotiwat-etal-2022-congen,
    title = "{ConGen}: Unsupervised Control and Generalization Distillation For Sentence Representation",
    author = "Limkonchotiwat, Peerat and Ponwitayarat, Wuttikorn and Lowphansirikul, Lalita and
              Udomcharoenchaikit, Can and Chuangsuwanich, Ekapol and Nutanong, Sarana",
    booktitle = "Findings of the Association for Computational Linguistics: EMNLP 2022",
    year = "2022",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2022.findings-emnlp.483",
}""",
    "SCT": """@article{limkonchotiwat-etal-2023-sct,
    title = "An Efficient Self-Supervised Cross-View Training For Sentence Embedding",
    author = "Limkonchotiwat, Peerat and Ponwitayarat, Wuttikorn and Lowphansirikul, Lalita and
              Udomcharoenchaikit, Can and Chuangsuwanich, Ekapol and Nutanong, Sarana",
    journal = "Transactions of the Association for Computational Linguistics",
    volume = "11",
    year = "2023",
}""",
    "DistilCSE (CKD)": """@article{gao-etal-2021-distilcse,
    title = "{DistilCSE}: Effective Knowledge Distillation For Contrastive Sentence Embeddings",
    author = "Gao, Chaochen and Wu, Xing and Wang, Peng and Wang, Jue and Zang, Liangjun and Wang, Zhongyuan and
              Hu, Songlin",
    journal = "arXiv preprint arXiv:2112.05638",
    year = "2021",
    url = "https://arxiv.org/abs/2112.05638",
}""",
    "SimCSE": """@inproceedings{gao-etal-2021-simcse,
    title = "{SimCSE}: Simple Contrastive Learning of Sentence Embeddings",
    author = "Gao, Tianyu and Yao, Xingcheng and Chen, Danqi",
    booktitle = "Proceedings of the 2021 Conference on Empirical Methods in Natural Language Processing",
    year = "2021",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2021.emnlp-main.552",
}""",
    "DvBERT": """@inproceedings{cheng-2021-dvbert,
    title = "Dual-View Distilled {BERT} for Sentence Embedding",
    author = "Cheng, Xingyi",
    booktitle = "Proceedings of the 44th International ACM SIGIR Conference on Research and Development in
                 Information Retrieval",
    year = "2021",
    url = "https://arxiv.org/abs/2104.08675",
}""",
    "Trans-Encoder": """@inproceedings{liu-etal-2022-trans-encoder,
    title = "Trans-Encoder: Unsupervised sentence-pair modelling through self- and mutual-distillations",
    author = "Liu, Fangyu and Jiao, Yunlong and Massiah, Jordan and Yilmaz, Emine and Havrylov, Serhii",
    booktitle = "International Conference on Learning Representations",
    year = "2022",
    url = "https://arxiv.org/abs/2109.13059",
}""",
}
# raydistill method (a job or stage name) -> the papers it comes from. DistilCSE's second stage is supervised SimCSE.
METHOD_PAPERS: dict[str, tuple[str, ...]] = {
    "congen": ("ConGen",),
    "sct": ("SCT",),
    "sct-distill": ("SCT",),
    "distilcse": ("DistilCSE (CKD)", "SimCSE"),
    "ckd": ("DistilCSE (CKD)",),
    "simcse": ("SimCSE",),
    "dvbert": ("DvBERT",),
    "mutual_tenc": ("Trans-Encoder",),
}


def base_model_id(name: str | None) -> str | None:
    """The Hugging Face id of the model a preset's weights are: a derived preset's source (minilm-l3 is 3 layers
    of all-MiniLM-L6-v2), else the preset's own; None for a directory, an unknown name or a static name."""
    if not name:
        return None
    from raydistill.models.registry import find_preset

    preset = find_preset(str(name))
    if preset is None or preset.family == "static":  # a static table comes from the job's teacher, not a preset
        return None
    if preset.source.startswith("derive:"):
        return base_model_id(preset.source.split(":", 1)[1])
    return preset.hub_ids[0] if preset.hub_ids else None


def _score(scores: dict[str, float], key: str) -> str:
    return "–" if scores.get(key) is None else f"{scores[key]:.2f}"


def _front_matter(student: dict[str, Any], corpus: dict[str, Any], methods: list[str], title: str,
                  base_model: str | None, static: bool = False) -> dict[str, Any]:
    kind = ["static-embeddings", "model2vec"] if static else ["onnx"]  # a static package has no ONNX files
    tags = ["sentence-transformers", "sentence-similarity", "feature-extraction", "dense", "knowledge-distillation",
            "raydistill", *kind, *[f"method:{m}" for m in methods]]
    if corpus.get("sentences"):
        tags.append(f"dataset_size:{int(corpus['sentences'])}")
    results = [{
        "task": {"type": "semantic-similarity", "name": "Semantic Similarity"},
        "dataset": {"name": SET_NAMES.get(key, key), "type": key},
        "metrics": [{"type": "spearman_cosine", "value": round(student["scores"][key] / 100, 4),
                     "name": "Spearman Cosine"}],
    } for key in (*STS7, DEV_SET) if key in student["scores"]]
    return {"language": ["en"], "library_name": "sentence-transformers", "pipeline_tag": "sentence-similarity",
            "tags": tags, **({"base_model": base_model} if base_model else {}),
            **({"datasets": [str(d) for d in corpus["datasets"]]} if corpus.get("datasets") else {}),
            "metrics": ["spearman_cosine"], "model-index": [{"name": title, "results": results}]}


def _faster_here(row: dict[str, Any], student: dict[str, Any]) -> bool:
    """The export's recorded ``faster_here``, else ``package.mark_speed``'s rule on its recorded rates."""
    recorded = row.get("faster_here")
    if isinstance(recorded, bool):
        return recorded
    mine, reference = row.get("sentences_per_cpu_s"), student.get("sentences_per_cpu_s")
    if not mine or not reference:
        return True  # nothing recorded to compare: no label rather than a guessed one
    return round(mine, 1) > round(reference, 1)


def _stage_line(stage: Any) -> str:
    if isinstance(stage, dict):
        head = stage.get("method") or stage.get("name") or "stage"
        rest = ", ".join(f"{k} {v}" for k, v in stage.items() if k not in ("method", "name"))
        return f"- **{head}**" + (f": {rest}" if rest else "")
    return f"- {stage}"


def render_card(manifest: dict[str, Any], out_name: str = "DIR") -> str:
    """The README.md text for the package described by ``manifest`` (see the module docstring)."""
    rows = manifest["rows"]
    teacher = next(row for row in rows if row["kind"] == "teacher")
    student = next(row for row in rows if row["kind"] == "student")
    exports = [row for row in rows if row["kind"] == "export"]
    corpus, recipe, model, speed = (manifest.get("corpus") or {}, manifest.get("recipe") or {},
                                    manifest.get("model") or {}, manifest["speed"])
    methods = [str(m) for m in recipe.get("methods") or []]
    start = recipe.get("student")
    base_model = base_model_id(start) or base_model_id(manifest["teacher"])
    start = model_short_name(start) if start else start
    teacher_name = model_short_name(manifest["teacher"])
    title = recipe.get("name") or (f"{start} distilled from {teacher_name}" if start
                                   else f"Student distilled from {teacher_name}")
    margin = manifest["quality_margin"]
    has_pairs = any("eval_pairs" in row["scores"] for row in rows)
    pairs_info = manifest.get("eval_pairs") or {}
    static = model.get("static")

    front = yaml.safe_dump(_front_matter(student, corpus, methods, title, base_model, static=bool(static)),
                           sort_keys=False, allow_unicode=True)
    out: list[str] = ["---", front.rstrip(), "---", "", f"# {title}", ""]
    corpus_text = f"{corpus.get('name', 'a corpus')}" + (f" ({int(corpus['sentences']):,} sentences)"
                                                         if corpus.get("sentences") else "")
    # A static table's rows come from the teacher's outputs, not from base_model's weights: its intro says so.
    weights = (f" (weights from [{base_model}](https://huggingface.co/{base_model}))" if base_model and not static
               else "")
    out += [
        f"This is a [sentence-transformers](https://www.SBERT.net) model distilled with raydistill from the teacher "
        f"`{teacher_name}` into {'`' + str(start) + '`' if start else 'a smaller student'}{weights} on "
        f"{corpus_text}, by {', '.join(methods) or 'distillation'}. It maps sentences to a "
        f"{model.get('dim', '?')}-dimensional dense vector space; compare them by cosine similarity.", "",
        *([f"It is a **static embedding model**: a table of {static['vocabulary']:,} token vectors "
           f"{static['width']} wide, built from the teacher `{teacher_name}`'s outputs for each token of its "
           "vocabulary (Model2Vec's distillation) and then trained by raydistill; a sentence's vector is the mean of "
           "its tokens' rows, with no attention and no layers (the tables below compare its quality and speed with "
           "the teacher's). It loads with sentence-transformers (its `StaticEmbedding` module) and with Model2Vec "
           "(`model2vec.StaticModel`).", ""] if static else []),
        "## Model Details", "",
        ("- **Model Type:** Static embedding model (token table, mean of token vectors; Model2Vec layout)" if static
         else "- **Model Type:** Sentence Transformer (distilled student)"),
        f"- **Teacher:** `{teacher_name}`",
        *([f"- **Width:** {static['width']}",
           f"- **Vocabulary:** {static['vocabulary']:,} tokens (the teacher's {static['tokenizer']} tokenizer)"]
          if static else []),
        f"- **Start model:** `{start}`" if start else "- **Start model:** see the recipe below",
        f"- **Maximum Sequence Length:** {model.get('max_length', '?')} tokens",
        f"- **Output Dimensionality:** {model.get('dim', '?')} dimensions",
        "- **Similarity Function:** Cosine Similarity",
        f"- **Pooling:** {model.get('pooling', '?')}",
        f"- **Parameters:** {model.get('parameters', 0) / 1e6:.1f} M" if model.get("parameters") else "",
        f"- **Training corpus:** {corpus_text}",
        "- **Language:** en", "",
    ]
    if model.get("architecture"):
        out += ["### Full Model Architecture", "", "```", model["architecture"], "```", ""]

    out += ["## How it was made", ""]
    if recipe.get("description"):
        out += [str(recipe["description"]), ""]
    if recipe.get("stages"):
        out += [*(_stage_line(stage) for stage in recipe["stages"]), ""]
    out += [f"- **Teacher:** `{teacher_name}`",
            f"- **Corpus:** {corpus_text}" + (f": {corpus['description']}" if corpus.get("description") else "")]
    if recipe.get("seed") is not None:
        out.append(f"- **Seed:** {recipe['seed']}")
    out += ["", "The exact command:", "", "```bash", manifest["command"], "```", "",
            f"Made with raydistill at `{manifest.get('git_sha', '?')}` on {manifest.get('date', '?')}; every number "
            f"below is in `raydistill_package.json`.", ""]

    out += ["## Evaluation", "",
            "Spearman's rank correlation x 100 between cosine similarity and the gold score over each whole set "
            "(SentEval's \"all\" setting, the protocol of the SimCSE / ConGen / DistilCSE tables); 7-STS is the mean "
            "of STS12-16, STS-B test and SICK-R test; STS-B dev, the development set, is not part of it. "
            f"Sets read from: {manifest.get('evaluation_data', 'the bundled copies')}.", ""]
    keys = [*STS7, "avg", DEV_SET, *(["eval_pairs"] if has_pairs else [])]
    headers = [SET_NAMES.get(k, "7-STS avg" if k == "avg" else k) for k in keys]
    out += ["| model | " + " | ".join(headers) + " |", "|---|" + "---:|" * len(keys)]
    for row in (teacher, student):
        out.append(f"| {row['name']} | " + " | ".join(_score(row["scores"], k) for k in keys) + " |")
    out.append("")
    if teacher["scores_source"] != "evaluated":
        out += [f"The teacher's STS scores are those of {teacher['scores_source']}, taken on the same sets; "
                "it was timed and, where given, scored on the own pairs here.", ""]
    if has_pairs:
        # Labels that are all 0 or 1 are scored with ROC AUC (raydistill.evaluation.pair_metric), graded ones as
        # the STS sets are.
        metric = ("ROC AUC x 100 of cosine similarity (every label is 0 or 1)" if pairs_info.get("metric") == "roc_auc"
                  else "Spearman x 100, as the STS sets")
        out += [f"Own pairs: {pairs_info.get('pairs', '?')} labelled pairs from `{pairs_info.get('path', '?')}`, "
                f"scored with {metric}.", ""]

    instructions = (speed.get("instruction_set") or {}).get("summary")
    out += ["## Exports and speed", "",
            f"Encode speed on the machine that packaged the model: **{speed['cpu']}**"
            + (f" ({instructions})" if instructions else "") + f", {speed['sentences']} STS "
            f"sentences, batch {speed['batch_size']}, median of {speed['rounds']} round(s) taken in one run, every "
            f"model in turn (load average {speed['load_before']} when it began; other processes shared the cores, "
            "so compare the rates with each other, not with another machine's). sentences/CPU-s counts this "
            "process's CPU time, the steadier figure on shared cores."
            + (f" Timed through {speed['pipeline']}." if speed.get("pipeline") else ""), ""]
    quality_keys = ["avg", DEV_SET, *(["eval_pairs"] if has_pairs else [])]
    out += ["| model | file | size (MB) | " + " | ".join("7-STS" if k == "avg" else SET_NAMES[k] for k in quality_keys)
            + " | sentences/s | sentences/CPU-s | vs student (CPU-s) |",
            "|---|---|---:|" + "---:|" * len(quality_keys) + "---:|---:|---:|"]
    slower = []
    for row in (teacher, student, *exports):
        size = f"{row['bytes'] / 1e6:.1f}" if row.get("bytes") else "–"
        cells = [_score(row["scores"], k) + (" \\*" if k in row["marked"] else "") for k in quality_keys]
        ratio = (f"{row['sentences_per_cpu_s'] / student['sentences_per_cpu_s']:.2f}x"
                 if student.get("sentences_per_cpu_s") else "–")
        if row["kind"] == "export" and not _faster_here(row, student):
            ratio += " not faster here"
            slower.append(row["name"])
        out.append(f"| {row['name']} | `{row['file']}` | {size} | " + " | ".join(cells)
                   + f" | {row['sentences_per_s']:,.1f} | {row['sentences_per_cpu_s']:,.1f} | {ratio} |")
    marked = [row["name"] for row in exports if row["marked"]]
    out += ["", f"\\* more than {margin:g} points (Spearman x 100) below the student on that column, the margin "
            "this package was built with. "
            + (f"Marked: {', '.join(marked)}." if marked else "No export is below it."), ""]
    if exports:
        out += ["\"not faster here\": no more sentences per CPU second than the torch student on this CPU; "
                "`raydistill serve` does not choose such an export unless `--export` names it. "
                + (f"Not faster here: {', '.join(slower)}." if slower else "Every export is faster here.")
                + " The speed of an export, int8 above all, depends on the CPU's instruction set (VNNI, AVX-512) "
                "and on the pipeline that runs it: measure on the machine that will serve it.", ""]
    onnx = manifest.get("onnx") or {}
    if onnx.get("exported") is False and onnx.get("reason"):
        out += [f"No ONNX export: {onnx['reason']}.", ""]
    for row in [row for row in manifest.get("files", []) if row.get("quantization")]:
        q = row["quantization"]
        out += [f"`{row['file']}`: dynamic int8 for {q['target']} CPUs ({q['chosen_from']}): {q['weights']} weights "
                f"per channel, activations quantised per call (`{q['method']}`). Run it on a CPU of that kind; the "
                "fp32 `onnx/model.onnx` runs anywhere.", ""]

    out += ["## Usage", "", "```bash", "pip install -U sentence-transformers", "```", "",
            "The torch model:", "", "```python", student["load"],
            'embeddings = model.encode(["A man is playing a guitar.", "Someone plays an instrument."])',
            "print(model.similarity(embeddings, embeddings))", "```", ""]
    if static:
        out += ["The same directory with Model2Vec (`pip install model2vec`):", "", "```python",
                "from model2vec import StaticModel", f'model = StaticModel.from_pretrained("{out_name}")',
                'embeddings = model.encode(["A man is playing a guitar.", "Someone plays an instrument."])', "```",
                "", "Model2Vec leaves unknown tokens out of the mean, sentence-transformers keeps them: a text with "
                "unknown tokens gets slightly different vectors from the two.", ""]
    for row in exports:
        out += [f"{row['name']} through sentence-transformers' ONNX backend "
                "(`pip install sentence-transformers[onnx]`; its optimum-onnx needs transformers < 4.58):", "",
                "```python", row["load"], "```", ""]
    if exports and speed.get("pipeline"):
        out += ["The speeds above were not taken through that backend: it tokenizes, pools and moves tensors its own "
                "way, so an export's gain over the torch model can differ there.", ""]
    if exports:
        out += ["Beside transformers 5, where that backend does not install, raydistill runs the same files with "
                "ONNX Runtime behind the model's own tokenizer and pooling:", "",
                "```python", "from raydistill.models.export import load_onnx",
                f'model = load_onnx("{out_name}", "{exports[-1]["file"]}")',
                'embeddings = model.encode(["A man is playing a guitar."], normalize=True)', "```", ""]

    out += ["## Citation", "", "### BibTeX", ""]
    papers = ["Sentence-BERT"]
    for method in methods:
        papers += [paper for paper in METHOD_PAPERS.get(str(method).lower(), ()) if paper not in papers]
    for paper in papers:
        out += [f"#### {paper}", "", "```bibtex", CITATIONS[paper], "```", ""]
    return "\n".join(line for line in out if line is not None) + "\n"
