"""Proteins from FASTA: the read stage (elmo_fast/embedding/fasta.py) and `elmo-fast embed --fasta` /
``embed_file(fasta=True)``: ids, seqvec's id rule, per-protein vectors, batching by residues, resume,
torchrun, and every malformed file a one-line error naming the line with nothing written."""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

from elmo_fast import ElmoEmbedder
from elmo_fast.cli import main
from elmo_fast.embedding.fasta import IdRule, read_fasta
from elmo_fast.errors import ElmoFastError, InputError

AMINO = "ACDEFGHIKLMNPQRSTVWYXUBZ"


def random_proteins(rng: random.Random, n: int, low: int = 1, high: int = 60) -> list[tuple[str, str]]:
    return [
        (
            f"sp|P{i:05d}|PROT{i}_HUMAN Protein {i} OS=Homo sapiens",
            "".join(rng.choice(AMINO) for _ in range(rng.randint(low, high))),
        )
        for i in range(n)
    ]


def write_fasta(path: Path, records, width: int = 60, opener=open, eol: str = "\n") -> Path:
    with opener(path, "wt", newline="") as f:
        for header, seq in records:
            f.write(f">{header}{eol}")
            for i in range(0, len(seq), width):
                f.write(seq[i : i + width] + eol)
    return path


def records(path, **kw) -> list[tuple[str, str, int]]:
    return [(r.key, r.text, r.number) for r in read_fasta(path, **kw)]


# ---- the read stage ------------------------------------------------------------------------------------


def test_ids_sequences_and_line_numbers(tmp_path):
    p = tmp_path / "a.fasta"
    p.write_text(">sp|P1|A first\nMKT\nayi\n\n>  second  protein\nM K\tT\n>third\nG\n")
    assert records(p) == [("sp|P1|A", "MKTAYI", 1), ("second", "MKT", 5), ("third", "G", 7)]
    r = next(iter(read_fasta(p)))
    assert r.tokens == list("MKTAYI") and r.index == 0 and r.where() == "record 'sp|P1|A' (line 1)"


def test_seqvecs_id_rule(tmp_path):
    p = tmp_path / "a.fasta"
    p.write_text(">sp|P1|A first\nMK\n>tr|Q2|B\nMM\n")
    assert [r[0] for r in records(p, id_rule=IdRule("|", 1))] == ["P1", "Q2"]
    assert [r[0] for r in records(p, id_rule=IdRule("|", 2))] == ["A first", "B"]
    assert [r[0] for r in records(p, id_rule=IdRule("|", -1))] == ["sp|P1|A first", "tr|Q2|B"]
    with pytest.raises(InputError, match=r"line 1: the header '>sp\|P1\|A first' gives no id \(field 5 of the header"):
        records(p, id_rule=IdRule("|", 5))
    with pytest.raises(ElmoFastError, match="fasta_id_field must be an integer >= -1"):
        IdRule("|", -2)


@pytest.mark.parametrize("how", ["gzip", "crlf", "bom", "no final newline"])
def test_compressed_and_windows_files(tmp_path, how):
    recs = [("one", "MKTAYIAK"), ("two", "QRQ")]
    if how == "gzip":
        p = write_fasta(tmp_path / "a.fa.gz", recs, width=3, opener=gzip.open)
    elif how == "crlf":
        p = write_fasta(tmp_path / "a.fa", recs, width=3, eol="\r\n")
    elif how == "bom":
        p = tmp_path / "a.fa"
        p.write_bytes(b"\xef\xbb\xbf>one\nMKTAYIAK\n>two\nQRQ\n")
    else:
        p = tmp_path / "a.fa"
        p.write_text(">one\nMKTAYIAK\n>two\nQRQ")
    assert [(k, s) for k, s, _ in records(p)] == recs


