"""What `embed` takes as input and output, checked before the work: inputs that cannot be read twice
(stdin, a FIFO) are read once and never skip data on --resume; a line longer than --max-line-length is
an error naming it before memory runs out (/dev/zero included); the output's path is checked before
the model loads."""

from __future__ import annotations

import contextlib
import gc
import io
import json
import os
import random
import socket
import stat
import sys
import textwrap
import threading
import time
from pathlib import Path

import cli_process
import h5py
import pytest
from embed_runs import Killed, _kill_at, assert_same_output, random_sentences, write_lines
from repo_paths import REPO, SUPPORT
from sigkill_at import HOOK as KILL_HOOK

from elmo_fast import ElmoEmbedder, InputError
from elmo_fast.cli import main
from elmo_fast.embedding import input_guard, writers
from elmo_fast.embedding import progress as progress_bars

ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
ENV.pop(KILL_HOOK, None)
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this platform")


@pytest.fixture(scope="module")
def tiny(random_models):
    return random_models("tiny")


@pytest.fixture(scope="module")
def embedder(tiny):
    return ElmoEmbedder(*tiny, batch_size=4, token_cache_mb=0)


def cli(*args) -> tuple[int, str]:
    """`elmo-fast ARGS` in this process: (exit code, stderr)."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main([str(a) for a in args])
    return code, err.getvalue()


class Feeder:
    """Writes ``data`` into a FIFO once (as `<(...)` or a pipe gives its bytes once). A reader that
    opens the FIFO a second time finds no writer there: a watchdog then opens and closes it, so that
    such a reader sees an empty input instead of waiting forever."""

    def __init__(self, fifo: Path, data: bytes, watchdog: float = 30.0) -> None:
        self.fifo, self.data = fifo, data
        self.thread = threading.Thread(target=self._feed, daemon=True)
        self.thread.start()
        self.timer = threading.Timer(watchdog, self._unblock)
        self.timer.daemon = True

    def _feed(self) -> None:
        with open(self.fifo, "wb") as f:
            with contextlib.suppress(BrokenPipeError):
                f.write(self.data)
        self.timer.start()

    def _unblock(self) -> None:
        with contextlib.suppress(OSError):
            os.close(os.open(self.fifo, os.O_WRONLY | os.O_NONBLOCK))

    def close(self) -> None:
        self.thread.join(timeout=60)
        self.timer.cancel()


# --- inputs that cannot be read twice ----------------------------------------------------------------


def test_what_can_be_read_twice(tmp_path):
    regular = write_lines(tmp_path / "in.txt", ["a"])
    assert input_guard.rereadable(regular) and input_guard.rereadable(str(regular))
    assert input_guard.rereadable(tmp_path / "missing.txt")  # its reader says it is missing
    assert not input_guard.rereadable("-")
    assert not input_guard.rereadable(io.BytesIO(b"a\n"))  # a stream is the caller's, read once
    assert not input_guard.rereadable("/dev/null")  # a character device
    assert input_guard.kind_of("/dev/null") == "a character device"
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo")
        assert (
            not input_guard.rereadable(tmp_path / "fifo") and input_guard.kind_of(tmp_path / "fifo") == "a pipe (FIFO)"
        )
    if hasattr(socket, "AF_UNIX") and len(str(tmp_path / "sock")) < 100:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(tmp_path / "sock"))
            assert stat.S_ISSOCK(os.stat(tmp_path / "sock").st_mode)
            assert not input_guard.rereadable(tmp_path / "sock")


@needs_fifo
@pytest.mark.slow
def test_resume_from_a_fifo_reads_it_once_and_skips_nothing(embedder, tmp_path, monkeypatch):
    """A FIFO (as `<(zcat corpus.gz)` gives one) was opened twice by a resumed run: the second open
    lost what the first had read ahead, or waited forever for a writer."""
    sentences = random_sentences(random.Random(3), 30)
    data = "".join(s + "\n" for s in sentences).encode()
    embedder.embed_file(write_lines(tmp_path / "in.txt", sentences), tmp_path / "want.h5", window=7, progress=False)
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    out = tmp_path / "o.h5"
    feeder = Feeder(fifo, data)
    with monkeypatch.context() as m:  # stopped as by kill -9, two windows saved
        _kill_at(m, writers.ShardWriter, "record", 3)
        with pytest.raises(Killed):
            embedder.embed_file(fifo, out, window=7, progress=False, resume=True)
    gc.collect()  # the killed run's reader of the FIFO closes, as a killed process's would
    feeder.close()
    assert len(list((tmp_path / "o.h5.partial").glob("shard-*.h5"))) == 2
    feeder = Feeder(fifo, data)  # the same bytes again, once, as a rerun of the same command gives them
    stats = embedder.embed_file(fifo, out, window=7, progress=False, resume=True)
    feeder.close()
    assert stats["resumed_sentences"] == 14 and stats["sentences"] == 16
    assert_same_output(out, tmp_path / "want.h5", "resumed from a FIFO")
    # a FIFO whose lines changed under the saved windows is refused, naming them
    feeder = Feeder(fifo, data.replace(sentences[2].encode(), b"changed"))
    with monkeypatch.context() as m:
        _kill_at(m, writers.ShardWriter, "record", 2)
        with pytest.raises(Killed):
            embedder.embed_file(fifo, tmp_path / "p.h5", window=7, progress=False, resume=True)
    gc.collect()
    feeder.close()
    feeder = Feeder(fifo, data)
    with pytest.raises(InputError, match=r"in.fifo: lines 1\.\.7 are not those the interrupted run embedded"):
        embedder.embed_file(fifo, tmp_path / "p.h5", window=7, progress=False, resume=True)
    feeder.close()


@pytest.mark.slow
def test_resume_from_stdin_after_kill_9_skips_nothing(tiny, tmp_path):
    """`... | elmo-fast embed - OUT --resume`, SIGKILLed with two windows saved, then the same command
    again: the saved windows are checked against stdin's lines as they pass, the rest embedded."""
    sentences = random_sentences(random.Random(4), 40)
    inp = write_lines(tmp_path / "in.txt", sentences)
    flags = [
        "--all",
        "--options",
        str(tiny[0]),
        "--weights",
        str(tiny[1]),
        "--window",
        "8",
        "--batch-size",
        "4",
        "--quiet",
    ]
    assert cli("embed", inp, tmp_path / "want.h5", *flags)[0] == 0
    out = tmp_path / "o.h5"
    cmd = [sys.executable, str(SUPPORT / "sigkill_at.py"), "embed", "-", str(out), *flags, "--resume"]
    killed = cli_process.run(
        cmd,
        input=inp.read_bytes(),
        capture_output=True,
        timeout=300,
        env={**ENV, KILL_HOOK: f"0:window:2:{tmp_path / 'killed-once'}"},
    )
    assert killed.returncode == -9, killed.stderr.decode()
    assert sorted(p.name for p in (tmp_path / "o.h5.partial").glob("shard-*.h5")) == [
        "shard-000000.h5",
        "shard-000008.h5",
    ]
    resumed = cli_process.run(cmd, input=inp.read_bytes(), capture_output=True, timeout=300, env=ENV)
    assert resumed.returncode == 0, resumed.stderr.decode()
    assert_same_output(out, tmp_path / "want.h5", "resumed from stdin")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt", "killed-once", "o.h5", "want.h5"]


