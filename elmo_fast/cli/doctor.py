"""``elmo-fast doctor``: is this install right? The build (version, torch, the extension's backends,
CUDA release and archs), then every compiled op against its reference twin on every device, the
CPU included, and the whole model fast vs reference (:mod:`elmo_fast.verification.selfcheck`): a table of
max errors against their bounds and a one-line verdict; exit 1 when a check fails. Between the two, the CPU
kernels' choices this machine measured and stored (:mod:`elmo_fast.tuning`): each one's key, choice and
margin over the defaults, and the candidates the reference gate left out. After the table, the first-use
self-check's mode, what it would do with a failure, and the ops this process runs on their references
(:func:`elmo_fast.verification.first_use.fallbacks`). ``--json``: the
same as one JSON object. Also ``elmo-fast --version``'s lines. Both name the bundled model and its
licence terms (:func:`elmo_fast.pretrained.bundled.license_line`): they are not the code's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time


def version_line() -> str:
    """``elmo-fast 0.1.0 (torch 2.13.0+cpu; extension: cpu [built against torch 2.13.0]; cuda: not built)``."""
    from ..verification.build_report import build_report

    return build_report().one_line()


def version_lines() -> list[str]:
    """``--version``: the build's line, then the bundled model's licence terms."""
    from ..pretrained.bundled import license_line

    return [version_line(), license_line()]


class VersionAction(argparse.Action):
    """``--version``: the lines above (computed only when asked: it imports torch and the extension)."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, help=None):
        super().__init__(option_strings, dest=dest, default=default, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print("\n".join(version_lines()))
        parser.exit()


def _build_lines(report, devices) -> list[str]:
    import torch

    from ..pretrained.bundled import license_line
    from ..verification.build_report import arch_mismatch

    lines = [report.one_line(), license_line()]
    if report.extension_error:
        lines.append(f"  extension: {report.extension_error}")
    if report.cuda_missing and report.gpus:
        lines.append(f"  cuda: {report.cuda_missing}")
    for gpu in report.gpus:
        lines.append(f"  {gpu}")
    for device in devices:
        if device.type == "cuda" and "cuda" in report.backends:
            why = arch_mismatch(report.cuda_archs, torch.cuda.get_device_capability(device))
            if why:
                lines.append(f"  {device}: {why}")
    return lines


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.1e}"


def _table(results) -> list[str]:
    header = ("op", "reference", "device", "dtype", "check", "schedule", "max error", "bound", "used", "status")
    rows = []
    for r in results:
        used = "-" if r.ratio is None else ("inf" if r.ratio == float("inf") else f"{r.ratio:.0%}")
        # a failure names its case (shapes), an error or a skip says why
        status = {"ok": "ok", "FAIL": f"FAIL ({r.detail})"}.get(r.status, f"{r.status}: {r.detail}")
        rows.append((r.op, r.twin, r.device, r.dtype, r.check, r.schedule, _fmt(r.error), r.bound or "-", used, status))
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header) - 1)]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(row[:-1], widths)) + "  " + str(row[-1]) for row in [header, *rows]
    ]


def _calibration_records() -> list[dict]:
    """This machine's stored CPU calibrations, as their files hold them (``elmo-fast calibration show --json``)."""
    from ..tuning import store
    from .calibration import this_machine

    return [{"file": str(p), **r.data} for p, r in store.records() if this_machine(r)]


def _calibration_lines() -> list[str]:
    """The CPU kernels' stored choices on this machine: key, choice, margin, what the gate left out."""
    from ..tuning import store
    from .calibration import record_lines, this_machine

    mine = [r for _, r in store.records() if this_machine(r)]
    if not mine:
        return [f"CPU calibration: none stored in {store.store_dir()} (measured at a model's first use)"]
    lines = [f"CPU calibration ({len(mine)} stored in {store.store_dir()}; `elmo-fast calibration` manages them):"]
    for record in mine:
        lines += ["  " + line for line in record_lines(record)]
    return lines