@pytest.mark.parametrize(
    "text,message",
    [
        ("MKT\n>a\nMK\n", "line 1: sequence before the first header"),
        (">a\nMK\n>b\nMM\n>a\nMT\n", "line 5: the id 'a' was the id of line 1 too"),
        (">a\n>b\nMK\n", "line 1: record 'a' has no residues"),
        (">a\nMK\n>b\n\n", "line 3: record 'b' has no residues"),
        (">a\nMK1T\n", "line 2, column 3: '1' is not a residue letter"),
        (">a\nMKT*\n", r"line 2, column 4: '\*' is not a residue letter \(A-Z\) \(a stop codon: remove it\)"),
        (">a\nMK-T\n", "line 2, column 3: '-' is not a residue letter"),
        (">\nMK\n", "line 1: the header '>' gives no id"),
        (">a/./b\nMK\n", "line 1: the id 'a/./b' cannot key a dataset"),
        ("", "holds no FASTA records"),
        ("\n\n", "holds no FASTA records"),
    ],
)
def test_malformed_files_are_errors_naming_the_line(tmp_path, text, message):
    p = tmp_path / "bad.fasta"
    p.write_text(text)
    with pytest.raises(InputError, match=message) as e:
        records(p)
    assert "\n" not in str(e.value) and str(p) in str(e.value)


def test_a_line_too_long_stops_before_it_is_held(tmp_path):
    p = tmp_path / "long.fasta"
    p.write_text(">a\n" + "M" * 5000 + "\n")
    with pytest.raises(InputError, match="line 2 is longer than 1,000 characters"):
        records(p, max_line_length=1000)


# ---- embed_file(fasta=True) / elmo-fast embed --fasta --------------------------------------------------


@pytest.fixture(scope="module")
def model(random_models):
    return random_models("tiny")


@pytest.fixture(scope="module")
def proteins():
    return random_proteins(random.Random(31), 23, 1, 90)


@pytest.mark.slow
def test_each_protein_alone_whatever_the_batches(model, proteins, tmp_path):
    """Stateless: a protein's vectors are those of the protein embedded alone, however records are sorted and
    cut into batches by residues; datasets by id; --sum and --per-protein as documented."""
    fasta = write_fasta(tmp_path / "p.fasta", proteins, width=17)
    embedder = ElmoEmbedder(*model)
    alone = {h.split()[0]: embedder.embed_sentence(list(s)) for h, s in proteins}
    for budget in (50, 4096):
        out = tmp_path / f"all_{budget}.h5"
        stats = embedder.embed_file(fasta, out, "all", fasta=True, max_tokens_per_batch=budget, progress=False)
        assert stats["sentences"] == len(proteins) and stats["tokens"] == sum(len(s) for _, s in proteins)
        with h5py.File(out, "r") as f:
            assert sorted(f) == sorted(alone) and "sentence_to_index" not in f
            for key, want in alone.items():
                assert np.abs(f[key][...] - want).max() <= 1e-5
    summed = tmp_path / "sum.h5"
    embedder.embed_file(fasta, summed, "sum", fasta=True, per_protein="also", progress=False)
    only = tmp_path / "only.h5"
    embedder.embed_file(
        fasta, only, "sum", fasta=True, per_protein=True, fasta_split_char="|", fasta_id_field=1, progress=False
    )
    with h5py.File(summed, "r") as s, h5py.File(only, "r") as o:
        for header, _seq in proteins:
            key = header.split()[0]
            want = alone[key].sum(axis=0)
            assert np.abs(s[key][...] - want).max() <= 1e-5
            reduced = s[key].attrs["per_protein"]
            assert reduced.shape == (want.shape[1],) and np.abs(reduced - want.mean(axis=0)).max() <= 1e-5
            # bio_embeddings' reduce_per_protein: the layers summed, the mean over the residues
            assert np.abs(o[key.split("|")[1]][...] - alone[key].sum(0).mean(0)).max() <= 1e-5