def test_a_finished_output_of_another_run_with_stdin_is_refused_with_what_to_do(embedder, tmp_path):
    """Checking a finished output reads the input; embedding it again would need a second pass."""
    out = tmp_path / "o.h5"
    embedder.embed_file(write_lines(tmp_path / "in.txt", ["a b", "c"]), out, progress=False, resume=True)
    read, write = os.pipe()
    os.write(write, b"a b\nc\nd\n")
    os.close(write)
    with (
        open(read, "rb") as stdin,
        pytest.raises(
            ValueError,
            match=r"was made by another run \(.*\), and \d+ cannot "
            r"be read twice; remove .*o.h5 to embed it",
        ),
    ):
        embedder.embed_file(stdin, out, progress=False, resume=True, overwrite=True)


# --- line length ---------------------------------------------------------------------------------------

_DEV_ZERO = textwrap.dedent("""
    import resource, sys, time
    from elmo_fast.embedding.lines import read_sentences

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024
    # a guard for a regression: an unbounded read fails at +1 GiB instead of taking the machine's memory
    resource.setrlimit(resource.RLIMIT_AS, (status("VmSize:") + (1 << 30), resource.RLIM_INFINITY))
    peak = status("VmHWM:")
    start = time.perf_counter()
    try:
        for line in read_sentences(sys.argv[1], max_line_length=int(sys.argv[2])):
            pass
        print("no error")
    except ValueError as e:
        print(f"{time.perf_counter() - start:.3f} {status('VmHWM:') - peak} {e}")
""")


