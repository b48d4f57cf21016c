#!/usr/bin/env python
"""`elmo-fast serve` under concurrent single-sentence clients, against offline ElmoEmbedder, in one run.

    python benchmarks/bench_serve.py                         # original (random, fp32) + the bundled model
    python benchmarks/bench_serve.py --models original --clients 1,32 --seconds 20
    python benchmarks/bench_serve.py --quick                 # smoke run on a tiny model, well under a minute

For each model, all in one run and on the same sentences (``corpus.make_sentences``: realistic
lengths, mean ~25 tokens):

* the server (``elmo-fast serve``, fp32, its defaults) driven by C concurrent clients (a separate
  process, asyncio, one keep-alive connection per client), each sending one sentence per request
  (``POST /embed``, ``"output": "mean"`` by default) and waiting for the answer before sending the
  next: tokens/s over the measured window, p50/p99 latency as the clients see it, the mean batch
  size and the share of the window the model spent in batches ("model busy"; both from the
  server's /metrics over the same window);
* the same server with batching off (``--max-batch-size 1``);
* the same server with its guards on as on a network (``--guarded-clients``): an API key on every
  request, besides the defaults (at most 512 open sockets, 30 s deadlines for each request's head and
  body, 5 s idle keep-alive); and the same over TLS (a self-signed certificate made for the run, TLS 1.3),
  as its own row;
* the answer's encoding: ``"output": "all"`` as JSON and as ``.npy`` (``Accept: application/x-npy``)
  at 1 and 32 clients (``--encoding-clients``), the clients decoding every answer;
* offline ``ElmoEmbedder.embed_batch`` in a process of its own (model loaded, idle while the server
  is measured), consecutive batches of 64 (the base of the many-client rows) or of 1 (the base of
  the 1-client rows), tokens/s over the time spent in ``embed_batch``, measured for
  ``--offline-seconds`` just before and just after each server row, with the server idle: the
  ratio uses their mean, so that a machine whose load drifts over minutes moves both sides alike.

Clients and server share the machine's cores, as they would on a one-box deployment; the clients'
own CPU time (parsing answers) is reported. Targets (``original`` fp32 on CPU): 32 clients
>= 70% of offline batch-64 tokens/s; 1 client: the server adds <= 10% to the time of offline batch 1.
Nothing here asserts a speed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(HERE) not in sys.path:  # corpus.py and bench_cpu.py sit beside this file
    sys.path.insert(0, str(HERE))

from corpus import make_sentences  # noqa: E402

DEFAULT_CACHE_DIR = Path("/tmp/elmo_fast_bench")


# ---------------------------------------------------------------------------------------------
# offline ElmoEmbedder, in a fresh process


def _offline_process(model: dict, sentences: list, conn) -> None:
    """The offline side: one ElmoEmbedder, measuring ``embed_batch`` whenever asked."""
    from elmo_fast import ElmoEmbedder

    e = ElmoEmbedder(**model)
    warm = make_sentences(64, seed=12345)  # not in the measured corpus
    for batch in (64, 1, 64):
        e.embed_batch(warm[:batch])
    conn.send("ready")
    at = 0
    while (ask := conn.recv()) is not None:
        batch, seconds = ask
        tokens, spent = 0, 0.0
        while spent < seconds:
            chunk = [sentences[(at + k) % len(sentences)] for k in range(batch)]
            at = (at + batch) % len(sentences)
            start = time.perf_counter()
            e.embed_batch(chunk)
            spent += time.perf_counter() - start
            tokens += sum(map(len, chunk))
        conn.send(tokens / spent)


class Offline:
    """ElmoEmbedder in a process of its own (spawned: its torch reads OMP_NUM_THREADS as --threads set
    it), idle but for the measurements asked of it: each server row is compared with offline rates
    measured just before and just after it, so that a load that changes over minutes on a shared
    machine moves both sides of the ratio alike."""

    def __init__(self, model: dict, sentences: list) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_offline_process, args=(model, sentences, child), daemon=True)
        self.proc.start()
        assert self.conn.recv() == "ready"

    def rate(self, batch: int, seconds: float) -> float:
        """tokens/s of embed_batch over consecutive batches of ``batch`` sentences (the time in it only)."""
        self.conn.send((batch, seconds))
        return self.conn.recv()

    def close(self) -> None:
        self.conn.send(None)
        self.proc.join()


# ---------------------------------------------------------------------------------------------
# the server


def model_flags(model: dict) -> list[str]:
    if "model_dir" in model:
        return ["--model-dir", str(model["model_dir"])]
    return ["--options", str(model["options_file"]), "--weights", str(model["weight_file"])]


#: the API key of the guarded rows (sent by every client)
BENCH_KEY = "bench-key"


def self_signed(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (openssl), for the TLS row."""
    cert, key = folder / "bench_cert.pem", folder / "bench_key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        + ["-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )
    return str(cert), str(key)


