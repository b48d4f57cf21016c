"""``elmo-fast random-model``, ``models`` and ``demo``: models to test with, models by name, and
what contextual vectors do."""

from __future__ import annotations

import argparse
import os
import sys

from .common import param_flags


def _random_model(args: argparse.Namespace) -> int:
    from ..durable import check_writable, make_dirs
    from ..errors import ElmoFastError
    from ..formats.random_models import random_model

    if os.path.exists(args.directory) and not os.path.isdir(args.directory):
        raise ElmoFastError(f"{args.directory} is a file; give the directory to write options.json and weights.hdf5 in")
    if not args.overwrite:
        for name in ("options.json", "weights.hdf5"):
            path = os.path.join(args.directory, name)
            if os.path.lexists(path):  # it may be a real model's: never replaced unasked
                raise ElmoFastError(f"{path} already exists; pass --overwrite to replace it")
    make_dirs(args.directory, "model directory")  # before the weights are drawn: a bad path fails now
    for name in ("options.json", "weights.hdf5"):
        check_writable(os.path.join(args.directory, name), name)
    options, weights = random_model(args.preset, args.directory, seed=args.seed, exercise_clips=args.exercise_clips)
    print(f"wrote {options} and {weights}", file=sys.stderr)
    print(
        "WARNING: these weights are RANDOM: the vectors they give mean nothing. Use them to test and "
        "benchmark elmo-fast, not to embed text.",
        file=sys.stderr,
    )
    return 0


def _models(args: argparse.Namespace) -> int:
    from ..pretrained import MODEL_DESCRIPTIONS, cache_dir

    for name, text in MODEL_DESCRIPTIONS.items():
        print(f"{name:15s} {text}")
    print("hf:OWNER/REPO[@REVISION][/SUBFOLDER]  a model on the Hugging Face Hub (the [hub] extra)")
    print("URL#sha256=HEX  a folder on a web server holding options.json and weights.hdf5, the weights pinned")
    print(f"cache: {cache_dir()} (set ELMO_FAST_CACHE to move it; elmo-fast models list shows what it holds)")
    return 0


def _when(t: float | None) -> str:
    import time

    return "never" if t is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _source(source: dict) -> str:
    kind = source.get("kind")
    if kind == "s3":
        return f"S3 ({source.get('base_url')})"
    if kind == "hub":
        sub = f", folder {source['subfolder']}" if source.get("subfolder") else ""
        return (
            f"Hugging Face Hub {source.get('repo')} at {source.get('revision')} "
            f"(commit {source.get('commit')}{sub}; {source.get('endpoint')})"
        )
    if kind == "url":
        return f"URL {source.get('url')} (weights pinned by SHA-256)"
    if kind == "bundled":
        return "bundled in the package"
    return str(source)


