"""Proteins from FASTA: the read stage (elmo_fast/embedding/fasta.py) and `elmo-fast embed --fasta` /
``embed_file(fasta=True)``: ids, seqvec's id rule, per-protein vectors, batching by residues, resume,
torchrun, and every malformed file a one-line error naming the line with nothing written."""

from __future__ import annotations

import gzip
import os
import random
import sys
from pathlib import Path

import cli_process
import h5py
import numpy as np
import pytest

from elmo_fast import ElmoEmbedder
from elmo_fast.cli import main
from elmo_fast.embedding.fasta import IdRule, ResidueRule, read_fasta
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
        (">a\nMK1T\n", "line 2, column 3: record 'a', position 3 of its sequence: '1' is not a residue letter"),
        (
            ">a\nMK\u00e9T\n",
            r"line 2, column 3: record 'a', position 3 of its sequence: 'é' is not a residue letter \(A-Z\) \(U\+00E9\)",
        ),
        (">a\nMK*T\n", r"line 2, column 3: record 'a', position 3 of its sequence: a stop '\*' inside the sequence"),
        (">a\nMKT*\nMK\n", r"line 2, column 4: record 'a', position 4 of its sequence: a stop '\*' inside"),
        (">a\nMK**\n", r"line 2, column 3: record 'a', position 3 of its sequence: a stop '\*' inside"),
        (">a\nMK\n>b\nMK T-T\n", r"line 4, column 5: record 'b', position 4 of its sequence: '-' is an alignment gap"),
        (">a\nMKT\n.MK\n", r"line 3, column 1: record 'a', position 4 of its sequence: '\.' is an alignment gap"),
        (">a\n*\n", "line 1: record 'a' has no residues"),
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


def test_stops_gaps_lowercase_and_rare_residues(tmp_path):
    """A final '*' is dropped (however the record's lines are cut); lower case is upper-cased; U, O, B, Z and X
    pass as themselves (SeqVec reads characters); "keep" keeps every '*' as a character, "refuse" refuses a
    final one; gaps are removed on request, before the end is looked at."""
    p = tmp_path / "a.fasta"
    p.write_text(">a\nmkt\nUOBZX*\n\n>b\nMK\n*\n>c\nAC\n")
    assert records(p) == [("a", "MKTUOBZX", 1), ("b", "MK", 5), ("c", "AC", 8)]
    assert [r[1] for r in records(p, residue_rule=ResidueRule(stop="keep"))] == ["MKTUOBZX*", "MK*", "AC"]
    with pytest.raises(
        InputError, match=r"line 3, column 6: record 'a', position 9 of its sequence: the sequence ends with a stop"
    ):
        records(p, residue_rule=ResidueRule(stop="refuse"))
    inner = tmp_path / "inner.fasta"
    inner.write_text(">a\nMK*T\n")
    assert [r[1] for r in records(inner, residue_rule=ResidueRule(stop="keep"))] == ["MK*T"]
    with pytest.raises(InputError, match="inside the sequence"):
        records(inner, residue_rule=ResidueRule(stop="refuse"))
    gapped = tmp_path / "gapped.fasta"
    gapped.write_text(">a\n-MK.T-\n>b\nM-K*-\n--\n")
    with pytest.raises(
        InputError, match=r"line 2, column 1: record 'a', position 1 of its sequence: '-' is an alignment gap"
    ):
        records(gapped)
    assert records(gapped, residue_rule=ResidueRule(gaps="remove")) == [("a", "MKT", 1), ("b", "MK", 3)]
    with pytest.raises(ElmoFastError, match="fasta_stop must be one of drop, keep, refuse, got 'strip'"):
        ResidueRule(stop="strip")
    with pytest.raises(ElmoFastError, match="fasta_gaps must be one of refuse, remove, got 'keep'"):
        ResidueRule(gaps="keep")


def test_duplicate_ids_are_found_past_what_memory_holds(tmp_path, monkeypatch):
    """Ids outgrow memory into a scratch table beside the output (tiny here): a repeat is still found, with the
    line it was first seen on, and the scratch table is gone once the input is read (or refused)."""
    from elmo_fast.embedding import seen_ids

    monkeypatch.setattr(seen_ids, "MEMORY_ENTRIES", 8)
    recs = [(f"id{i}", "MK") for i in range(100)]
    p = write_fasta(tmp_path / "many.fasta", recs)
    out = tmp_path / "out" / "o.h5"
    out.parent.mkdir()
    made = []
    real = seen_ids.SeenKeys._spill
    monkeypatch.setattr(seen_ids.SeenKeys, "_spill", lambda self: (real(self), made.append(self.paths)))
    assert [r.key for r in read_fasta(p, scratch_beside=out)] == [k for k, _ in recs]
    # 12 spills of 8, merged four at a time: 1, 2, 3, then one run of 32 (and so on)
    assert [len(paths) for paths in made] == [1, 2, 3, 1, 2, 3, 4, 2, 3, 4, 5, 3]
    assert all(os.path.dirname(p) == str(out.parent) for paths in made for p in paths)
    assert os.listdir(out.parent) == []
    dup = write_fasta(tmp_path / "dup.fasta", recs + [("id3", "MK")])
    with pytest.raises(InputError, match=r"line 201: the id 'id3' was the id of line 7 too"):
        list(read_fasta(dup, scratch_beside=out))
    assert os.listdir(out.parent) == []