def client_ssl(ca: str | None):
    if not ca:
        return None
    import ssl

    return ssl.create_default_context(cafile=ca)


class Server:
    """`elmo-fast serve` in a subprocess on a free port, until stop(). ``key``: its API key; ``ca``: the
    certificate of its TLS (the clients trust it)."""

    def __init__(
        self,
        model: dict,
        extra: list[str],
        env: dict | None = None,
        timeout: float = 600,
        key: str | None = None,
        ca: str | None = None,
    ) -> None:
        cmd = [sys.executable, "-m", "elmo_fast", "serve", *model_flags(model), "--port", "0", *extra]
        env = dict(env or os.environ)
        if key:
            env["ELMO_FAST_API_KEY"] = key
        self.key, self.ca = key, ca
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True, env=env)
        self.lines = []
        deadline = time.time() + timeout
        while time.time() < deadline:
            line = self.proc.stderr.readline()
            if not line:
                raise RuntimeError(f"the server stopped: {''.join(self.lines)}")
            self.lines.append(line)
            m = re.search(r"ready on (https?)://([\d.]+):(\d+)", line)
            if m:
                self.scheme, self.host, self.port = m.group(1), m.group(2), int(m.group(3))
                return
        raise RuntimeError("the server did not become ready in time")

    def wait_idle(self, timeout: float = 900) -> None:
        """Until nothing waits and no batch runs (the previous row's clients hung up; a batch they
        started still runs to its end, and must not count in the next row)."""
        import urllib.request

        deadline = time.time() + timeout
        headers = {"Authorization": f"Bearer {self.key}"} if self.key else {}
        while time.time() < deadline:
            request = urllib.request.Request(f"{self.scheme}://{self.host}:{self.port}/metrics", headers=headers)
            with urllib.request.urlopen(request, context=client_ssl(self.ca)) as r:
                text = r.read().decode()
            if re.search(r"^elmo_fast_queue_depth 0$", text, re.M) and re.search(
                r"^elmo_fast_model_busy 0$", text, re.M
            ):
                return
            time.sleep(0.05)
        raise RuntimeError("the server did not become idle")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.proc.stderr.close()


# ---------------------------------------------------------------------------------------------
# the clients (run with --drive, in their own process)


async def _request(
    reader, writer, method: str, path: str, body: bytes = b"", headers: str = ""
) -> tuple[int, dict, bytes]:
    writer.write(
        f"{method} {path} HTTP/1.1\r\nHost: bench\r\nContent-Length: {len(body)}\r\n{headers}\r\n".encode() + body
    )
    status = int((await reader.readline()).split()[1])
    head = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, _, v = line.decode("latin-1").partition(":")
        head[k.strip().lower()] = v.strip()
    return status, head, await reader.readexactly(int(head.get("content-length", 0)))


def _batch_stats(metrics: str) -> tuple[float, float, float]:
    """Sentences and batches so far, and the model's seconds spent in batches."""

    def value(name: str) -> float:
        return float(re.search(rf"^elmo_fast_{name} (\S+)$", metrics, re.M).group(1))

    return value("batch_size_sum"), value("batch_size_count"), value("batch_seconds_sum")


