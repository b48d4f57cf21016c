"""scripts/build_corpus.py: the pure parts (markup stripping per source, filters, dedup, split,
determinism), on small inline samples; CI machines do not have the Debian packages installed."""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys

import pytest
from repo_paths import REPO as ROOT

_spec = importlib.util.spec_from_file_location("build_corpus", ROOT / "scripts" / "build_corpus.py")
bc = importlib.util.module_from_spec(_spec)
sys.modules["build_corpus"] = bc
_spec.loader.exec_module(bc)


# ---- dictionaries ---------------------------------------------------------------------------------

GCIDE_BATHE = r"""Bathe \Bathe\ (b[=a][th]), v. t. [imp. & p. p. {Bathed}; p.
   pr. & vb. n. {Bathing}.] [AS. ba[eth]ian, fr. b[ae][eth]
   bath.]
   1. To wash by immersion, as in a bath; to subject to a bath.
      [1913 Webster]

            Chancing to bathe himself in the river Cydnus. --South.
      [1913 Webster]

   2. To lave; to wet. "The bright sunshine bathing all the world." --Longfellow.
      [1913 Webster]

   Syn: wash, lave.
        [WordNet 1.5]

   Note: Bathing is usually done in water; the word came from Littr['e].
         [1913 Webster] Bather

   {Bath"ing machine}, a small room on wheels. (Naut.) It is used at the
      seaside. --Sir
                                                  W. Scott.
      [1913 Webster]
"""


def test_gcide_paragraphs_strip_markup():
    paras = bc.gcide_paragraphs(GCIDE_BATHE)
    assert paras == [
        "To wash by immersion, as in a bath; to subject to a bath.",
        "Chancing to bathe himself in the river Cydnus.",
        'To lave; to wet. "The bright sunshine bathing all the world."',
        "Bathing is usually done in water; the word came from Littré.",
        "Bathing machine, a small room on wheels. It is used at the seaside.",
    ]
    text = " ".join(paras)
    for junk in (
        "[",
        "]",
        "\\",
        "{",
        "}",
        "Webster",
        "WordNet",
        "--",
        "South",
        "Longfellow",
        "Scott",
        "Syn",
        "Bather",
        "Naut",
    ):
        assert junk not in text


def test_gcide_decode_accents():
    assert bc._gcide_decode("Littr['e] na[:i]ve [ae]on fa[,c]ade") == "Littré naïve æon façade"


def test_entry_headword():
    assert bc.entry_headword(GCIDE_BATHE) == "bathe"
    assert bc.entry_headword("no headword here") is None


def test_devil_jargon_foldoc_paragraphs():
    devil = (
        "FORK, n.  An instrument used chiefly for the purpose of putting dead\nanimals into the mouth.\n\n"
        "    When Adam long ago in Cupid's awful court\n        Sued for _Eve's_ favor.\n"
        "                                                                  G.J.\n"
    )
    assert bc.devil_paragraphs(devil) == [
        "An instrument used chiefly for the purpose of putting dead animals into the mouth.",
        "When Adam long ago in Cupid's awful court Sued for Eve's favor.",
    ]
    jargon = (
        "crawling horror\n n.\n\n    Ancient crufty hardware. Like {dusty deck} or {\n    gonkulator}.\n\n"
        "    [Vancouver area] A problem.\n"
    )
    assert bc.jargon_paragraphs(jargon) == ["Ancient crufty hardware. Like dusty deck or gonkulator.", "A problem."]
    foldoc = (
        "computron\n\n   <jargon> /kom'pyoo-tron\"/ 1. A notional unit of {computing\n   power}.\n\n"
        "   [{Jargon File}]\n\n   {(http://compuware.com/)}.\n\n   (2013-03-02)\n"
    )
    assert bc.foldoc_paragraphs(foldoc) == ["A notional unit of computing power."]


