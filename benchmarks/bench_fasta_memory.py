#!/usr/bin/env python
"""Peak memory of reading a FASTA input, as ``embed --fasta`` reads it, against the number of records: the read
stage (records parsed and checked, every id checked against the ids before it) of a synthetic FASTA of
100,000 and of 5,000,000 records, each in a fresh process, with nothing embedded (embedding 5 million
proteins would take weeks here; the stages after reading hold a window of records at a time, so the read
stage is where memory could grow with the input).

    python benchmarks/bench_fasta_memory.py                       # 100,000 and 5,000,000 records
    python benchmarks/bench_fasta_memory.py --records 1000,100000 # a quick run
    python benchmarks/bench_fasta_memory.py --source /path/to/other/checkout   # another version's reader

Each record: a UniProt-like header (``>UniRef50_A0A0000000042 n=1 Tax=...``) and one line of 30-90
residues (the residues do not change what the duplicate check holds; short records make the file quick
to write: 5,000,000 records are ~450 MB). The files are written once under ``--cache-dir``. Per size,
the child reports its peak RSS (``VmHWM``) after importing the reader and after reading every record,
the seconds the reading took and the records/s; the machine and its load are printed with the table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_cpu import machine_info  # noqa: E402

AMINO = np.frombuffer(b"ACDEFGHIKLMNPQRSTVWY", dtype=np.uint8)


def write_fasta(path: Path, n: int, seed: int = 0) -> None:
    if path.is_file():
        return
    rng = np.random.default_rng(seed)
    tmp = path.with_suffix(".partial")
    with open(tmp, "wb") as f:
        for start in range(0, n, 100_000):
            count = min(100_000, n - start)
            lengths = rng.integers(30, 91, size=count)
            residues = AMINO[rng.integers(0, len(AMINO), size=int(lengths.sum()))].tobytes()
            chunk, at = [], 0
            for i, length in enumerate(lengths):
                chunk.append(
                    b">UniRef50_A0A%010d n=1 Tax=Homo sapiens TaxID=9606\n%s\n"
                    % (start + i, residues[at : at + length])
                )
                at += length
            f.write(b"".join(chunk))
    tmp.rename(path)


CHILD = """
import json, sys, time
sys.path.insert(0, {source!r})

def peak():
    return [int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:')][0] / 1024

from elmo_fast.embedding.fasta import read_fasta
imported = peak()
start = time.perf_counter()
records = residues = 0
for record in read_fasta({fasta!r}, scratch_beside={beside!r}) if {new_api} else read_fasta({fasta!r}):
    records += 1
    residues += len(record.tokens)
seconds = time.perf_counter() - start
print(json.dumps({{"records": records, "residues": residues, "seconds": seconds, "imported_mib": imported,
                  "peak_mib": peak()}}))
"""


def measure(fasta: Path, source: Path, beside: Path) -> dict:
    new_api = "scratch_beside" in (source / "elmo_fast" / "embedding" / "fasta.py").read_text()
    code = CHILD.format(source=str(source), fasta=str(fasta), beside=str(beside), new_api=new_api)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"bench_fasta_memory: reading {fasta} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", default="100000,5000000", help="comma-separated record counts")
    parser.add_argument("--source", type=Path, default=REPO, help="the checkout whose reader is measured")
    parser.add_argument("--cache-dir", type=Path, default=Path("/tmp/elmo_fast_bench"))
    args = parser.parse_args()
    sizes = [int(x) for x in args.records.split(",")]
    folder = args.cache_dir / "fasta_memory"
    folder.mkdir(parents=True, exist_ok=True)
    info = machine_info(1)
    print(
        f"# {info['cpu_model']} ({info['cpu_family_model']}), {info['logical_cpus']} logical CPUs, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, reader of {args.source.resolve()}"
    )
    print(
        "| records | file MB | RSS after import MiB | peak RSS MiB | read s | records/s | x smallest peak | load avg |"
    )
    print("|--:|--:|--:|--:|--:|--:|--:|--:|")
    first = None
    for n in sizes:
        fasta = folder / f"synthetic_{n}.fasta"
        write_fasta(fasta, n)
        load = os.getloadavg()[0]
        got = measure(fasta, args.source.resolve(), folder / "out.h5")
        assert got["records"] == n, got
        first = first or got["peak_mib"]
        print(
            f"| {n:,} | {fasta.stat().st_size / 1e6:,.0f} | {got['imported_mib']:.0f} | {got['peak_mib']:.0f} "
            f"| {got['seconds']:.1f} | {n / got['seconds']:,.0f} | {got['peak_mib'] / first:.2f} | {load:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