@pytest.mark.skipif(
    not os.path.exists("/dev/zero") or not sys.platform.startswith("linux"),
    reason="needs /dev/zero and /proc/self/status (Linux)",
)
@pytest.mark.parametrize("limit", [1_000_000, 10_000_000])
@pytest.mark.slow
def test_dev_zero_is_an_error_naming_the_line_fast_and_in_little_memory(limit):
    r = cli_process.run(
        [sys.executable, "-c", _DEV_ZERO, "/dev/zero", str(limit)], capture_output=True, text=True, timeout=120, env=ENV
    )
    assert r.returncode == 0, r.stderr
    seconds, grown, message = r.stdout.strip().split(" ", 2)
    assert message == (
        f"/dev/zero: line 1 is longer than {limit:,} characters (one line holds one sentence; is this "
        f"the right file?); pass a larger max_line_length if it is meant"
    )
    assert float(seconds) < 2.0, r.stdout  # measured ~0.01 s (1 M) and ~0.1 s (10 M) on an idle machine
    assert int(grown) < 20 * limit + (64 << 20), r.stdout  # a few bytes a character, not the line's unbounded growth


@needs_fifo
def test_an_endless_line_from_a_fifo_stops_the_cli_with_its_line_number(tiny, tmp_path):
    fifo = tmp_path / "in.fifo"
    os.mkfifo(fifo)
    stop = threading.Event()

    def endless():  # two sentences, then a line that never ends (bounded at 256 MB, in case a regression reads it)
        with contextlib.suppress(BrokenPipeError), open(fifo, "wb") as f:
            f.write(b"a b\nc d e\n")
            chunk = b"x" * (1 << 20)
            for _ in range(256):
                if stop.is_set():
                    return
                f.write(chunk)

    feeder = threading.Thread(target=endless, daemon=True)
    feeder.start()
    start = time.perf_counter()
    code, err = cli(
        "embed",
        fifo,
        tmp_path / "o.h5",
        "--all",
        "--options",
        tiny[0],
        "--weights",
        tiny[1],
        "--max-line-length",
        "100000",
        "--quiet",
    )
    elapsed = time.perf_counter() - start
    stop.set()
    feeder.join(timeout=60)
    assert code == 2, err
    assert err.strip() == (
        f"elmo-fast: error: {fifo}: line 3 is longer than 100,000 characters (one line holds one "
        f"sentence; is this the right file?); pass a larger --max-line-length if it is meant"
    )
    assert elapsed < 10, elapsed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.fifo"]


def test_the_line_length_limit_counts_characters_without_the_line_end(embedder, tmp_path):
    limit = 50
    ok = ["é" * limit, "a " * (limit // 2)]  # 50 characters (100 bytes), and 50 with a trailing space
    for newline in ("\n", "\r\n"):
        inp = write_lines(tmp_path / "in.txt", ok, newline)
        assert embedder.embed_file(inp, tmp_path / "o.h5", progress=False, max_line_length=limit)["sentences"] == 2
    inp = write_lines(tmp_path / "in.txt", ok + ["b" * (limit + 1)])
    with pytest.raises(InputError, match=r"in.txt: line 3 is longer than 50 characters"):
        embedder.embed_file(inp, tmp_path / "o.h5", progress=False, max_line_length=limit)
    (tmp_path / "last.txt").write_text("a\n" + "b" * (limit + 1))  # the last line, without a line end
    with pytest.raises(InputError, match=r"last.txt: line 2 is longer"):
        embedder.embed_file(tmp_path / "last.txt", tmp_path / "o.h5", progress=False, max_line_length=limit)
    assert embedder.embed_file(inp, tmp_path / "o.h5", progress=False, max_line_length=None)["sentences"] == 3
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match="max_line_length must be an integer >= 1"):
            embedder.embed_file(inp, tmp_path / "o.h5", progress=False, max_line_length=bad)


def test_the_progress_count_gives_up_on_a_line_over_the_limit(tmp_path):
    long = tmp_path / "long.txt"
    long.write_bytes(b"a b\n" + b"x" * 3_000_000 + b"\nc\n")  # longer than the count's 1 MB reads
    assert progress_bars.TokenCount(str(long), max_line_length=10_000).wait(timeout=30) is None
    assert progress_bars.TokenCount(str(long), tokenize=True, max_line_length=10_000).wait(timeout=30) is None
    assert progress_bars.TokenCount(str(long), max_line_length=5_000_000).wait(timeout=30) == 4


# --- the output's path ---------------------------------------------------------------------------------


@pytest.mark.parametrize("resume", [False, True])
def test_an_output_name_of_any_legal_length_is_written(tiny, tmp_path, resume):
    """250 bytes (NAME_MAX is 255): the temporary names, the lock and the work area beside it are
    shortened to fit, and nothing of theirs stays."""
    inp = write_lines(tmp_path / "in.txt", ["a b", "c d e"])
    out = tmp_path / ("z" * 247 + ".h5")
    code, err = cli(
        "embed",
        inp,
        out,
        "--all",
        "--options",
        tiny[0],
        "--weights",
        tiny[1],
        "--quiet",
        *(["--resume"] if resume else []),
        "--use-sentence-keys",
    )
    assert code == 0, err
    with h5py.File(out, "r") as f:
        assert f["a b"].shape[1] == 2 and f["c d e"].shape[1] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["in.txt", out.name])


