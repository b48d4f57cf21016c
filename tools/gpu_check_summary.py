"""The figures of a gpu_check.sh run, read back from its logs: the summary at the end of its output.

    python tools/gpu_check_summary.py OUT_DIR

Prints what each log says in a line or a table: the GPU and versions (device.log), which extension
was used (extension.log), the doctor's verdict and failing rows (doctor.log), pytest's counts and
failures per test phase (kernels.log, model.log, more_tests.log), the sanitizers' error summaries
(sanitizer.log), and the benchmark (bench.json, else bench.log's lines of an interrupted run) with
elmo-fast's speed targets for an H100 beside it (BENCHMARKS.md, GPU). A missing log is skipped;
nothing here fails the run.
Standard library only.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

#: elmo-fast's speed targets on an H100, preset original: (what, config(s), batch, field, op, value)
TARGETS = [
    ("batch 64 fp32 >= 150k tokens/s", ("model-fp32", "fast-fp32"), 64, "words_per_s", ">=", 150e3),
    ("batch 256 bf16 >= 1M tokens/s", ("model-bf16", "fast-bf16"), 256, "words_per_s", ">=", 1e6),
    ("one sentence fp32 <= 1.5 ms", ("model-graphs", "model-fp32", "fast-fp32"), 1, "p50_ms", "<=", 1.5),
    ("one sentence bf16 <= 0.5 ms", ("model-bf16", "fast-bf16"), 1, "p50_ms", "<=", 0.5),
]


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _last(pattern: str, text: str) -> str | None:
    found = re.findall(pattern, text, flags=re.M)
    return found[-1] if found else None


def device(out: Path) -> list[str]:
    text = _read(out / "device.log")
    lines = [m for m in (_last(r"^GPU: .*$", text), _last(r"^python .*$", text), _last(r"^CPU: .*$", text)) if m]
    driver = _last(r"Driver Version: \S+", text)
    return ["  " + line for line in lines] + ([f"  {driver}"] if driver else [])


def extension(out: Path) -> list[str]:
    text = _read(out / "extension.log") + _read(out / "build.log")
    keep = [
        line
        for line in text.splitlines()
        if line.startswith(
            (
                "prebuilt:",
                "  built against",
                "  this machine",
                "  fits",
                "  does NOT fit",
                "elmo_fast._C loaded",
                "building the extension",
                "the prebuilt extension",
            )
        )
    ]
    return ["  " + line.strip() for line in keep]


def doctor(out: Path) -> list[str]:
    text = _read(out / "doctor.log")
    if not text:
        return []
    verdict = _last(r"^(?:OK|FAIL): .*$", text) or "no verdict (the doctor did not finish: see doctor.log)"
    fails = [line for line in text.splitlines() if re.search(r"\s(FAIL \(|error: )", line)]
    return [f"  doctor: {verdict}"] + [f"    {line.strip()}" for line in fails[:12]]


def pytest_phase(out: Path, name: str) -> list[str]:
    text = _read(out / f"{name}.log")
    if not text:
        return []
    runs = re.findall(r"^=*\s*(\d+ (?:passed|failed|skipped|deselected|errors?).*?)\s*=*$", text, flags=re.M)
    counts = "; ".join(runs) if runs else "no pytest summary (killed?): " + (_last(r"^.*$", text.rstrip()) or "")
    if "KeyboardInterrupt" in text:
        counts += " (interrupted at its budget)"
    failed = re.findall(r"^(?:FAILED|ERROR) (\S+)(?: - (.*))?$", text, flags=re.M)
    lines = [f"  {name}: {counts}"]
    lines += [f"    {kind_id}{' - ' + why[:160] if why else ''}" for kind_id, why in failed[:20]]
    if len(failed) > 20:
        lines.append(f"    ... {len(failed) - 20} more in {name}.log")
    return lines


def sanitizer(out: Path) -> list[str]:
    text = _read(out / "sanitizer.log")
    if not text:
        return []
    tools = re.findall(r"^--- (\w+)$", text, flags=re.M)
    summaries = re.findall(r"ERROR SUMMARY: .*$", text, flags=re.M)
    return [f"  sanitizer ({', '.join(tools)}): {'; '.join(summaries) or 'no ERROR SUMMARY line (see sanitizer.log)'}"]


def _bench_rows(out: Path) -> tuple[dict, list[dict]]:
    try:
        data = json.loads((out / "bench.json").read_text())
        return data, data.get("rows", [])
    except (OSError, ValueError):
        pass
    rows = []  # an interrupted run: its printed lines
    for m in re.finditer(
        r"^bench_gpu: (\S+)\s+batch\s+(\d+): p50\s+([\d.]+) ms,\s+([\d.]+) (?:words|tokens)/s",
        _read(out / "bench.log"),
        flags=re.M,
    ):
        rows.append(
            {
                "config": m.group(1),
                "batch": int(m.group(2)),
                "p50_ms": float(m.group(3)),
                "words_per_s": float(m.group(4)),
            }
        )
    return {}, rows


def bench(out: Path) -> list[str]:
    data, rows = _bench_rows(out)
    if not rows:
        return ["  bench: no figures (see bench.log)"] if (out / "bench.log").exists() else []
    lines = []
    if data.get("machine"):
        m = data["machine"]
        lines.append(
            f"  bench ({data.get('preset')}): {m.get('device')}, torch {m.get('torch')}, "
            f"matmul ceilings TFLOP/s {json.dumps({k: round(v) for k, v in data.get('ceilings_tflops', {}).items()})}"
        )
    lines.append(
        f"  {'config':17s} {'batch':>5s} {'tokens/s':>11s} {'p50 ms':>9s} {'peak GB':>8s} {'x ref':>6s} "
        f"{'max|diff|':>9s}"
    )
    for r in rows:
        if "p50_ms" not in r:
            lines.append(f"  {r['config']:17s} {r['batch']:5d}  {r.get('skipped') or r.get('error')}")
            continue
        lines.append(
            f"  {r['config']:17s} {r['batch']:5d} {r['words_per_s']:11.0f} {r['p50_ms']:9.2f} "
            f"{r.get('peak_gb', float('nan')):8.2f} {r.get('speedup_vs_reference', float('nan')):6.1f} "
            f"{r.get('max_abs_diff_vs_reference', float('nan')):9.1e}"
        )
    lines.append("  targets (an H100, preset original; on another GPU, for scale only):")
    for what, configs, batch, field, op, value in TARGETS:
        got = next(
            (
                (c, r[field])
                for c in configs
                for r in rows
                if r.get("config") == c and r.get("batch") == batch and field in r
            ),
            None,
        )
        if got is None:
            lines.append(f"    {what}: not measured")
            continue
        ok = got[1] >= value if op == ">=" else got[1] <= value
        shown = f"{got[1]:.0f} tokens/s" if field == "words_per_s" else f"{got[1]:.2f} ms"
        lines.append(f"    {what}: {shown} ({got[0]}) {'met' if ok else 'NOT met'}")
    return lines


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = Path(argv[0])
    lines = device(out) + extension(out) + doctor(out)
    for name in ("kernels", "model", "more_tests"):
        lines += pytest_phase(out, name)
    lines += sanitizer(out) + bench(out)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