def test_resume_gives_the_plain_runs_file(model, proteins, tmp_path):
    fasta = write_fasta(tmp_path / "p.fasta.gz", proteins, opener=gzip.open)
    embedder = ElmoEmbedder(*model)
    plain, resumed = tmp_path / "plain.h5", tmp_path / "resumed.h5"
    embedder.embed_file(fasta, plain, "top", fasta=True, progress=False, window=5)
    embedder.embed_file(fasta, resumed, "top", fasta=True, progress=False, window=5, resume=True)
    with h5py.File(plain, "r") as a, h5py.File(resumed, "r") as b:
        assert sorted(a) == sorted(b)
        for key in a:
            assert np.array_equal(a[key][...], b[key][...])


def test_a_malformed_file_leaves_nothing(model, proteins, tmp_path, capsys):
    bad = tmp_path / "bad.fasta"
    write_fasta(bad, proteins[:10] + [("sp|P00003|DUP", "MKT")])
    out = tmp_path / "out.h5"
    for resume in ([], ["--resume"]):
        code = main(
            [
                "embed",
                "--fasta",
                str(bad),
                str(out),
                "--all",
                "--options",
                str(model[0]),
                "--weights",
                str(model[1]),
                "--quiet",
                "--split-char",
                "|",
                "--id",
                "1",
                *resume,
            ]
        )
        err = capsys.readouterr().err.strip()
        assert code == 2 and err.startswith("elmo-fast: error: ") and "\n" not in err
        assert "the id 'P00003' was the id of line" in err
        assert sorted(os.listdir(tmp_path)) == ["bad.fasta"]


def test_options_that_belong_to_text_or_fasta_are_refused(model, tmp_path, capsys):
    fasta = write_fasta(tmp_path / "p.fasta", [("a", "MK")])
    for flags, message in (
        (["--fasta", "--tokenize"], "--tokenize is for text"),
        (["--fasta", "--use-sentence-keys"], "--use-sentence-keys is for text"),
        (["--per-protein"], "--per-protein needs --fasta"),
        (["--split-char", "|"], "--split-char needs --fasta"),
    ):
        code = main(
            [
                "embed",
                str(fasta),
                str(tmp_path / "o.h5"),
                "--all",
                "--options",
                str(model[0]),
                "--weights",
                str(model[1]),
                "--quiet",
                *flags,
            ]
        )
        assert code == 2 and message in capsys.readouterr().err


@pytest.mark.slow
def test_two_ranks_under_torchrun_write_what_one_process_writes(model, proteins, tmp_path):
    from torchrun import ENV, TORCHRUN, run

    fasta = write_fasta(tmp_path / "p.fasta", proteins)
    flags = ["--fasta", "--all", "--options", str(model[0]), "--weights", str(model[1]), "--window", "4", "--quiet"]
    one, two = tmp_path / "one.h5", tmp_path / "two.h5"
    r = run(sys.executable, "-m", "elmo_fast", "embed", fasta, one, *flags)
    assert r.returncode == 0, r.stderr
    r = run(*TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "elmo_fast", "embed", fasta, two, *flags, env=ENV)
    assert r.returncode == 0, r.stderr[-3000:]
    with h5py.File(one, "r") as a, h5py.File(two, "r") as b:
        assert sorted(a) == sorted(b) == sorted(h.split()[0] for h, _ in proteins)
        for key in a:
            assert np.abs(a[key][...] - b[key][...]).max() <= 1e-6


@pytest.mark.slow
def test_progress_counts_residues(model, proteins, tmp_path):
    fasta = write_fasta(tmp_path / "p.fasta", proteins)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "elmo_fast",
            "embed",
            "--fasta",
            str(fasta),
            str(tmp_path / "o.h5"),
            "--all",
            "--options",
            str(model[0]),
            "--weights",
            str(model[1]),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    residues = sum(len(s) for _, s in proteins)
    assert f"{len(proteins)} proteins, {residues:,} residues" in r.stderr
    from elmo_fast.embedding.progress import _residues_in

    assert _residues_in(fasta.read_bytes()) == residues