def test_an_output_name_too_long_fails_before_the_model_loads(tiny, tmp_path, monkeypatch):
    from elmo_fast.embedding import embedder as embedder_module

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded before the output's path was checked")

    monkeypatch.setattr(embedder_module.ElmoEmbedder, "__init__", no_model)
    inp = write_lines(tmp_path / "in.txt", ["a b"])
    name_max = os.pathconf(tmp_path, "PC_NAME_MAX")
    for name in ("x" * 300 + ".h5", "y" * (name_max - 2) + ".h5"):  # too long; one byte too long
        out = tmp_path / name
        code, err = cli("embed", inp, out, "--all", "--options", tiny[0], "--weights", tiny[1])  # no_model: no load
        assert code == 2, err
        assert err.count("\n") == 1 and err.startswith(f"elmo-fast: error: cannot write {out}: file name too long ("), (
            err
        )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]
    code, err = cli("embed", inp, tmp_path, "--all", "--options", tiny[0], "--weights", tiny[1])
    assert code == 2 and err == f"elmo-fast: error: cannot write {tmp_path}: the output is a folder\n", err
    code, err = cli("embed", inp, tmp_path / "missing" / "o.h5", "--all", "--options", tiny[0], "--weights", tiny[1])
    assert code == 2 and err == (
        f"elmo-fast: error: cannot write {tmp_path / 'missing' / 'o.h5'}: its folder "
        f"{tmp_path / 'missing'} does not exist\n"
    ), err
    if os.geteuid() != 0:  # root writes anywhere
        ro = tmp_path / "ro"
        ro.mkdir()
        ro.chmod(0o500)
        code, err = cli("embed", inp, ro / "o.h5", "--all", "--options", tiny[0], "--weights", tiny[1])
        assert code == 2 and "Permission denied (EACCES)" in err, err


# --- line ends ---------------------------------------------------------------------------------------

# a lone "\r", and what Python's universal newlines and str.splitlines() also break at, inside lines
LINE_END_CASES = b"first\rstill first\nsecond\r\nthird\x0bstill\xe2\x80\xa8third\x1cand\xc2\x85on\n"


@pytest.mark.parametrize("source", ["path", "binary stream", "gzip"])
def test_lines_end_at_newline_only(embedder, tmp_path, source):
    """Lines end at "\\n" (and "\\r\\n") only, as `wc -l` counts them: a lone carriage return (or a
    vertical tab, U+2028, U+001C, U+0085) is a character of its line, here whitespace between tokens."""
    import gzip

    path = tmp_path / "in.txt"
    path.write_bytes(gzip.compress(LINE_END_CASES) if source == "gzip" else LINE_END_CASES)
    assert LINE_END_CASES.count(b"\n") == 3
    out = tmp_path / "o.h5"
    given = path if source != "binary stream" else io.BytesIO(LINE_END_CASES)
    embedder.embed_file(given, out, output_format="top", progress=False)
    with h5py.File(out, "r") as f:
        index = json.loads(f["sentence_to_index"][0])
        assert index == {"first\rstill first": "0", "second": "1", "third\x0bstill\u2028third\x1cand\x85on": "2"}
        assert [f[k].shape[0] for k in ("0", "1", "2")] == [3, 1, 5]  # tokens: str.split's whitespace


def test_a_line_of_exactly_the_limit_ended_by_crlf_is_read(embedder, tmp_path):
    path = tmp_path / "in.txt"
    path.write_bytes(b"abcd e\r\nfgh\r\n")
    embedder.embed_file(path, tmp_path / "o.h5", progress=False, max_line_length=6)
    with pytest.raises(InputError, match=r"in.txt: line 1 is longer than 5 characters"):
        embedder.embed_file(path, tmp_path / "p.h5", progress=False, max_line_length=5)