def _verdict(results, devices, seconds: float) -> str:
    failed = [r for r in results if r.failed]
    skipped = [r for r in results if r.status == "skip"]
    ran = len(results) - len(skipped)
    where = ", ".join(str(d) for d in devices)
    skip = (
        f"; {len(skipped)} skipped ({skipped[0].detail}{', ...' if len({s.detail for s in skipped}) > 1 else ''})"
        if skipped
        else ""
    )
    if failed:
        names = sorted({f"{r.op} on {r.device}" for r in failed})
        return (
            f"FAIL: {len(failed)} of {ran} checks on {where} out of bounds or raising: {', '.join(names)}{skip} "
            f"({seconds:.1f} s)"
        )
    return f"OK: all {ran} checks passed on {where}{skip} ({seconds:.1f} s)"


def _selfcheck_lines(results) -> list[str]:
    """The first-use self-check: its mode, what it would do with the failures above, and the ops this
    process already runs on their reference twins (an in-process doctor after a fallback)."""
    from ..verification import first_use

    mode = first_use.mode()
    default = " (the default)" if first_use.ENV_VAR not in os.environ else ""
    lines = [f"first-use self-check: {first_use.ENV_VAR}={mode}{default}"]
    failed = sorted({(r.op, r.device, r.schedule) for r in results if r.status == "FAIL" and r.check != "model"})
    if failed and mode != "off":
        then = "raise SelfCheckError" if mode.endswith("strict") else "run their plain-PyTorch reference instead"
        names = ", ".join(f"{op} on {d}" + ("" if s == "default" else f" ({s})") for op, d, s in failed)
        lines.append(f"  where it checks them, these {then}: {names}")
    now = first_use.fallback_summary()
    if now:
        lines.append(f"  this process runs the plain-PyTorch reference (failed the first-use check) for: {now}")
    return lines


def _doctor(args: argparse.Namespace) -> int:
    import torch

    from ..errors import ModelFileError
    from ..pretrained.bundled import model_info
    from ..verification import first_use, selfcheck
    from ..verification.build_report import build_report

    start = time.perf_counter()
    devices = selfcheck.available_devices() if not args.device else [_device(d) for d in args.device]
    report = build_report()
    seed = args.seed if args.seed is not None else selfcheck.fresh_seed()
    results = selfcheck.run_all(devices, seed=seed, model=not args.no_model)
    seconds = time.perf_counter() - start
    failed = any(r.failed for r in results)
    verdict = _verdict(results, devices, seconds)
    try:
        bundled = model_info().to_dict()
    except ModelFileError as e:
        bundled = {"error": str(e)}
    if args.json:
        json.dump(
            {
                "build": report.to_dict(),
                "bundled_model": bundled,
                "devices": [str(d) for d in devices],
                "seed": seed,
                "torch_threads": torch.get_num_threads(),
                "results": [r.to_dict() for r in results],
                "calibration": _calibration_records(),
                "selfcheck": {"mode": first_use.mode(), "fallbacks": first_use.fallbacks()},
                "ok": not failed,
                "verdict": verdict,
                "seconds": round(seconds, 3),
            },
            sys.stdout,
            indent=1,
        )
        print()
    else:
        print("\n".join(_build_lines(report, devices)))
        print()
        print("\n".join(_calibration_lines()))
        print()
        print("\n".join(_table(results)))
        print()
        print("\n".join(_selfcheck_lines(results)))
        print(verdict)
        if failed:
            print(f"(to draw these inputs again: --seed {seed})")
    return 1 if failed else 0


def _device(text: str):
    """A device the doctor can check: cpu, cuda, cuda:N (one that torch sees)."""
    import torch

    from ..devices import resolve_device
    from ..errors import ElmoFastError

    device = resolve_device(text)
    if device.type == "cuda":
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= torch.cuda.device_count():
            raise ElmoFastError(f"--device {text}: torch sees {torch.cuda.device_count()} CUDA device(s)")
        device = torch.device("cuda", index)
    return device


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="check this install: every compiled op against its plain-PyTorch reference, on "
        "every device, and the whole model (exit 1 when one is out of bounds)",
    )
    p.add_argument(
        "--device",
        action="append",
        help="check only this device (cpu, cuda, cuda:N; repeatable; default: the CPU and every GPU)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (build, results, verdict) instead")
    p.add_argument("--seed", type=int, help="draw the inputs of an earlier run again (default: fresh ones)")
    p.add_argument("--no-model", action="store_true", help="the ops only, not the whole model")
    p.set_defaults(func=_doctor)