async def _drive(
    host: str,
    port: int,
    sentences: list,
    clients: int,
    warmup: float,
    seconds: float,
    output: str,
    npy: bool,
    key: str | None = None,
    ca: str | None = None,
) -> dict:
    import orjson

    accept = "Accept: application/x-npy\r\n" if npy else ""
    auth = f"Authorization: Bearer {key}\r\n" if key else ""
    tls = client_ssl(ca)
    t_start = time.perf_counter() + warmup
    t_end = t_start + seconds
    done: list[tuple[float, int]] = []  # (latency, tokens) of the requests completed within the window
    errors = []

    async def metrics() -> str:
        r, w = await asyncio.open_connection(host, port, ssl=tls)
        _, _, body = await _request(r, w, "GET", "/metrics", headers=auth)
        w.close()
        return body.decode()

    async def client(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, port, ssl=tls)
        k = (i * 7919) % len(sentences)
        try:
            while time.perf_counter() < t_end:
                s = sentences[k]
                k = (k + 1) % len(sentences)
                body = orjson.dumps({"sentences": [s], "output": output})
                t0 = time.perf_counter()
                status, head, answer = await _request(reader, writer, "POST", "/embed", body, accept + auth)
                t1 = time.perf_counter()
                if status != 200:
                    errors.append(status)
                    continue
                if npy:
                    np.load(__import__("io").BytesIO(answer))
                else:
                    orjson.loads(answer)
                if t_start <= t1 <= t_end:
                    done.append((t1 - t0, len(s)))
        finally:
            writer.close()  # an unfinished request is dropped by the server (the client is gone)

    async def window() -> tuple[str, str]:
        await asyncio.sleep(max(0.0, t_start - time.perf_counter()))
        before = await metrics()
        await asyncio.sleep(max(0.0, t_end - time.perf_counter()))
        return before, await metrics()

    cpu0 = time.process_time()
    tasks = [asyncio.ensure_future(client(i)) for i in range(clients)]
    before, after = await window()
    # the clients finish their requests in flight (or are cut off after a grace period)
    await asyncio.wait(tasks, timeout=5)
    for t in tasks:
        t.cancel()
    cpu = time.process_time() - cpu0
    s0, c0, b0 = _batch_stats(before)
    s1, c1, b1 = _batch_stats(after)
    lat = np.array([d[0] for d in done]) if done else np.array([np.nan])
    return {
        "tokens_per_s": sum(d[1] for d in done) / seconds,
        "requests": len(done),
        "p50_ms": 1e3 * float(np.median(lat)),
        "p99_ms": 1e3 * float(np.percentile(lat, 99)),
        "mean_batch": (s1 - s0) / (c1 - c0) if c1 > c0 else float("nan"),
        "model_busy": (b1 - b0) / seconds,
        "errors": len(errors),
        "client_cpu_s": cpu,
    }