def test_dict_entries_reads_dictd_files(tmp_path):
    body = "00-database-info\nabout\nalpha\n  First letter.\nbeta\n  Second letter.\n"
    (tmp_path / "x.dict.dz").write_bytes(gzip.compress(body.encode()))

    def b64(n):
        digits = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
        s = ""
        while True:
            s = digits[n % 64] + s
            n //= 64
            if n == 0:
                return s

    i_a, i_b = body.index("alpha"), body.index("beta")
    index = (
        f"00-database-info\t{b64(0)}\t{b64(i_a)}\nalpha\t{b64(i_a)}\t{b64(i_b - i_a)}\n"
        f"alfa\t{b64(i_a)}\t{b64(i_b - i_a)}\nbeta\t{b64(i_b)}\t{b64(len(body) - i_b)}\n"
    )
    (tmp_path / "x.index").write_text(index)
    got = list(bc.dict_entries(tmp_path / "x.index", tmp_path / "x.dict.dz"))
    assert got == [("alpha", "alpha\n  First letter.\n"), ("beta", "beta\n  Second letter.\n")]


def test_wordnet_synset():
    line = (
        "02084071 05 n 02 dog 0 domestic_dog 0 001 @ 02083346 n 0000 | a member of the genus Canis; "
        '"the dog barked all night"; "a friendly dog"  \n'
    )
    assert bc.wordnet_synset(line) == (
        "dog",
        ["A member of the genus Canis.", "The dog barked all night.", "A friendly dog."],
    )
    assert bc.wordnet_synset("  1 This software and database is being provided\n") is None
    assert bc.wordnet_synset("00001 00 a 01 able(a) 0 000 | (usually followed by `to') having ability")[0] == "able"


def test_bible_chapters():
    text = (
        "\nGenesis 1\n\n  1 In the beginning God created the heaven\nand the earth.\n  2 And it was so.\n\n"
        "1 Kings 2\n\n  1 Now the days drew nigh.\n"
    )
    assert list(bc.bible_chapters(text)) == [
        ("Genesis 1", "In the beginning God created the heaven and the earth. And it was so."),
        ("1 Kings 2", "Now the days drew nigh."),
    ]


def test_fortune_entries():
    text = (
        "Live in a world of your own.\n%\nA fool and his money\nare soon parted.\n"
        "\t\t-- Thomas Tusser\n%\nTo err is human.\n                        Alexander Pope\n%\n"
    )
    assert bc.fortune_entries(text) == [
        "Live in a world of your own.",
        "A fool and his money are soon parted.",
        "To err is human.",
    ]


# ---- HTML and POD ---------------------------------------------------------------------------------

HTML = """<html><head><title>Title</title><style>p {}</style></head><body>
<div class="sphinxsidebar"><p>Navigation text.</p></div>
<div role="navigation"><a href="x">Next</a></div>
<h1>Heading<a class="headerlink" href="#h">\u00b6</a></h1>
<p>The <code class="docutils literal"><span class="pre">open()</span></code> function opens a file.
It returns a <em>file object</em>.</p>
<div class="highlight-python3"><div class="highlight"><pre>f = open("x")</pre></div></div>
<table><tr><td>Cell text.</td></tr></table>
<dl class="c function"><dt>int foo(void)</dt><dd><p>Kernel-doc text.</p></dd></dl>
<dl><dt>term</dt><dd>A definition of the term.<br>Second line.</dd></dl>
<ul><li><p>First item.</p></li><li>Second &amp; last item.</li></ul>
<div class="para">Publican paragraph.</div>
<script>var x = "<p>no</p>";</script>
</body></html>"""


def test_html_paragraphs():
    assert bc.html_paragraphs(HTML) == [
        "The open() function opens a file. It returns a file object.",
        "A definition of the term.",
        "Second line.",
        "First item.",
        "Second & last item.",
        "Publican paragraph.",
    ]