def _cached_models(cache) -> list[dict]:
    """Every model this install can load without a download: the bundled one, each recorded model, and
    official models whose files were put in the cache before records were kept."""
    from ..errors import ElmoFastError
    from ..file_hash import hash_file
    from ..pretrained import MODELS, bundled_model
    from ..pretrained.official import cached_files
    from ..pretrained.records import all_records

    out = []
    files = bundled_model()
    out.append(
        {
            "name": "default",
            "source": {"kind": "bundled"},
            "files": [
                {"role": role, "path": str(p), "size": size, "sha256": sha}
                for role, p in (("options", files.options), ("weights", files.weights))
                for size, sha in [hash_file(p)]
            ],
            "recorded": None,
            "verified": None,
        }
    )
    recorded = set()
    try:
        records = list(all_records(cache))
    except ElmoFastError as e:
        records = []
        out.append({"name": "?", "error": str(e)})
    for r in records:
        recorded.add(r.folder)
        out.append(
            {
                "name": r.spec,
                "source": r.source,
                "layout": r.layout,
                "folder": str(r.folder),
                "files": [
                    {
                        "role": f.role,
                        "path": str(r.file_path(f)),
                        "size": f.size,
                        "sha256": f.sha256,
                        "origin": f.origin,
                    }
                    for f in r.files
                ],
                "recorded": r.recorded,
                "verified": r.verified,
            }
        )
    for name in MODELS:
        options, weights = cached_files(name, cache)
        if options.parent not in recorded and (options.is_file() or weights.is_file()):
            out.append(
                {
                    "name": name,
                    "source": {"kind": "s3"},
                    "files": [
                        {"role": "?", "path": str(p), "size": p.stat().st_size}
                        for p in (options, weights)
                        if p.is_file()
                    ],
                    "note": f"no record yet (kept before records were); `elmo-fast models verify {name}` records it",
                }
            )
    return out


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _list(args: argparse.Namespace) -> int:
    import json

    from ..pretrained import cache_dir

    models = _cached_models(cache_dir())
    if args.json:
        print(json.dumps({"cache": str(cache_dir()), "models": models}, indent=2))
        return 0
    print(f"cache: {cache_dir()}")
    for m in models:
        if "error" in m:
            print(f"\n(unreadable record) {m['error']}")
            continue
        print(f"\n{m['name']}  {_source(m['source'])}")
        if "note" in m:
            print(f"  {m['note']}")
        else:
            print(
                f"  fetched {_when(m['recorded'])}, last verified {_when(m['verified'])}"
                if m["recorded"]
                else "  in the package"
            )
        for f in m["files"]:
            digest = f"sha256 {f['sha256']}" if "sha256" in f else ""
            print(f"  {f['role']:8s} {_size(f['size']):>9s}  {digest}  {f['path']}")
    return 0


def _matches(record, name: str) -> bool:
    return record.spec == name or record.spec.split("#", 1)[0] == name


def _verify(args: argparse.Namespace) -> int:
    from ..errors import ElmoFastError
    from ..pretrained import MODELS, cache_dir, fetch
    from ..pretrained.official import cached_files
    from ..pretrained.records import all_records, verify

    cache = cache_dir()
    records = [r for r in all_records(cache) if args.name is None or _matches(r, args.name)]
    recorded = {r.folder for r in records}
    legacy = [
        n
        for n in MODELS
        if (args.name is None or args.name == n)
        and cached_files(n, cache)[0].parent not in recorded
        and all(p.is_file() for p in cached_files(n, cache))
    ]
    if not records and not legacy:
        if args.name is not None:
            raise ElmoFastError(
                f"no model {args.name!r} in the cache ({cache}); `elmo-fast models list` shows what it holds"
            )
        print(f"elmo-fast: no model in the cache ({cache}) to verify", file=sys.stderr)
        return 0
    failed = 0
    for r in records:
        try:
            verify(r)
            print(f"ok  {r.spec}: {len(r.files)} files, sizes and SHA-256 as recorded")
        except ElmoFastError as e:
            failed += 1
            print(f"elmo-fast: error: {e}", file=sys.stderr)
    for name in legacy:  # files from before records were kept: recorded now, as they are
        fetch(name, progress=False)
        print(f"ok  {name}: recorded now (its files were in the cache before records were kept)")
    return 1 if failed else 0


def _fetch(args: argparse.Namespace) -> int:
    from ..pretrained import fetch

    local = fetch(args.name, progress=not args.quiet, force=args.force)
    for role, path in local.files.items():
        print(f"{role}\t{path}")
    return 0


#: the classic check of contextual vectors: the two money "bank"s should be closer to each other
#: than either is to the river "bank", at the LSTM layers; layer 0 gives every "bank" one vector
BANK_SENTENCES = (
    ("The bank is closed on Sundays .", 1),
    ("That bank was robbed recently .", 1),
    ("Can you see that nice swan at the river bank ?", 9),
)


