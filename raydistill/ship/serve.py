"""``raydistill serve DIR``: a distilled student behind HTTP on Ray Serve, requests from many clients batched into one
forward pass.

Contract. ``DIR`` is a sentence-transformers directory of a bi-encoder (what ``BiEncoder.save`` and ``raydistill
distill`` write), optionally with ONNX exports under ``DIR/onnx/`` (``raydistill.models.export``). What runs:

    --export FILE    that file (relative to DIR, e.g. onnx/model.onnx) in ONNX Runtime; ``--export torch``: the torch
                     model
    otherwise        the fastest of the torch model and the exports present, by the speeds ``raydistill distill``
                     measured and recorded in ``DIR/SPEEDS_FILE`` (`recorded_speeds`), leaving out an export that
                     lost quality there (its ``marked`` columns) and one that was "not faster here" (its
                     ``faster_here`` false: no more sentences per CPU second than the torch model on the machine that
                     packaged it; from the rates where the file predates that field); without that file, the torch
                     model. Never a guess: the startup line says what was chosen and why, and what was skipped.
                     A static student's package has no exports (its manifest's ``onnx.reason`` says why, and
                     ``--export FILE`` repeats it): the torch model.

HTTP API (JSON; every path of the app, so ``/`` and ``/v1/embeddings`` alike):

    POST {"sentences": ["...", ...], "normalize": false}
      -> {"embeddings": [[...], ...], "model": NAME, "dim": D, "normalized": false}
    POST {"input": "..." | ["...", ...], "encoding_format": "float" | "base64"}          (OpenAI's embeddings API)
      -> {"object": "list", "data": [{"object": "embedding", "index": i, "embedding": [...] | "<base64 float32>"}],
          "model": NAME, "usage": {"prompt_tokens": T, "total_tokens": T}}
    GET  -> {"model", "dim", "runtime", "normalized", "max_batch_size", "batch_wait_ms", "threads"} and what this
            replica has run: "requests", "sentences", "batches", "batch_sizes" ({size: count})

``normalize`` defaults to the directory's own choice (true when its module chain ends in Normalize, as
sentence-transformers would return); OpenAI-style requests always get the same default. A bad request (not JSON,
neither or both of ``sentences``/``input``, a non-string item, more than MAX_SENTENCES items, a field the native form
does not know, a ``dimensions`` other than the model's) gets 400 and ``{"error": {"message": ..., "type":
"invalid_request_error"}}``; the OpenAI form ignores ``model`` and ``user``, as one served model needs neither.

Batching and replicas: docs/cluster.md ("Serving a student"). Each sentence is one ``@serve.batch`` call; the forward
pass runs on a worker thread of the replica, so requests keep arriving (and filling the next batch) while it runs.
``run(args)`` serves until Ctrl-C or SIGTERM, then removes the app (and the Ray, when it started it)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import logging
import os
import signal
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raydistill.argtypes import non_negative_float as _non_negative_float, positive_float as _positive_float
from raydistill.argtypes import positive_int as _positive_int

if TYPE_CHECKING:
    import numpy as np

__all__ = ["APP_NAME", "MAX_SENTENCES", "SPEEDS_FILE", "TORCH", "Runtime", "ServeError", "ServeOptions",
           "StudentEncoder", "add_arguments", "build_app", "choose_runtime", "deploy", "load_encoder",
           "recorded_speeds", "run"]

APP_NAME = "raydistill"
TORCH = "torch"  # the --export value (and speeds-file ``file``) that names the torch model
# The packaging manifest (raydistill.ship.package.MANIFEST_FILE, named here so that the command line's parser does not
# import the packaging code): quality and speed of the student and each export, all timed in one run.
SPEEDS_FILE = "raydistill_package.json"
MAX_SENTENCES = 2048  # per request, OpenAI's limit for its embeddings API
# Workers that load the model on a cluster must not reach for the hub, and tokenizers' own thread pool would compete
# with the replica's torch threads; idle OpenMP workers sleep (raydistill/__init__.py).
REPLICA_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
               "OMP_WAIT_POLICY": "PASSIVE"}


class ServeError(ValueError):
    """Something the user can fix in the command line or the model directory: one message, no traceback."""


@dataclass(frozen=True)
class Runtime:
    """What the replicas run: ``file`` (relative to the model directory) in ONNX Runtime, or None for the torch model;
    ``reason`` says why, for the startup line."""

    file: str | None
    reason: str

    @property
    def label(self) -> str:
        return "torch model" if self.file is None else self.file


def recorded_speeds(model_dir: str | Path) -> list[dict[str, Any]] | None:
    """The servable rows of ``DIR/SPEEDS_FILE`` (the packaging manifest, teacher left out), each ``{"file": str |
    None (the torch model), "sentences_per_s", "sentences_per_cpu_s" (None when not recorded), "marked": [quality
    columns where it lost more than the package's margin], "faster_here": bool | None (an export's recorded verdict;
    None for the torch model and in a file that predates it)}``; None when the file is missing, ServeError when it is
    in another format."""
    path = Path(model_dir) / SPEEDS_FILE
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ServeError(f"{path}: not readable JSON ({err}); pass --export to choose without it") from None
    rows = data.get("rows") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ServeError(f"{path}: no \"rows\" list of measured models; pass --export to choose without it")
    speeds = []
    for index, row in enumerate(rows):
        if not isinstance(row, dict) or row.get("kind") not in ("teacher", "student", "export"):
            raise ServeError(f"{path}: rows[{index}] needs a \"kind\" of teacher, student or export")
        if row["kind"] == "teacher":
            continue
        rates = [row.get(key) for key in ("sentences_per_s", "sentences_per_cpu_s")]
        if not _positive(rates[0]) or (rates[1] is not None and not _positive(rates[1])):
            raise ServeError(f"{path}: rows[{index}] needs a positive \"sentences_per_s\", got {rates[0]!r}")
        if row["kind"] == "export" and not isinstance(row.get("file"), str):
            raise ServeError(f"{path}: rows[{index}] is an export without a \"file\"")
        speeds.append({"file": row["file"] if row["kind"] == "export" else None, "sentences_per_s": float(rates[0]),
                       "sentences_per_cpu_s": None if rates[1] is None else float(rates[1]),
                       "marked": list(row.get("marked") or []),
                       "faster_here": row.get("faster_here") if isinstance(row.get("faster_here"), bool) else None})
    return speeds


def _no_exports_reason(directory: Path) -> str | None:
    """Why the package at ``directory`` has no exports, as its manifest records it (a static student's), else None."""
    try:
        onnx = json.loads((directory / SPEEDS_FILE).read_text(encoding="utf-8")).get("onnx") or {}
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, AttributeError):
        return None
    return str(onnx["reason"]) if isinstance(onnx, dict) and onnx.get("exported") is False and onnx.get("reason") \
        else None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def choose_runtime(model_dir: str | Path, export: str | None = None) -> Runtime:
    """The torch model or one ONNX file of ``model_dir``: ``export`` when given, else as the module doc says;
    ServeError naming the directory or file when there is nothing to serve."""
    directory = Path(model_dir)
    if not directory.is_dir():
        raise ServeError(f"{directory}: no such directory (give the directory `raydistill distill` wrote)")
    if not (directory / "modules.json").is_file() and not (directory / "config.json").is_file():
        raise ServeError(f"{directory}: neither modules.json nor config.json; not a sentence-transformers or "
                         "Hugging Face model directory")
    if export is not None:
        if export == TORCH:
            return Runtime(None, "--export torch")
        if not (directory / export).is_file():
            present = sorted(str(p.relative_to(directory)) for p in (directory / "onnx").glob("*.onnx"))
            why = _no_exports_reason(directory)
            raise ServeError(f"{directory / export}: no such file; exports in {directory}: "
                             f"{', '.join(present) or 'none'}{f' ({why})' if why else ''} (or --export {TORCH})")
        return Runtime(export, "--export")
    speeds = recorded_speeds(directory)
    if speeds is None:
        return Runtime(None, f"no {SPEEDS_FILE} with measured speeds in the directory; --export FILE picks an export")
    name = {id(row): TORCH if row["file"] is None else row["file"] for row in speeds}
    missing = [row for row in speeds if row["file"] is not None and not (directory / row["file"]).is_file()]
    lossy = [row for row in speeds if row["marked"] and row not in missing]
    present = [row for row in speeds if row not in missing and row not in lossy]
    # Per CPU second where every candidate has it: the rate that other processes on shared cores disturb least.
    key = "sentences_per_cpu_s" if all(row["sentences_per_cpu_s"] for row in present) else "sentences_per_s"
    unit = "sentences per CPU s" if key == "sentences_per_cpu_s" else "sentences/s"
    torch_row = next((row for row in speeds if row["file"] is None), None)
    slower = [row for row in present if row["file"] is not None and not _faster_here(row, torch_row, key)]
    candidates = [row for row in present if row not in slower]
    if not candidates:  # the student's own row is never marked; only a hand-edited file lacks it
        raise ServeError(f"{directory / SPEEDS_FILE}: no recorded model to serve in {directory}; pass --export")
    best = max(candidates, key=lambda row: row[key])
    others = ", ".join(f"{name[id(row)]} {row[key]:.0f}" for row in candidates if row is not best)
    notes = [f"{name[id(row)]} lost quality ({', '.join(row['marked'])})" for row in lossy]
    notes += [f"{name[id(row)]} not faster here ({row[key]:.1f} vs the {TORCH} model's {torch_row[key]:.1f} {unit})"
              if torch_row else f"{name[id(row)]} not faster here" for row in slower]
    notes += [f"{name[id(row)]} recorded but missing" for row in missing]
    reason = (f"fastest recorded in {SPEEDS_FILE}: {best[key]:.0f} {unit}" + (f" vs {others}" if others else "")
              + "".join(f"; skipped {note}" for note in notes))
    return Runtime(best["file"], reason)


