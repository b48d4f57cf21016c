"""``elmo-fast calibration show|clear|refresh``: the CPU kernels' choices this machine measured and stored
(:mod:`elmo_fast.tuning`), their keys and margins; removing them; measuring one model's again. Also the
lines ``doctor`` prints about them (:func:`record_lines`)."""

from __future__ import annotations

import argparse
import json
import sys


def record_lines(record, indent: str = "  ") -> list[str]:
    """A stored calibration in a few lines: its key, the choice, its margin and what it rests on."""
    from ..tuning.key import summary

    data = record.data
    lines = [f"{summary(record.key)}:", f"{indent}choice: {record.tuning.describe()}"]
    if record.margin is None:
        lines.append(f"{indent}margin: not measured (the defaults kept)")
    else:
        gain = f"{record.margin:.1%} less" if record.margin >= 0 else f"{-record.margin:.1%} more"
        verdict = "chosen" if record.check is not None else "under what a choice must gain: the defaults kept"
        lines.append(
            f"{indent}margin: {gain} time than the defaults (measured spread {record.spread or 0:.1%}), {verdict}"
        )
    highway = data.get("highway")
    if isinstance(highway, dict) and highway.get("margin") is None and highway.get("chosen"):
        lines.append(f"{indent}highway: its default disagreed with the reference; the threshold that agrees chosen")
    elif isinstance(highway, dict) and isinstance(highway.get("margin"), (int, float)):
        lines.append(
            f"{indent}highway: {highway['margin']:.1%} less time (spread {highway.get('spread') or 0:.1%}), "
            f"{'chosen' if highway.get('chosen') else 'the default kept'}"
        )
    if record.check is not None:
        ratio = record.check.get("ratio")
        lines.append(
            f"{indent}re-checked on first use at {record.check['rows']} rows"
            + (f" (measured: {ratio:.3g}x the default's time)" if isinstance(ratio, (int, float)) else "")
        )
    for e in record.excluded:
        lines.append(f"{indent}left out: {e.get('candidate')} ({e.get('where')}): {e.get('detail', '')}")
    done = "complete" if data.get("complete", True) else "cut short by its budget"
    lines.append(
        f"{indent}measured {data.get('date', '?')} in {data.get('seconds', '?')} s ({done}), "
        f"{record.busy:.0%} of the time waiting for a CPU"
    )
    return lines


def this_machine(record) -> bool:
    from ..tuning import dispatch

    return record is not None and record.key.get("dispatch", {}).get("cpu") == dispatch.cpu_model()


def _selected(args):
    from ..tuning import store

    return [(p, r) for p, r in store.records() if args.all or this_machine(r)]


def _show(args: argparse.Namespace) -> int:
    from ..tuning import store

    chosen = _selected(args)
    if args.json:
        json.dump(
            {
                "store": str(store.store_dir()),
                "records": [{"file": str(p), **(r.data if r is not None else {"unreadable": True})} for p, r in chosen],
            },
            sys.stdout,
            indent=1,
        )
        print()
        return 0
    if not chosen:
        print(f"no stored calibration{'' if args.all else ' of this machine'} in {store.store_dir()}")
        return 0
    for path, record in chosen:
        if record is None:
            print(f"{path.name}: not a calibration record (ignored; `elmo-fast calibration clear --all` removes it)")
            continue
        print(f"{path.name}: " + "\n".join(record_lines(record)))
    return 0


def _clear(args: argparse.Namespace) -> int:
    from ..tuning import store

    gone = store.remove([p for p, _ in _selected(args)])
    print(f"removed {gone} stored calibration(s) from {store.store_dir()}")
    return 0


def _refresh(args: argparse.Namespace) -> int:
    import torch

    from ..bilm.model import ElmoBiLm
    from ..errors import ElmoFastError
    from ..tuning import cpu_tuning, environment, store

    forced = environment.forced()
    if forced:
        raise ElmoFastError(
            ", ".join(f"{k}={v}" for k, v in forced.items())
            + " forces the CPU kernels' schedule: unset it to measure the machine"
        )
    if args.threads is not None:
        if args.threads < 1:
            raise ElmoFastError("--threads must be >= 1, got ", str(args.threads))
        torch.set_num_threads(args.threads)
    if bool(args.options) != bool(args.weights):
        raise ElmoFastError(
            "give --options F and --weights F together (or --model-dir DIR, or neither: the bundled model)"
        )
    if args.model_dir and args.options:
        raise ElmoFastError("give one of --model-dir DIR or --options F --weights F")
    model = (
        dict(model_dir=args.model_dir) if args.model_dir else dict(options_file=args.options, weight_file=args.weights)
    )
    precisions = ["fp32", "bf16"] if args.precision == "all" else [args.precision]
    for precision in precisions:
        bilm = ElmoBiLm(**model, backend="fast", precision=precision)
        record = cpu_tuning.refresh(bilm.encoder.flat_weights(), _highway(bilm), precision)
        if record is None:
            print(f"{precision}: measured, but could not be stored in {store.store_dir()}", file=sys.stderr)
            return 1
        print("\n".join(record_lines(record)))
    return 0


def _highway(bilm):
    from ..bilm.stages import CharTokenEmbedder

    emb = bilm.token_embedder
    if not isinstance(emb, CharTokenEmbedder):
        return None
    return (emb.highways.weights(), emb.highways.biases(), emb.projection.weight, emb.projection.bias)


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "calibration",
        help="the CPU kernels' choices measured on this machine and stored: show, clear, refresh",
        description="The CPU fast path measures its kernels' choices at a model's first use (per CPU, shapes, "
        "precision and threads) and stores them in the cache's calibration/ folder. Exit 0 done, 2 bad input, "
        "1 a failure while running.",
    )
    actions = p.add_subparsers(dest="action", required=True)
    show = actions.add_parser("show", help="the stored choices: key, choice, margin, what was left out")
    show.add_argument("--all", action="store_true", help="every record of the store, other CPUs' too")
    show.add_argument("--json", action="store_true", help="print the records as one JSON object")
    show.set_defaults(func=_show)
    clear = actions.add_parser("clear", help="remove this machine's stored choices (measured again at first use)")
    clear.add_argument("--all", action="store_true", help="remove every file of the store, other CPUs' too")
    clear.set_defaults(func=_clear)
    refresh = actions.add_parser("refresh", help="measure one model's choices again now, and store them")
    refresh.add_argument("--model-dir", metavar="DIR", help="a model directory (default: the bundled model)")
    refresh.add_argument("--options", "--options-file", help="options.json of the model")
    refresh.add_argument("--weights", "--weight-file", help="weights.hdf5 of the model")
    refresh.add_argument(
        "--precision",
        choices=["fp32", "bf16", "all"],
        default="all",
        help="the precision to measure (default all: fp32 and bf16, the two the CPU measures)",
    )
    refresh.add_argument("--threads", type=int, metavar="N", help="torch threads to measure at (default: torch's)")
    refresh.set_defaults(func=_refresh)