POD = """=head1 NAME

perlfoo - a C<sample> document

=head1 DESCRIPTION

Perl's B<bless> turns a reference into an object; see L<perlobj>
and L<the manual|perlfunc/bless>, or C<< $a <=> $b >>E<gt> 0.

    my $obj = bless {}, $class;   # verbatim: dropped

=over 4

=item *

Short.

=item * Each item that is long enough is kept as prose.

=back

=begin html

<p>Dropped.</p>

=end html

=cut

sub code { 1 }
"""


def test_pod_paragraphs():
    assert bc.pod_paragraphs(POD) == [
        "perlfoo - a sample document",
        "Perl's bless turns a reference into an object; see perlobj and the manual, or $a <=> $b> 0.",
        "Short.",
        "Each item that is long enough is kept as prose.",
    ]


# ---- sentence filter ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sentence,keep",
    [
        ("The cat sat on the mat.", True),
        ("To wash by immersion, as in a bath.", True),
        ('He said, "It is done."', True),
        ("Use the dpkg command as follows:", True),
        ("Where is it?", True),
        ("the lower-case start of a fragment.", False),
        ("Parameters and description", False),  # no terminal punctuation: a heading
        ("x = foo(bar_baz, {1: 2}) + qux[3]", False),
        ("Call os.path.join() and sys.path.insert() and os.getcwd().", False),
        ("THIS IS ALL SHOUTING IN CAPITALS.", False),
        ("Москва — столица России и крупный город.", False),
        ("12 34 56 78 90 11.", False),
        ("Ok.", False),  # too short
        ("A " + "very " * 120 + "long sentence.", False),
    ],
)
def test_sentence_tokens_filter(sentence, keep):
    assert (bc.sentence_tokens(sentence) is not None) == keep


def test_sentence_tokens_are_tokenized():
    assert bc.sentence_tokens("John's dog doesn't bark.") == ["John", "'s", "dog", "does", "n't", "bark", "."]


def test_sentence_tokens_ascii_quotes():
    assert bc.sentence_tokens("\u201cJohn\u2019s dog isn\u2019t here,\u201d she said.") == [
        '"',
        "John",
        "'s",
        "dog",
        "is",
        "n't",
        "here",
        ",",
        '"',
        "she",
        "said",
        ".",
    ]


def test_sentence_tokens_allows_a_path_not_code():
    assert bc.sentence_tokens("The main configuration is in the /etc/dirvish/master.conf file.")
    assert bc.sentence_tokens("Copy /etc/a/b to /usr/c/d and /var/e/f then.") is None


# ---- split, dedup, determinism ------------------------------------------------------------------


def test_heldout_group_is_stable_and_about_the_share():
    groups = [f"lex:word{i}" for i in range(20000)]
    held = [g for g in groups if bc.heldout_group(g, 15)]
    assert 0.01 < len(held) / len(groups) < 0.02
    assert held == [g for g in groups if bc.heldout_group(g, 15)]
    assert not any(bc.heldout_group(g, 0) for g in groups[:1000])


def _fake_sources(monkeypatch, docs_a, docs_b):
    def mk(name, docs):
        return bc.Source(
            name, "pkg-" + name, "public domain", "test source " + name, lambda: {"files": []}, lambda paths: iter(docs)
        )

    sources = [mk("a", docs_a), mk("b", docs_b)]
    monkeypatch.setattr(bc, "SOURCES", sources)
    monkeypatch.setattr(bc, "SOURCE_BY_NAME", {s.name: s for s in sources})
    monkeypatch.setattr(bc, "package_version", lambda p: "1.0")


DOCS_A = [
    bc.Doc(
        f"lex:w{i}", [f"Sentence number {i} is here. The cat sat on mat {i % 7}.", "A shared sentence in every entry."]
    )
    for i in range(300)
]
DOCS_B = [
    bc.Doc(f"file:f{i}", [f"Another source says {i} things. Short.", "A shared sentence in every entry."])
    for i in range(50)
]


