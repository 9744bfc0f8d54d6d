"""Sentences per second through ``raydistill serve`` (Ray Serve, batching on, concurrent HTTP clients) against plain
``BiEncoder.encode`` in one process: same model, same sentences, same threads.

The model (``--model``, default the minilm-l3 preset) is saved with ``BiEncoder.save`` into a temporary directory,
as ``raydistill distill`` leaves a student, and served from there by ``raydistill.ship.serve.deploy`` on a local Ray
of ``--threads`` CPUs: one replica holding them all, ``--threads`` torch threads, batches of up to
``--max-batch-size`` sentences after a ``--batch-wait-ms`` wait. ``--clients`` threads of this process send the
``--sentences`` real STS sentences (bench/common.py ``sts_sentences``) as JSON requests of ``--per-request``
sentences each (one value per load; 1 is a client that sends one sentence at a time, where batching has the most to
do), each thread over its own keep-alive connection, as many requests in flight as clients. Plain: the same
sentences through ``encode(batch_size=--max-batch-size)`` in this process, at the same thread count. ``--rounds``
rounds alternate plain and every load, so that load from other processes falls on all of them; medians over rounds.

Both sides run on the same cores: the served rate pays for the HTTP proxy, JSON both ways and the client threads out
of the CPUs the plain encode has to itself, which is what a single machine serving its own clients sees. Recorded:
sentences/s of each, ``serve_vs_plain`` (served ÷ plain, per load), the mean batch the replica ran (from its GET
stats), request latency p50/p95, and the cosine of served against plain vectors (min).

    python bench/serve_speed.py --write results/bench-serve_speed.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import socket
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from common import load_average, median, set_threads, sts_sentences, write_record  # first: environment before torch

import numpy as np


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


class Clients:
    """``clients`` threads, each with its own keep-alive HTTP connection to ``host:port``."""

    def __init__(self, host: str, port: int, clients: int):
        self.host, self.port = host, port
        self.pool = ThreadPoolExecutor(clients, thread_name_prefix="client")
        self.local = threading.local()

    def _post(self, texts: list[str]) -> tuple[list, float]:
        connection = getattr(self.local, "connection", None)
        if connection is None:
            connection = self.local.connection = http.client.HTTPConnection(self.host, self.port, timeout=600)
        started = time.perf_counter()
        connection.request("POST", "/", body=json.dumps({"sentences": texts}),
                           headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {body[:300]!r}")
        return json.loads(body)["embeddings"], time.perf_counter() - started

    def encode(self, sentences: list[str], per_request: int) -> tuple[np.ndarray, list[float]]:
        chunks = [sentences[i:i + per_request] for i in range(0, len(sentences), per_request)]
        answers = list(self.pool.map(self._post, chunks))
        return np.array([row for rows, _ in answers for row in rows], dtype=np.float32), [s for _, s in answers]

    def stats(self) -> dict:
        connection = http.client.HTTPConnection(self.host, self.port, timeout=60)
        connection.request("GET", "/")
        return json.loads(connection.getresponse().read())


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="minilm-l3")
    parser.add_argument("--sentences", type=int, default=512)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--per-request", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--batch-wait-ms", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", help="result file (results/bench-serve_speed.json)")
    args = parser.parse_args(argv)
    set_threads(args.threads)
    load_before = load_average()
    started = time.perf_counter()

    import ray
    from ray import serve

    from raydistill.models import BiEncoder, resolve_model
    from raydistill.runtime.engine.cluster import prepare_worker_environment, start_local_ray
    from raydistill.ship.serve import Runtime, ServeOptions, deploy

    work = Path(tempfile.mkdtemp(prefix="rd-serve-bench-", dir="/tmp"))  # short: Ray's socket paths
    try:
        model = BiEncoder.from_pretrained(resolve_model(args.model))
        model.save(work / args.model)
        sentences = sts_sentences(args.sentences)
        prepare_worker_environment()
        start_local_ray(num_cpus=args.threads, log_to_driver=False, _temp_dir=str(work / "ray"),
                        object_store_memory=256 * 2**20)
        options = ServeOptions(port=_free_port(), cpus_per_replica=args.threads, threads=args.threads,
                               max_batch_size=args.max_batch_size, batch_wait_ms=args.batch_wait_ms)
        serve_started = time.perf_counter()
        deploy(work / args.model, Runtime(None, "bench"), options)
        serve_start_s = time.perf_counter() - serve_started
        clients = Clients(options.host, options.port, args.clients)
        try:
            plain_vectors = model.encode(sentences, batch_size=args.max_batch_size)  # warm-up, and the reference
            for per_request in args.per_request:
                clients.encode(sentences, per_request)
            plain_s: list[float] = []
            served_s = {n: [] for n in args.per_request}
            latency = {n: [] for n in args.per_request}
            batches = {n: [0, 0] for n in args.per_request}  # sentences, batches
            agreement = {}
            for _ in range(args.rounds):
                t = time.perf_counter()
                model.encode(sentences, batch_size=args.max_batch_size)
                plain_s.append(time.perf_counter() - t)
                for per_request in args.per_request:
                    before = clients.stats()
                    t = time.perf_counter()
                    vectors, seconds = clients.encode(sentences, per_request)
                    served_s[per_request].append(time.perf_counter() - t)
                    after = clients.stats()
                    latency[per_request] += seconds
                    batches[per_request][0] += after["sentences"] - before["sentences"]
                    batches[per_request][1] += after["batches"] - before["batches"]
                    agreement[per_request] = min(agreement.get(per_request, 1.0),
                                                 float(cosines(vectors, plain_vectors).min()))
        finally:
            clients.pool.shutdown()
            serve.shutdown()
            ray.shutdown()
    finally:
        shutil.rmtree(work, ignore_errors=True)

    plain_rate = args.sentences / median(plain_s)
    loads = []
    for per_request in args.per_request:
        rate = args.sentences / median(served_s[per_request])
        ordered = sorted(latency[per_request])
        loads.append({
            "clients": args.clients, "sentences_per_request": per_request,
            "sentences_per_s": round(rate, 1), "serve_vs_plain": round(rate / plain_rate, 3),
            "mean_batch": round(batches[per_request][0] / max(batches[per_request][1], 1), 2),
            "latency_ms_p50": round(1000 * ordered[len(ordered) // 2], 1),
            "latency_ms_p95": round(1000 * ordered[int(0.95 * (len(ordered) - 1))], 1),
            "wall_s_per_round": [round(s, 2) for s in served_s[per_request]],
            "min_cosine_vs_plain": round(agreement[per_request], 6),
        })
        print(f"{per_request} sentence(s)/request x {args.clients} clients: {rate:.1f} sentences/s through Serve "
              f"vs {plain_rate:.1f} plain ({rate / plain_rate:.2f}x), mean batch {loads[-1]['mean_batch']}")
    record = {
        "bench": "serve_speed",
        "model": args.model,
        "max_length": model.max_length,
        "plain_sentences_per_s": round(plain_rate, 1),
        "plain_wall_s_per_round": [round(s, 2) for s in plain_s],
        "loads": loads,
        "sentences": args.sentences, "source": "sts_sentences (STS12-16 + STS-B test, seed 0)",
        "threads": args.threads, "replicas": 1, "cpus_per_replica": args.threads,
        "max_batch_size": args.max_batch_size, "batch_wait_ms": args.batch_wait_ms, "rounds": args.rounds,
        "plain_batch_size": args.max_batch_size,
        "serve_start_s": round(serve_start_s, 1),
        "note": "clients, HTTP proxy and replica share the machine's cores with the plain encode's threads",
        "wall_s": round(time.perf_counter() - started, 1),
    }
    return write_record(args.write, record, threads=args.threads, load_before=load_before)


if __name__ == "__main__":
    main()