def _faster_here(row: dict[str, Any], torch_row: dict[str, Any] | None, key: str) -> bool:
    """An export's recorded verdict (``package.mark_speed``), else the same rule on its recorded rates."""
    if row["faster_here"] is not None:
        return row["faster_here"]
    if torch_row is None:
        return True  # nothing to compare with: speed alone decides, as before the verdict was recorded
    return round(row[key], 1) > round(torch_row[key], 1)


def check_loads(model_dir: str | Path, runtime: Runtime) -> None:
    """Load ``runtime`` of ``model_dir`` here and encode one sentence, so that a broken directory or file is one
    message before any replica starts (a replica that fails to load shows only in its own log)."""
    try:
        load_encoder(model_dir, runtime.file, threads=1).encode(["a sentence"])
    except Exception as err:  # noqa: BLE001 - whatever the loaders raise, the user fixes the files
        raise ServeError(f"{Path(model_dir)}: cannot load the {runtime.label}: {type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0] if str(err).strip() else ''}") from None


def load_encoder(model_dir: str | Path, file: str | None, threads: int | None = None):
    """The BiEncoder of ``model_dir``, its transformer run from ``file`` by ONNX Runtime when one is given."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a "Loading weights" bar per load would sit between the server's lines
    if file is None:
        from raydistill.models import BiEncoder

        return BiEncoder.from_pretrained(Path(model_dir))
    from raydistill.models.export import load_onnx

    return load_onnx(model_dir, file, threads=threads)


class BadRequest(Exception):
    """A request the client must fix; answered 400 with this message."""


def _texts(value: Any, field: str, allow_string: bool) -> list[str]:
    if isinstance(value, str) and allow_string:
        value = [value]
    if not isinstance(value, list):
        raise BadRequest(f"{field!r} must be a list of strings" + (" or one string" if allow_string else ""))
    if not value:
        raise BadRequest(f"{field!r} is empty: send at least one sentence")
    if len(value) > MAX_SENTENCES:
        raise BadRequest(f"{field!r} has {len(value)} items; at most {MAX_SENTENCES} per request")
    for index, text in enumerate(value):
        if not isinstance(text, str):
            hint = " (token ids are not accepted: send the text)" if isinstance(text, (int, list)) else ""
            raise BadRequest(f"{field}[{index}] must be a string, got {type(text).__name__}{hint}")
    return value


def parse_request(body: bytes) -> dict[str, Any]:
    """The validated request: {"api": "native" | "openai", "texts", "normalize" (None: the model's), "base64"}."""
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise BadRequest(f"the body is not JSON ({err}); send {{\"sentences\": [\"...\"]}}") from None
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object, e.g. {\"sentences\": [\"...\"]}")
    if ("sentences" in data) == ("input" in data):
        raise BadRequest("give exactly one of \"sentences\" (a list of strings) or \"input\" (OpenAI style)")
    if "sentences" in data:
        unknown = sorted(set(data) - {"sentences", "normalize"})
        if unknown:
            raise BadRequest(f"unknown field(s) {', '.join(unknown)}; accepted: sentences, normalize")
        normalize = data.get("normalize")
        if normalize is not None and not isinstance(normalize, bool):
            raise BadRequest(f"\"normalize\" must be true or false, got {normalize!r}")
        return {"api": "native", "texts": _texts(data["sentences"], "sentences", False), "normalize": normalize,
                "base64": False}
    encoding = data.get("encoding_format", "float")
    if encoding not in ("float", "base64"):
        raise BadRequest(f"\"encoding_format\" must be \"float\" or \"base64\", got {encoding!r}")
    return {"api": "openai", "texts": _texts(data["input"], "input", True), "normalize": None,
            "base64": encoding == "base64", "dimensions": data.get("dimensions")}


def _json(content: Any, status: int = 200):
    from starlette.responses import JSONResponse  # Serve's HTTP layer; imported in the replica only

    return JSONResponse(content, status_code=status)


def _error(status: int, message: str):
    kind = "invalid_request_error" if status < 500 else "server_error"
    return _json({"error": {"message": message, "type": kind}}, status)


class StudentEncoder:
    """One replica: the encoder, a batch queue over single sentences, one thread for the forward passes.
    ``serve.batch`` is applied in ``__init__`` so that the options size it and this module imports no Ray Serve."""

    def __init__(self, model_dir: str, file: str | None, threads: int, max_batch_size: int, batch_wait_s: float):
        import torch
        from ray import serve

        torch.set_num_threads(threads)
        self.encoder = load_encoder(model_dir, file, threads)
        self.info = {"model": Path(model_dir).name, "dim": int(self.encoder.dim), "runtime": file or TORCH,
                     "normalized": bool(self.encoder.normalize_in_sentence_transformers),
                     "max_batch_size": max_batch_size, "batch_wait_ms": round(batch_wait_s * 1000, 3),
                     "threads": threads}
        self.embed = serve.batch(max_batch_size=max_batch_size, batch_wait_timeout_s=batch_wait_s)(self._embed_batch)
        # One thread: the forward passes run one after another (as serve.batch starts them), off the event loop.
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="encode")
        self.batch_sizes: Counter[int] = Counter()
        self.requests = 0

    async def _embed_batch(self, texts: list[str]) -> list[np.ndarray]:
        self.batch_sizes[len(texts)] += 1
        vectors = await asyncio.get_running_loop().run_in_executor(self.pool, self.encoder.encode, texts, len(texts))
        return list(vectors)

    def stats(self) -> dict[str, Any]:
        return {**self.info, "requests": self.requests, "sentences": sum(k * v for k, v in self.batch_sizes.items()),
                "batches": sum(self.batch_sizes.values()),
                "batch_sizes": {str(size): count for size, count in sorted(self.batch_sizes.items())}}

    async def __call__(self, request):
        import numpy as np

        if request.method == "GET":
            return _json(self.stats())
        if request.method != "POST":
            return _error(405, f"{request.method} is not served: POST a JSON body, or GET for the model's info")
        try:
            parsed = parse_request(await request.body())
            dimensions = parsed.get("dimensions")
            if dimensions is not None and dimensions != self.info["dim"]:
                raise BadRequest(f"\"dimensions\": this model returns {self.info['dim']}, not {dimensions!r}")
        except BadRequest as err:
            return _error(400, str(err))
        self.requests += 1
        texts = parsed["texts"]
        matrix = np.stack(await asyncio.gather(*(self.embed(text) for text in texts)))  # [N, D]
        normalized = self.info["normalized"] if parsed["normalize"] is None else parsed["normalize"]
        if normalized:
            matrix = matrix / np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        if parsed["api"] == "native":
            return _json({"embeddings": matrix.tolist(), "model": self.info["model"], "dim": self.info["dim"],
                          "normalized": normalized})
        vectors = ([base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in matrix]
                   if parsed["base64"] else matrix.tolist())
        tokens = int(self.encoder.tokenize(texts)["attention_mask"].sum())
        return _json({"object": "list", "model": self.info["model"],
                      "data": [{"object": "embedding", "index": i, "embedding": vector}
                               for i, vector in enumerate(vectors)],
                      "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


@dataclass(frozen=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 1
    cpus_per_replica: float = 1.0
    threads: int | None = None  # per replica; None: the replica's CPUs, at least 1
    max_batch_size: int = 32
    batch_wait_ms: float = 10.0

    @property
    def replica_threads(self) -> int:
        return self.threads or max(1, int(self.cpus_per_replica))

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"


def build_app(model_dir: str | Path, runtime: Runtime, options: ServeOptions):
    """The Serve application: ``options.replicas`` StudentEncoder replicas over ``runtime`` of ``model_dir``."""
    from ray import serve

    deployment = serve.deployment(StudentEncoder, name="student").options(
        num_replicas=options.replicas,
        # Requests a replica takes at once: more than one batch of single-sentence requests, so that a batch can
        # fill while the previous one runs (Serve warns below max_batch_size).
        max_ongoing_requests=max(2 * options.max_batch_size, 8),
        ray_actor_options={"num_cpus": options.cpus_per_replica, "runtime_env": {"env_vars": REPLICA_ENV}},
        # A replica that cannot load the model fails the same way again: give up soon and say why.
        max_constructor_retry_count=2,
    )
    return deployment.bind(str(Path(model_dir).resolve()), runtime.file, options.replica_threads,
                           options.max_batch_size, options.batch_wait_ms / 1000)


def deploy(model_dir: str | Path, runtime: Runtime, options: ServeOptions, *, quiet: bool = True) -> str:
    """Start Serve's HTTP proxy on ``options.host:port`` (a Serve already running keeps its own) and run the app on
    the Ray this process is connected to; returns once every replica is up. Returns the URL."""
    from ray import serve

    logging_config = {"log_level": "WARNING", "enable_access_log": False} if quiet else None
    if quiet:  # this process's own Serve lines ("Started Serve", "... is ready at"): the caller prints the URL
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
    serve.start(http_options={"host": options.host, "port": options.port}, logging_config=logging_config)
    serve.run(build_app(model_dir, runtime, options), name=APP_NAME, route_prefix="/", logging_config=logging_config)
    return options.url


def _check_cpus(options: ServeOptions, started_here: bool) -> None:
    import ray

    wanted = options.replicas * options.cpus_per_replica
    have = ray.cluster_resources().get("CPU", 0)
    if wanted > have:
        message = (f"{options.replicas} replica(s) x {options.cpus_per_replica:g} CPU = {wanted:g} CPUs, but the Ray "
                   f"cluster has {have:g}; lower --replicas or --cpus-per-replica")
        if started_here:
            raise ServeError(message)
        # A cluster with an autoscaler adds nodes for replicas it cannot place; say why the start may wait.
        print(f"raydistill serve: note: {message} (waiting for an autoscaler to add nodes)", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    """``raydistill serve DIR``: see the module doc. Returns the exit status (2 for a user error)."""
    import ray
    from ray import serve

    try:
        options = ServeOptions(**{option.name: getattr(args, option.name) for option in fields(ServeOptions)})
        runtime = choose_runtime(args.model_dir, args.export)
        check_loads(args.model_dir, runtime)
    except ServeError as err:
        print(f"raydistill serve: {err}", file=sys.stderr)
        return 2

    from raydistill.runtime.engine.cluster import prepare_worker_environment, start_local_ray

    verbose = bool(getattr(args, "verbose", False))  # the replicas' own output and Serve's INFO logs
    prepare_worker_environment()
    started_ray = not ray.is_initialized() and not os.environ.get("RAY_ADDRESS")
    if ray.is_initialized():
        where = "the Ray of this process"
    elif os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=verbose)
        where = f"the Ray cluster at {os.environ['RAY_ADDRESS']}"
    else:
        start_local_ray(log_to_driver=verbose)
        where = f"a local Ray ({ray.cluster_resources().get('CPU', 0):g} CPUs)"

    # Both raise KeyboardInterrupt. SIGINT too: a shell without job control starts background commands with SIGINT
    # ignored, and Python then never turns it into KeyboardInterrupt.
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        _check_cpus(options, started_ray)
        try:
            url = deploy(args.model_dir, runtime, options, quiet=not verbose)
        except RuntimeError as err:  # Serve gave up on the replicas; why is in their logs
            raise ServeError(f"the replicas did not start: {str(err).strip()} (raydistill -v serve ... shows their "
                             "output)") from None
        print(f"raydistill serve: {Path(args.model_dir)} as {runtime.label} ({runtime.reason}); "
              f"{options.replicas} replica(s) x {options.cpus_per_replica:g} CPU, {options.replica_threads} "
              f"thread(s) each; batches of up to {options.max_batch_size} sentences, {options.batch_wait_ms:g} ms "
              f"wait; on {where}", flush=True)
        print(f"serving on {url}  (POST {{\"sentences\": [...]}} or OpenAI {{\"input\": [...]}}; Ctrl-C stops)",
              flush=True)
        while True:
            time.sleep(3600)
    except ServeError as err:
        print(f"raydistill serve: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("raydistill serve: stopping", flush=True)
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            # Drains the replicas; a cluster's other Serve applications (and Serve itself) keep running. A Ray started
            # here goes with everything on it (serve.shutdown() first only adds Ray's complaint about the controller
            # it kills).
            serve.delete(APP_NAME)
        finally:
            if started_ray:
                ray.shutdown()


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The options of ``raydistill serve``; ``run`` reads them."""
    parser.add_argument("model_dir", metavar="DIR", help="the student's directory (what raydistill distill wrote)")
    parser.add_argument("--export", metavar="FILE",
                        help=f"serve this ONNX file of DIR (e.g. onnx/model.onnx), or '{TORCH}' for the torch model "
                             f"(default: the fastest in DIR/{SPEEDS_FILE}, else the torch model)")
    parser.add_argument("--host", default="127.0.0.1", help="address the HTTP proxy listens on (0.0.0.0: all)")
    parser.add_argument("--port", type=_positive_int, default=8000, help="HTTP port (default 8000)")
    parser.add_argument("--replicas", type=_positive_int, default=1, help="copies of the model (Ray actors)")
    parser.add_argument("--cpus-per-replica", type=_positive_float, default=1.0,
                        help="Ray CPUs each replica holds (default 1)")
    parser.add_argument("--threads", type=_positive_int, default=None,
                        help="torch / ONNX Runtime threads per replica (default: its CPUs, at least 1)")
    parser.add_argument("--max-batch-size", type=_positive_int, default=32,
                        help="sentences per forward pass, from one request or several (default 32)")
    parser.add_argument("--batch-wait-ms", type=_non_negative_float, default=10.0,
                        help="how long a batch waits for more sentences after its first (default 10)")
    return parser