def test_build_dedups_splits_and_is_deterministic(tmp_path, monkeypatch):
    _fake_sources(monkeypatch, DOCS_A, DOCS_B)
    r1 = bc.build(tmp_path / "one", permille=100, log=lambda m: None)
    r2 = bc.build(tmp_path / "two", permille=100, log=lambda m: None)
    for name in ("train.txt", "heldout.txt", "stats.json", "SOURCES.md"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes(), name
    assert r1 == r2
    train = (tmp_path / "one" / "train.txt").read_text().splitlines()
    held = (tmp_path / "one" / "heldout.txt").read_text().splitlines()
    everything = train + held
    assert len(everything) == len(set(everything)), "exact duplicates removed"
    assert not set(train) & set(held)
    assert "A shared sentence in every entry ." in train  # seen on both sides: train only
    assert "Short ." not in everything  # 2 tokens: dropped
    assert "The cat sat on mat 3 ." in everything  # duplicates of it across entries kept once
    assert sum(1 for s in everything if s.startswith("The cat sat on mat")) == 7
    # held-out sentences come whole from held-out groups
    held_groups = {d.group for d in DOCS_A + DOCS_B if bc.heldout_group(d.group, 100)}
    assert held_groups and len(held) > 0
    for s in held:
        assert any(f" {g[len('lex:w') :]} " in f" {s} " or f" {g[len('file:f') :]} " in f" {s} " for g in held_groups)
    stats = json.loads((tmp_path / "one" / "stats.json").read_text())
    assert stats["totals"]["sentences"] == len(everything)
    assert stats["files"]["train.txt"]["sentences"] == len(train)
    assert {s["name"] for s in stats["sources"]} == {"a", "b"}
    assert sum(s["sentences"] for s in stats["sources"]) == len(everything)
    assert stats["vocabulary"]["size_min_count"]["1"] >= stats["vocabulary"]["size_min_count"]["5"]
    assert stats["vocabulary"]["most_frequent"][0][0] in (".", "is", "A")


def test_build_shuffle_depends_on_seed_only(tmp_path, monkeypatch):
    _fake_sources(monkeypatch, DOCS_A, DOCS_B)
    bc.build(tmp_path / "s1", seed=1, log=lambda m: None)
    bc.build(tmp_path / "s2", seed=2, log=lambda m: None)
    t1 = (tmp_path / "s1" / "train.txt").read_text().splitlines()
    t2 = (tmp_path / "s2" / "train.txt").read_text().splitlines()
    assert t1 != t2 and sorted(t1) == sorted(t2)


def test_limit_per_source(tmp_path, monkeypatch):
    _fake_sources(monkeypatch, DOCS_A, DOCS_B)
    res = bc.build(tmp_path / "lim", limit=5, permille=0, log=lambda m: None)
    assert [s["documents"] for s in res["sources"]] == [5, 5]


def test_missing_package_is_one_line_error(tmp_path, monkeypatch, capsys):
    missing = bc.Source(
        "gone",
        "dict-nothing",
        "x",
        "x",
        lambda: {"index": bc._need(tmp_path / "nope", "dict-nothing")},
        lambda p: iter(()),
    )
    monkeypatch.setattr(bc, "SOURCES", [missing])
    monkeypatch.setattr(bc, "SOURCE_BY_NAME", {"gone": missing})
    assert bc.main(["--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "dict-nothing" in err and "apt-get install" in err


def test_doctests():
    import doctest

    failures, tests = doctest.testmod(bc)
    assert tests >= 3 and failures == 0


def test_the_terms_footer_is_true_of_the_sources_it_was_built_from():
    permissive = bc._licence_footer(list(bc.PERMISSIVE_SOURCES))
    assert "each permissive or public domain" in permissive and "GPL" not in permissive
    mixed = bc._licence_footer(["wordnet", "gcide", "foldoc"])
    assert "gcide, foldoc are GPL or GFDL" in mixed and "wordnet" not in mixed
