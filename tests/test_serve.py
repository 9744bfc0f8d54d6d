"""``raydistill serve`` (raydistill.ship.serve): which runtime a model directory is served with, and the Ray Serve
deployment itself on loopback: concurrent clients get the vectors ``BiEncoder.encode`` gives, their sentences share
forward passes, and bad requests get a 400 with a message."""

from __future__ import annotations

import argparse
import base64
import json
import re
import socket
import threading
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from raydistill.ship.serve import SPEEDS_FILE, ServeError, ServeOptions, add_arguments, choose_runtime, deploy

CLIENTS = 16
PER_CLIENT = 2
# One batch holds exactly what the concurrent clients send, and every other request sends a multiple of it, so a
# batch fires the moment it is full and the long wait never delays a test; it only gives concurrent clients that a
# loaded machine spreads out up to a second to land in the same batch.
MAX_BATCH = CLIENTS * PER_CLIENT
WAIT_MS = 1000
MIN_COSINE = 0.9999

from tests.ray_fixtures import ray_session  # noqa: F401,E402 - the session-wide Ray fixture


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))


# ----------------------------------------------------------------------------------------------------------------
# Which runtime (no Ray)


def _model_dir(tmp_path, *exports: str):
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "modules.json").write_text("[]")
    for name in exports:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    return tmp_path


def _row(kind: str, file: str, per_s: float, per_cpu_s: float, marked: list[str] | None = None) -> dict:
    """A row of the packaging manifest, the fields serve reads (raydistill.ship.package.Row has more)."""
    return {"name": file, "kind": kind, "file": file, "sentences_per_s": per_s, "sentences_per_cpu_s": per_cpu_s,
            "marked": marked or [], "scores": {}}


def test_the_fastest_recorded_export_that_kept_quality_is_served(tmp_path):
    from raydistill.ship.package import MANIFEST_FILE

    assert SPEEDS_FILE == MANIFEST_FILE
    directory = _model_dir(tmp_path, "onnx/model.onnx", "onnx/model_quint8_avx2.onnx")
    rows = [_row("teacher", "mpnet-base", 50.0, 30.0), _row("student", "model.safetensors", 400.0, 200.0),
            _row("export", "onnx/model.onnx", 520.0, 260.0),
            _row("export", "onnx/model_quint8_avx2.onnx", 900.0, 450.0),
            _row("export", "onnx/model_qint8_avx512.onnx", 2000.0, 1000.0)]  # recorded, not in the directory
    manifest = directory / SPEEDS_FILE
    manifest.write_text(json.dumps({"kind": "raydistill_package", "rows": rows}))
    runtime = choose_runtime(directory)
    assert runtime.file == "onnx/model_quint8_avx2.onnx"
    assert "450 sentences per CPU s" in runtime.reason
    assert "model_qint8_avx512.onnx recorded but missing" in runtime.reason

    rows[3]["marked"] = ["stsb_dev"]  # the int8 file lost more than the package's margin: never chosen for speed
    manifest.write_text(json.dumps({"rows": rows}))
    runtime = choose_runtime(directory)
    assert runtime.file == "onnx/model.onnx" and "model_quint8_avx2.onnx lost quality (stsb_dev)" in runtime.reason

    rows[2]["sentences_per_cpu_s"] = 150.0
    manifest.write_text(json.dumps({"rows": rows}))
    assert choose_runtime(directory).file is None  # the torch model is the fastest that kept quality


def test_an_export_not_faster_here_is_not_served_by_default_and_the_reason_says_so(tmp_path):
    """The package records, per export, whether it beat the torch model per CPU second where it was measured
    (``faster_here``); one that did not is skipped by name, also when its wall rate was higher. A manifest from
    before that field gets the same verdict from its rates."""
    directory = _model_dir(tmp_path, "onnx/model.onnx", "onnx/model_quint8_avx2.onnx")
    rows = [_row("teacher", "mpnet-base", 50.0, 30.0), _row("student", "model.safetensors", 400.0, 200.0),
            {**_row("export", "onnx/model.onnx", 420.0, 194.0), "faster_here": False},
            {**_row("export", "onnx/model_quint8_avx2.onnx", 380.0, 208.0), "faster_here": True}]
    manifest = directory / SPEEDS_FILE
    manifest.write_text(json.dumps({"rows": rows}))
    runtime = choose_runtime(directory)
    assert runtime.file == "onnx/model_quint8_avx2.onnx"
    assert "skipped onnx/model.onnx not faster here (194.0 vs the torch model's 200.0 sentences per CPU s)" \
        in runtime.reason

    rows[3] = {**rows[3], "faster_here": False, "sentences_per_cpu_s": 200.0}
    manifest.write_text(json.dumps({"rows": rows}))
    runtime = choose_runtime(directory)
    assert runtime.file is None and runtime.reason.count("not faster here") == 2
    assert choose_runtime(directory, "onnx/model.onnx").file == "onnx/model.onnx"  # --export still serves it

    for row in rows:  # a manifest written before the verdict was recorded
        row.pop("faster_here", None)
    manifest.write_text(json.dumps({"rows": rows}))
    runtime = choose_runtime(directory)
    assert runtime.file is None and runtime.reason.count("not faster here") == 2


def test_without_recorded_speeds_the_torch_model_unless_an_export_is_named(tmp_path):
    directory = _model_dir(tmp_path, "onnx/model.onnx")
    runtime = choose_runtime(directory)
    assert runtime.file is None and SPEEDS_FILE in runtime.reason
    assert choose_runtime(directory, "onnx/model.onnx").file == "onnx/model.onnx"
    assert choose_runtime(directory, "torch").file is None


