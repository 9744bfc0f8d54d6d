"""What more compute buys: learning curves of the published label-free students on the whole ``mixed`` corpus.

Contract: ``train`` runs (or resumes) `raydistill distill`'s label-free recipe for one student size, from
``mpnet-base``, on all of ``mixed``, for ``--epochs`` epochs (one run, its LR schedule spanning them all, no early
stop), keeping a checkpoint every quarter epoch. ``score`` evaluates every kept checkpoint's student on STS-B dev and
the 7 STS sets (scores kept in the work dir, so a checkpoint is scored once), prices each point in CPU-hours and
writes the curves (``--write``) and their plot (``--plot``). Runs live in ``--work`` (default
``~/.cache/raydistill/bench-curves``): the same ``train`` command resumes from the newest checkpoint, in this session
or a later one, and stopping it (Ctrl-C, SIGTERM, ``timeout``) loses at most the steps since the last checkpoint.

    python bench/curves.py train --size bert-tiny --epochs 10
    timeout -s TERM 40m python bench/curves.py train --size minilm-l3 --epochs 5     # a slice; run again to go on
    python bench/curves.py score --write results/bench-curves.json --plot docs/curves.png

CPU-hours: every ``train`` process records the CPU seconds it used (user + system, training in the driver process
as the recipe's ``num_learners: 0`` runs it) and the checkpoint steps it advanced, once a minute, in
``<work>/<size>/cpu.json``; a point at step s costs s x (CPU seconds / steps advanced, over every slice). The steps
a stopped slice trained past its last checkpoint are counted as cost but not as progress, so the price errs high.
The teacher pass over ``mixed`` is paid once by every size and is not in the curve (docs/benchmarks.md gives it).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

from common import comma_names, load_average, write_record  # before torch

TEACHER = "mpnet-base"
SIZES = ("minilm-l3", "bert-mini", "bert-tiny")
POINTS_PER_EPOCH = 4
SEED = 1000


def plan(size: str, epochs: int, work: Path):
    """distill's label-free plan for ``size`` on the whole ``mixed``, ``epochs`` long, a checkpoint every quarter."""
    import dataclasses

    from raydistill.ship.command import plan_distill

    made = plan_distill(teacher=TEACHER, student=size, corpus="mixed", out=str(work / size / "out"), seed=SEED,
                        budget="epochs", overrides=[f"train.epochs={epochs}"])
    steps_per_epoch = made.corpus_sentences // made.cfg.train.batch_size
    every = max(1, steps_per_epoch // POINTS_PER_EPOCH)
    # Evaluation and checkpoint cadence are runtime-only fields: the plan's config hash stays what it checked.
    cadence = made.cfg.with_overrides([f"train.checkpoint_every={every}", f"train.eval_every={every}",
                                       f"train.keep_last={epochs * POINTS_PER_EPOCH + 2}"])
    return dataclasses.replace(made, cfg=cadence), steps_per_epoch


class CpuLedger:
    """``<work>/<size>/cpu.json``: per ``train`` process, its CPU seconds and the checkpoint steps it advanced."""

    def __init__(self, path: Path, run_dir: Path):
        self.path, self.run_dir = path, run_dir
        self.slices = json.loads(path.read_text()) if path.is_file() else []
        self.mine = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "first_step": self.latest_step(),
                     "last_step": self.latest_step(), "cpu_s": 0.0}
        self.slices.append(self.mine)
        self._cpu0 = self._cpu()
        self._stop = threading.Event()

    @staticmethod
    def _cpu() -> float:
        from raydistill.cputime import cpu_seconds

        return cpu_seconds(children=True)

    def latest_step(self) -> int:
        from raydistill.runtime.engine.checkpoint import list_checkpoints

        found = list_checkpoints(self.run_dir) if self.run_dir.is_dir() else []
        return max((int(path.name.split("-")[-1]) for path in found), default=0)

    def write(self) -> None:
        self.mine.update(last_step=self.latest_step(), cpu_s=round(self._cpu() - self._cpu0, 1))
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(self.slices, indent=1) + "\n")

    def __enter__(self):
        def every_minute():
            while not self._stop.wait(60):
                self.write()

        self.write()
        threading.Thread(target=every_minute, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.write()

    @staticmethod
    def cpu_per_step(slices: list[dict]) -> float | None:
        steps = sum(max(0, s["last_step"] - s["first_step"]) for s in slices)
        return sum(s["cpu_s"] for s in slices) / steps if steps else None


def train(args) -> int:
    from raydistill.ship.command import train_student

    made, steps_per_epoch = plan(args.size, args.epochs, Path(args.work))
    print(f"[curves] {args.size}: {made.recipe.method}, {args.epochs} epochs of {steps_per_epoch:,} steps, "
          f"{made.cfg.train.precision}, run {made.run_dir}", flush=True)
    from raydistill.runtime.engine.learner_group import PreemptedError
    from raydistill.runtime.engine.stopping import JobStopped

    with CpuLedger(Path(args.work) / args.size / "cpu.json", made.run_dir):
        try:
            train_student(made)
        except (PreemptedError, JobStopped) as stop:  # SIGTERM / Ctrl-C: the checkpoint is written
            print(f"[curves] {args.size}: {stop}; the same command resumes", flush=True)
            return 3  # not 0: a script that trains the sizes in turn stops here instead of starting the next
    return 0


def score_checkpoint(made, path: Path) -> dict:
    """STS-B dev and the 7 STS sets of the student a checkpoint holds (verified against its manifest's sha256s; a
    checkpoint of another method or student is refused). The run's own stage config hashes the loss settings in use,
    defaults included, so the plan's hash is not the checkpoint's: method and student are compared instead."""
    from raydistill.evaluation import evaluate_sts
    from raydistill.methods import get_method
    from raydistill.runtime.engine.checkpoint import load_checkpoint

    cfg = made.cfg
    manifest, state = load_checkpoint(path)
    written_by = manifest["config"]
    if (written_by["method"], written_by["student"]) != (cfg.method, cfg.student):
        raise SystemExit(f"{path}: a checkpoint of {written_by['method']} / {written_by['student']}, not of this "
                         f"curve's {cfg.method} / {cfg.student}")
    student = get_method(cfg.method).build_student(cfg, teacher_dim=made.teacher_shape.hidden)
    student.load_state_dict(state["student"])
    scores = evaluate_sts(student.eval(), progress=False)
    return {"step": int(manifest["step"]), "stsb_dev": round(scores["stsb_dev"], 2), "sts7": round(scores["avg"], 2)}


def score(args) -> int:
    from raydistill.runtime.engine.checkpoint import list_checkpoints

    load_before = load_average()
    work = Path(args.work)
    curves = {}
    for size in args.sizes:
        if not (work / size).is_dir():
            continue
        epochs = json.loads((work / size / "epochs.json").read_text())["epochs"]
        made, steps_per_epoch = plan(size, epochs, work)
        kept_path = work / size / "scores.json"
        kept = {int(k): v for k, v in json.loads(kept_path.read_text()).items()} if kept_path.is_file() else {}
        for path in list_checkpoints(made.run_dir):
            step = int(path.name.split("-")[-1])
            if step not in kept:
                kept[step] = score_checkpoint(made, path)
                kept_path.write_text(json.dumps(kept, indent=1, sort_keys=True) + "\n")
                print(f"[curves] {size} step {step}: {kept[step]}", flush=True)
        cpu_ledger = json.loads((work / size / "cpu.json").read_text())
        per_step = CpuLedger.cpu_per_step(cpu_ledger)
        points = [{**kept[step], "epoch": round(step / steps_per_epoch, 2),
                   "cpu_hours": round(step * per_step / 3600, 3) if per_step else None} for step in sorted(kept)]
        curves[size] = {"method": made.recipe.method, "epochs_planned": epochs, "steps_per_epoch": steps_per_epoch,
                        "precision": made.cfg.train.precision, "batch_size": made.cfg.train.batch_size,
                        "lr": made.cfg.train.lr, "cpu_s_per_step": round(per_step, 3) if per_step else None,
                        "slices": len(cpu_ledger), "points": points,
                        "best_dev": max(points, key=lambda p: p["stsb_dev"]) if points else None}
    if args.plot:
        plot(curves, Path(args.plot))
    write_record(args.write, {"teacher": TEACHER, "corpus": "mixed (all of it)", "seed": SEED, "curves": curves},
                 threads=2, load_before=load_before)
    return 0


def plot(curves: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, (dev_ax, sts_ax) = plt.subplots(1, 2, figsize=(10, 4), dpi=110, sharex=True)
    for size, curve in curves.items():
        points = [p for p in curve["points"] if p["cpu_hours"] is not None]
        hours = [p["cpu_hours"] for p in points]
        dev_ax.plot(hours, [p["stsb_dev"] for p in points], marker=".", label=size)
        sts_ax.plot(hours, [p["sts7"] for p in points], marker=".", label=size)
    for axis, title in ((dev_ax, "STS-B dev (Spearman x 100)"), (sts_ax, "7-STS average (Spearman x 100)")):
        axis.set_xlabel("CPU-hours of training (2-core CPU, bf16)")
        axis.set_title(title)
        axis.grid(alpha=0.3)
    dev_ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", default=str(Path.home() / ".cache" / "raydistill" / "bench-curves"))
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("train", help="train (or resume) one size's curve run")
    run.add_argument("--size", choices=SIZES, required=True)
    run.add_argument("--epochs", type=int, required=True)
    scoring = commands.add_parser("score", help="score every kept checkpoint; write the curves and their plot")
    scoring.add_argument("--sizes", type=comma_names(SIZES), default=list(SIZES), help="comma-separated")
    scoring.add_argument("--write", help="result file (e.g. results/bench-curves.json)")
    scoring.add_argument("--plot", help="the plot (e.g. docs/curves.png)")
    args = parser.parse_args(argv)
    if args.command == "train":
        epochs_file = Path(args.work) / args.size / "epochs.json"
        epochs_file.parent.mkdir(parents=True, exist_ok=True)
        epochs_file.write_text(json.dumps({"epochs": args.epochs}) + "\n")
        return train(args)
    return score(args)


if __name__ == "__main__":
    sys.exit(main())