@pytest.mark.parametrize("chunk,block", [(4, 2), (7, 3), (1 << 16, 256)])
def test_seen_keys_in_memory_and_on_disk(tmp_path, monkeypatch, chunk, block):
    """SeenKeys answers the same whether a key is in memory or in runs on disk, merged (read a few entries at a
    time here, so that merges cross many chunk boundaries); nothing on disk below the bound; every merged run
    holds its runs' entries in key order."""
    import numpy as np

    from elmo_fast.embedding import seen_ids
    from elmo_fast.embedding.seen_ids import SeenKeys

    monkeypatch.setattr(seen_ids, "_CHUNK", chunk)
    monkeypatch.setattr(seen_ids, "_BLOCK", block)
    real_merge = SeenKeys._merge

    def merge(self, runs):
        merged = real_merge(self, runs)
        got = merged.read(0, merged.n)
        want = np.sort(np.concatenate([r.read(0, r.n) for r in runs]), order=["hi", "lo"])
        assert merged.n == sum(r.n for r in runs) and np.array_equal(got, want)
        assert np.array_equal(merged.fences, got["hi"][::block])
        return merged

    monkeypatch.setattr(SeenKeys, "_merge", merge)
    rng = random.Random(5)
    keys = [f"k{rng.randrange(2000)}" for _ in range(3000)]  # about a third seen before
    for entries in (4, 64, 10**6):
        seen, first = SeenKeys(tmp_path / "o.h5", memory_entries=entries), {}
        for i, key in enumerate(keys):
            assert seen.first_line(key, i) == first.get(key)
            first.setdefault(key, i)
        assert (not seen.paths) == (entries == 10**6)
        seen.close()
        assert os.listdir(tmp_path) == []


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


def test_batches_of_proteins_have_no_bound_on_records(model, tmp_path, monkeypatch):
    """--fasta cuts batches by padded residues (records x longest) alone, as seqvec cuts them by residues: many
    short proteins make one batch (text's 64 sentences would make three), unless batch_size is given."""
    from elmo_fast.embedding import batch_runner

    sizes = []
    real = batch_runner.BatchRunner.embed
    monkeypatch.setattr(batch_runner.BatchRunner, "embed", lambda self, b: (sizes.append(len(b)), real(self, b))[1])
    fasta = write_fasta(tmp_path / "short.fasta", [(f"p{i}", "MKTAYIAKQR") for i in range(150)])
    embedder = ElmoEmbedder(*model)
    assert embedder.batch_size == 64
    embedder.embed_file(fasta, tmp_path / "a.h5", "top", fasta=True, progress=False)
    assert sizes == [150]  # 1,500 residues: one batch
    sizes.clear()
    embedder.embed_file(fasta, tmp_path / "b.h5", "top", fasta=True, max_tokens_per_batch=1000, progress=False)
    assert sizes == [100, 50]
    sizes.clear()
    embedder.embed_file(fasta, tmp_path / "c.h5", "top", fasta=True, batch_size=64, progress=False)
    assert sizes == [64, 64, 22]
    sizes.clear()
    text = tmp_path / "short.txt"
    text.write_text("M K T A Y I A K Q R\n" * 150)
    embedder.embed_file(text, tmp_path / "d.h5", "top", progress=False)
    assert sizes == [64, 64, 22]  # text keeps the embedder's 64


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


def test_stops_and_gaps_on_the_command_line(model, proteins, tmp_path, capsys):
    """`--fasta` drops final stops by default and refuses gaps with one line naming the record and position;
    `--fasta-gaps remove` gives the unaligned file's output; `--fasta-stop keep` embeds '*' as a character."""
    plain = write_fasta(tmp_path / "plain.fasta", proteins[:6])
    marked = [(h, f"-{s[:1]}.{s[1:]}*") for h, s in proteins[:6]]
    gapped = write_fasta(tmp_path / "gapped.fasta", marked, width=7)
    flags = ["--all", "--options", str(model[0]), "--weights", str(model[1]), "--quiet"]
    assert main(["embed", "--fasta", str(plain), str(tmp_path / "plain.h5"), *flags]) == 0
    assert main(["embed", "--fasta", str(gapped), str(tmp_path / "refused.h5"), *flags]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        "\n" not in err and "record 'sp|P00000|PROT0_HUMAN', position 1 of its sequence: '-' is an alignment gap" in err
    )
    assert "--fasta-gaps remove" in err and not (tmp_path / "refused.h5").exists()
    out = tmp_path / "removed.h5"
    assert main(["embed", "--fasta", str(gapped), str(out), "--fasta-gaps", "remove", *flags]) == 0
    with h5py.File(tmp_path / "plain.h5", "r") as a, h5py.File(out, "r") as b:
        assert sorted(a) == sorted(b)
        for key in a:
            assert np.array_equal(a[key][...], b[key][...])
    kept = tmp_path / "kept.h5"
    args = ["embed", "--fasta", str(gapped), str(kept), "--fasta-gaps", "remove", "--fasta-stop", "keep", *flags]
    assert main(args) == 0
    embedder = ElmoEmbedder(*model)
    with h5py.File(kept, "r") as f:
        for header, seq in proteins[:6]:
            want = embedder.embed_sentence(list(seq) + ["*"])
            assert np.abs(f[header.split()[0]][...] - want).max() <= 1e-5


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
        (["--fasta-gaps", "remove"], "--fasta-gaps needs --fasta"),
        (["--fasta-stop", "keep"], "--fasta-stop needs --fasta"),
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
    r = cli_process.run(
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