def bank_distances(embedder) -> list[dict[str, float]]:
    """Per layer, the cosine distances between the three "bank"s of :data:`BANK_SENTENCES`."""
    import numpy as np

    vectors = [embedder.embed_sentence(text.split())[:, i] for text, i in BANK_SENTENCES]  # each [L + 1, D]

    def cosine_distance(a, b):
        return float(1.0 - np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    return [
        {
            "money-money": cosine_distance(vectors[0][k], vectors[1][k]),
            "money1-river": cosine_distance(vectors[0][k], vectors[2][k]),
            "money2-river": cosine_distance(vectors[1][k], vectors[2][k]),
        }
        for k in range(vectors[0].shape[0])
    ]


def _demo(args: argparse.Namespace) -> int:
    from ..embedding.embedder import ElmoEmbedder

    if args.model_dir:
        from ..formats.model_dir import model_dir_files

        files = model_dir_files(args.model_dir)
        embedder, name = ElmoEmbedder(*files), args.model_dir
    else:
        from ..pretrained import BUNDLED_NAME, bundled_model

        files = bundled_model()
        embedder, name = ElmoEmbedder(files.options, files.weights), f"the bundled model '{BUNDLED_NAME}'"
    print(f"cosine distance between the vectors of 'bank' ({name}):")
    for i, (text, _) in enumerate(BANK_SENTENCES, start=1):
        print(f"  {i}. {text}")
    print(f"  {'layer':<8}{'1 vs 2 (both money)':>22}{'1 vs 3 (river)':>17}{'2 vs 3 (river)':>17}")
    for k, d in enumerate(bank_distances(embedder)):
        ok = (
            "  <- context: money banks closer"
            if k > 0 and d["money-money"] < min(d["money1-river"], d["money2-river"])
            else ("  (context-free: one vector per word)" if k == 0 else "")
        )
        print(f"  {k:<8}{d['money-money']:>22.3f}{d['money1-river']:>17.3f}{d['money2-river']:>17.3f}{ok}")
    return 0


def add_parsers(sub) -> None:
    from ..formats.random_models import PRESETS

    p = sub.add_parser("random-model", help="write a model with RANDOM weights (for tests and benchmarks)")
    p.add_argument("preset", choices=list(PRESETS), help="shapes: " + ", ".join(PRESETS))
    p.add_argument("directory", help="where to write options.json and weights.hdf5")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exercise-clips", action="store_true", help="scale the LSTM so that the +-3 clips are hit")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="replace options.json and weights.hdf5 if DIR holds them (default: refuse)",
    )
    p.set_defaults(func=_random_model, outcome=lambda args: f"no half-written file is left in {args.directory}")

    p = sub.add_parser(
        "models",
        help="the models --model accepts; `models list`, `verify`, `fetch`: the cache of fetched models",
        description="Without a subcommand: the names --model accepts. list: the models in the cache (source, "
        "files, sizes, SHA-256, last verified); verify: check every cached file's SHA-256 against its record; "
        "fetch: fetch a model into the cache (--force: again).",
    )
    p.set_defaults(func=_models)
    actions = p.add_subparsers(dest="action")
    q = actions.add_parser("list", help="the models in the cache: source, files, sizes, digests, last verified")
    q.add_argument("--json", action="store_true", help="one JSON object")
    q.set_defaults(func=_list)
    q = actions.add_parser("verify", help="check the cached files' SHA-256 against their records")
    q.add_argument("name", nargs="?", metavar="NAME", help="one model, as --model names it (default: all of them)")
    q.set_defaults(func=_verify)
    q = actions.add_parser("fetch", help="fetch a model into the cache and print its files")
    q.add_argument("name", metavar="NAME", help="as --model names it")
    q.add_argument("--force", action="store_true", help="download its files again, even if cached")
    q.add_argument("--quiet", action="store_true", help="no progress bar")
    q.set_defaults(func=_fetch)

    p = sub.add_parser("demo", help="show contextual vectors at work: 'bank' in three sentences, per layer")
    p.add_argument("--model-dir", help="a model directory (default: the bundled model)")
    p.set_defaults(func=_demo, flags=param_flags(p))