@pytest.mark.parametrize("case", ["missing export", "bad speeds file", "not a model dir"])
def test_what_cannot_be_served_is_one_clear_error(tmp_path, case):
    directory = _model_dir(tmp_path / "m", "onnx/model.onnx")
    if case == "missing export":
        with pytest.raises(ServeError, match=r"onnx/model_int8\.onnx: no such file; exports in .*onnx/model\.onnx"):
            choose_runtime(directory, "onnx/model_int8.onnx")
    elif case == "bad speeds file":
        (directory / SPEEDS_FILE).write_text(json.dumps({"rows": [{"kind": "export", "file": "onnx/model.onnx"}]}))
        with pytest.raises(ServeError, match=rf"{SPEEDS_FILE}: rows\[0\] needs a positive \"sentences_per_s\""):
            choose_runtime(directory)
    else:
        with pytest.raises(ServeError, match="neither modules.json nor config.json"):
            choose_runtime(tmp_path)


def test_command_line_options():
    args = add_arguments(argparse.ArgumentParser()).parse_args(["DIR", "--replicas", "2", "--batch-wait-ms", "0"])
    assert (args.model_dir, args.export, args.host, args.port, args.replicas, args.max_batch_size,
            args.batch_wait_ms) == ("DIR", None, "127.0.0.1", 8000, 2, 32, 0.0)


# ----------------------------------------------------------------------------------------------------------------
# The deployment (Ray Serve on loopback)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _call(url: str, body: bytes | dict | None = None) -> tuple[int, dict]:
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def served(ray_session, tiny_bert, tmp_path_factory):
    """A tiny BERT + Dense(32 -> 48) student saved as `raydistill distill` leaves it, served by one replica."""
    from ray import serve

    from raydistill.models import BiEncoder

    directory = tmp_path_factory.mktemp("served") / "student"
    BiEncoder.from_pretrained(tiny_bert, projection_dim=48).save(directory)
    options = ServeOptions(port=_free_port(), max_batch_size=MAX_BATCH, batch_wait_ms=WAIT_MS, threads=1)
    try:
        url = deploy(directory, choose_runtime(directory), options)
        yield url, BiEncoder.from_pretrained(directory)
    finally:
        serve.shutdown()


@pytest.mark.ray
def test_concurrent_clients_get_the_encoders_vectors_in_shared_batches(served, real_sentences):
    url, reference = served
    texts = real_sentences[: CLIENTS * PER_CLIENT]
    status, before = _call(url)
    assert status == 200 and before["dim"] == 48 and before["runtime"] == "torch"
    start = threading.Barrier(CLIENTS)

    def client(index: int) -> tuple[int, dict]:
        start.wait()
        return _call(url, {"sentences": texts[index * PER_CLIENT:(index + 1) * PER_CLIENT]})

    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(client, range(CLIENTS)))
    assert all(status == 200 for status, _ in answers), answers
    served_vectors = np.array([row for _, answer in answers for row in answer["embeddings"]])
    assert served_vectors.shape == (len(texts), 48) and answers[0][1]["model"] == "student"
    assert cosines(served_vectors, reference.encode(texts)).min() > MIN_COSINE

    _, after = _call(url)
    sentences, batches = after["sentences"] - before["sentences"], after["batches"] - before["batches"]
    assert sentences == len(texts) and after["requests"] - before["requests"] == CLIENTS
    # Fewer forward passes than requests: sentences of different clients went through the encoder together.
    assert batches < CLIENTS, after["batch_sizes"]


@pytest.mark.ray
def test_a_long_request_is_split_into_batches_and_openai_clients_are_answered(served, real_sentences):
    url, reference = served
    texts = real_sentences[100:100 + 2 * MAX_BATCH]
    _, before = _call(url)
    status, answer = _call(url + "v1/embeddings", {"sentences": texts, "normalize": True})
    assert status == 200 and answer["normalized"] is True
    vectors = np.array(answer["embeddings"])
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1, atol=1e-5)
    assert cosines(vectors, reference.encode(texts)).min() > MIN_COSINE
    _, after = _call(url)
    assert after["batches"] - before["batches"] == 2 and after["batch_sizes"][str(MAX_BATCH)] >= 2

    openai_texts = texts[:MAX_BATCH]
    status, floats = _call(url + "v1/embeddings", {"input": openai_texts, "model": "student"})
    status64, packed = _call(url, {"input": openai_texts, "encoding_format": "base64"})
    assert status == status64 == 200 and [row["index"] for row in floats["data"]] == list(range(MAX_BATCH))
    unpacked = np.array([np.frombuffer(base64.b64decode(row["embedding"]), dtype="<f4") for row in packed["data"]])
    assert np.allclose(unpacked, np.array([row["embedding"] for row in floats["data"]]), atol=1e-6)
    assert cosines(unpacked, reference.encode(openai_texts)).min() > MIN_COSINE
    assert floats["usage"]["prompt_tokens"] > MAX_BATCH


@pytest.mark.ray
@pytest.mark.parametrize("body, message", [
    (b"{not json", "not JSON"),
    ({"sentences": []}, "'sentences' is empty"),
    ({"sentences": "one string"}, "'sentences' must be a list of strings"),
    ({"sentences": ["fine", 3]}, r"sentences\[1\] must be a string, got int"),
    ({"texts": ["a"]}, "exactly one of \"sentences\""),
    ({"sentences": ["a"], "normalise": True}, "unknown field.*normalise"),
    ({"input": [[101, 102]]}, "token ids are not accepted"),
    ({"input": "a", "dimensions": 8}, "returns 48, not 8"),
])
def test_a_bad_request_gets_400_and_a_message(served, body, message):
    url, _ = served
    status, answer = _call(url, body)
    assert status == 400
    assert answer["error"]["type"] == "invalid_request_error"
    assert re.search(message, answer["error"]["message"]), answer