def drive(
    server: Server, corpus: Path, clients: int, warmup: float, seconds: float, output: str = "mean", npy: bool = False
) -> dict:
    """Run the clients in a separate process and return their measurements."""
    cmd = [
        sys.executable,
        __file__,
        "--drive",
        f"{server.host}:{server.port}",
        "--corpus",
        str(corpus),
        "--clients",
        str(clients),
        "--warmup",
        str(warmup),
        "--seconds",
        str(seconds),
        "--output",
        output,
    ]
    if npy:
        cmd.append("--npy")
    if server.key:
        cmd += ["--drive-key", server.key]
    if server.ca:
        cmd += ["--drive-ca", server.ca]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=warmup + seconds + 600)
    if r.returncode != 0:
        raise RuntimeError(f"the clients failed: {r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------
# the run


def _fmt(x: float, digits: int = 0) -> str:
    if x != x:  # nan
        return "-"
    return f"{x:,.{digits}f}"


def bench_model(name: str, model: dict, sentences: list, corpus: Path, args) -> list[str]:
    print(f"bench_serve: {name}: loading", file=sys.stderr)
    offline = Offline(model, sentences)
    rows = []
    # (label, server flags, [(clients, output, npy)]): one server per label
    on = [(c, "mean", False) for c in args.clients]
    on += [(c, "all", npy) for npy in (False, True) for c in args.encoding_clients]
    wait = [f"--max-wait-ms={args.max_wait_ms}"]
    guarded = [(c, "mean", False) for c in args.guarded_clients]
    cert, key = self_signed(args.cache_dir) if guarded else (None, None)
    # (label, server flags, runs, API key, the clients' CA)
    configs = [
        ("batching", wait, on, None, None),
        ("batching off", ["--max-batch-size", "1"], [(c, "mean", False) for c in args.off_clients], None, None),
        ("guards on (API key, 512 sockets, 30 s deadlines)", wait, guarded, BENCH_KEY, None),
        (
            "guards on + TLS 1.3",
            [*wait, "--ssl-certfile", cert or "", "--ssl-keyfile", key or ""],
            guarded,
            BENCH_KEY,
            cert,
        ),
    ]
    try:
        for label, extra, runs, api_key, ca in configs:
            if not runs:
                continue
            print(f"bench_serve: {name}: server, {label}", file=sys.stderr)
            server = Server(model, extra, env=args.env, key=api_key, ca=ca)
            try:
                for c, output, npy in runs:
                    server.wait_idle()
                    compare = 1 if c == 1 and output == "mean" else 64
                    before = offline.rate(compare, args.offline_seconds)
                    r = drive(server, corpus, c, args.warmup, args.seconds, output, npy)
                    server.wait_idle()
                    after = offline.rate(compare, args.offline_seconds)
                    base = (before + after) / 2
                    if compare == 1:  # the time a token takes, server over offline, minus 1
                        vs = f"{100 * (base / r['tokens_per_s'] - 1):+.1f}% time"
                    else:
                        vs = f"{100 * r['tokens_per_s'] / base:.0f}%"
                    what = f"server, {label}" + (
                        "" if output == "mean" else f", output {output} as {'.npy' if npy else 'JSON'}"
                    )
                    rows.append(
                        f"| {what} | {c} | {r['requests']} | {_fmt(r['tokens_per_s'])} | "
                        f"batch {compare}: {_fmt(before)} / {_fmt(after)} | {vs} | "
                        f"{_fmt(r['p50_ms'], 1)} | {_fmt(r['p99_ms'], 1)} | {_fmt(r['mean_batch'], 1)} | "
                        f"{100 * r['model_busy']:.0f}% | {_fmt(r['client_cpu_s'], 2)} s | {os.getloadavg()[0]:.1f} |"
                        + (f" ({r['errors']} errors)" if r["errors"] else "")
                    )
                    print(rows[-1], file=sys.stderr)
            finally:
                server.stop()
    finally:
        offline.close()
    return rows


def encoding_costs(layers: int, tokens: int, dim: int, repeats: int = 20) -> list[str]:
    """Median ms to encode (server) and decode (client) one sentence's ``"all"`` answer, [layers,
    tokens, dim] float32, as JSON (json on tolist(), as a plain app would; orjson, as the server
    does) and as .npy; and the answer's size."""
    import io
    import json as std_json

    import orjson

    from elmo_fast.serve import responses

    a = np.random.default_rng(0).standard_normal((layers, tokens, dim)).astype(np.float32)
    ways = {
        "json (tolist)": (lambda: std_json.dumps({"embeddings": [a.tolist()]}).encode(), std_json.loads),
        "orjson (the server)": (lambda: responses.embed_json([a], "m", dim), orjson.loads),
        ".npy (the server)": (lambda: responses.embed_npy([a], "all")[0], lambda b: np.load(io.BytesIO(b))),
    }
    rows = []
    for name, (encode, decode) in ways.items():
        body = encode()
        times = {"encode": [], "decode": []}
        for _ in range(repeats):
            t0 = time.perf_counter()
            body = encode()
            t1 = time.perf_counter()
            decode(body)
            times["encode"].append(t1 - t0)
            times["decode"].append(time.perf_counter() - t1)
        rows.append(
            f"| {name} | {len(body) / 1e6:.2f} MB | {1e3 * np.median(times['encode']):.2f} | "
            f"{1e3 * np.median(times['decode']):.2f} |"
        )
    return rows


def machine_line() -> str:
    import torch
    from bench_cpu import machine_info

    m = machine_info(torch.get_num_threads())
    load = os.getloadavg()
    return (
        f"- {m['cpu_model']} ({m['logical_cpus']} logical CPUs), torch {m['torch']} ({m['torch_threads']} "
        f"threads), Python {m['python']}; {m['date']}; load average before the run {load[0]:.1f}"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--models",
        help="comma-separated: random presets (tiny, small, medium, original) and/or 'default' (bundled); "
        "default original,default (--quick: tiny)",
    )
    p.add_argument("--clients", help="concurrent clients, batching on (default 1,8,32,128; --quick: 1,4)")
    p.add_argument("--off-clients", help="concurrent clients, batching off ('' skips; default 1,8,32,128; --quick: 2)")
    p.add_argument(
        "--encoding-clients", help="clients for the output-all JSON/.npy rows ('' skips; default 1,32; --quick: 1)"
    )
    p.add_argument(
        "--guarded-clients",
        help="clients for the rows with the guards on, without and with TLS ('' skips; default 32; --quick: 4)",
    )
    p.add_argument("--sentences", type=int, help="corpus size (default 4000; --quick: 200)")
    p.add_argument("--seconds", type=float, help="measured window per row (default 20; --quick: 1)")
    p.add_argument("--warmup", type=float, help="seconds of load before each window (default 5; --quick: 0.5)")
    p.add_argument(
        "--offline-seconds",
        type=float,
        help="seconds of offline embedding measured before and after each server row (default 10; --quick: 0.3)",
    )
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's --max-wait-ms")
    p.add_argument(
        "--threads",
        type=int,
        help="torch threads of the server and the offline runs (OMP_NUM_THREADS; default: torch's; --quick: 1)",
    )
    p.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR, help="where random models are written once")
    p.add_argument(
        "--quick", action="store_true", help="a smoke run: tiny model, few seconds (the flags given still apply)"
    )
    # the clients' process
    p.add_argument("--drive", metavar="HOST:PORT", help=argparse.SUPPRESS)
    p.add_argument("--corpus", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--output", default="mean", help=argparse.SUPPRESS)
    p.add_argument("--npy", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--drive-key", help=argparse.SUPPRESS)
    p.add_argument("--drive-ca", help=argparse.SUPPRESS)
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # servers stop in finally blocks
    if args.drive:
        host, port = args.drive.rsplit(":", 1)
        sentences = json.loads(args.corpus.read_text())
        r = asyncio.run(
            _drive(
                host,
                int(port),
                sentences,
                int(args.clients),
                args.warmup,
                args.seconds,
                args.output,
                args.npy,
                args.drive_key,
                args.drive_ca,
            )
        )
        print(json.dumps(r))
        return 0
    for name, full, quick in (
        ("models", "original,default", "tiny"),
        ("clients", "1,8,32,128", "1,4"),
        ("off_clients", "1,8,32,128", "2"),
        ("encoding_clients", "1,32", "1"),
        ("guarded_clients", "32", "4"),
        ("threads", None, 1),
        ("sentences", 4000, 200),
        ("seconds", 20.0, 1.0),
        ("warmup", 5.0, 0.5),
        ("offline_seconds", 10.0, 0.3),
    ):
        if getattr(args, name) is None:  # not given: the run's default
            setattr(args, name, quick if args.quick else full)

    def counts(text: str) -> list[int]:
        return [int(c) for c in text.split(",") if c.strip()]

    args.clients, args.off_clients, args.encoding_clients, args.guarded_clients = (
        counts(args.clients),
        counts(args.off_clients),
        counts(args.encoding_clients),
        counts(args.guarded_clients),
    )
    args.env = None
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
        args.env = dict(os.environ)
    from bench_cpu import ensure_model

    sentences = make_sentences(args.sentences, seed=0)
    args.cache_dir.mkdir(parents=True, exist_ok=True)
    corpus = args.cache_dir / f"serve_corpus_{args.sentences}.json"
    corpus.write_text(json.dumps(sentences))
    print(machine_line())
    print(f"- command: `python {' '.join(map(shlex.quote, sys.argv))}`")
    print(
        f"- corpus: {len(sentences)} sentences, {sum(map(len, sentences)):,} tokens (corpus.make_sentences, "
        f"mean {np.mean([len(s) for s in sentences]):.1f} tokens); {args.seconds:g} s measured per row after "
        f"{args.warmup:g} s of warm-up; server flags: defaults, --max-wait-ms {args.max_wait_ms:g}; fp32"
    )
    enc_tokens = int(round(np.mean([len(s) for s in sentences])))
    print(f'\nOne sentence\'s `"output": "all"` answer, [3, {enc_tokens}, 1024] float32 (`original`), median of 20:\n')
    print("| encoding | size | encode ms (server) | decode ms (client) |\n|---|--:|--:|--:|")
    print("\n".join(encoding_costs(3, enc_tokens, 1024)), flush=True)
    for name in args.models.split(","):
        if name == "default":
            from elmo_fast.pretrained.bundled import bundled_model

            model = {"model_dir": str(bundled_model().directory)}
        else:
            options, weights = ensure_model(name, args.cache_dir)
            model = {"options_file": options, "weight_file": weights}
        rows = bench_model(name, model, sentences, corpus, args)
        print(f"\n**{name}** (fp32)\n")
        print(
            "| what | clients | requests | tokens/s | offline tokens/s just before / after | server vs offline | "
            "p50 ms | p99 ms | mean batch | model busy | clients' CPU | load avg |"
        )
        print("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
        print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
