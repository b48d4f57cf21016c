"""A prebuilt ``elmo_fast._C`` for another machine: record it, check that it fits, install it.

Building the CUDA extension takes minutes and needs the CUDA toolkit; running it needs a GPU. The two
need not be the same machine: scripts/prepare_gpu_run.sh builds the extension on any machine with the
toolkit (no GPU needed), against the torch and Python of the machine that will run it, and records it
with this script in ``prebuilt/`` (ignored by git). Copy that folder into the GPU machine's checkout of
the same commit (scp, rsync, a shared disk), and tools/gpu_check.sh there checks it against the
machine's interpreter and installs it, or builds there when it does not fit.

    python scripts/prebuilt_extension.py describe                   # on the GPU machine: prepare's flags
    python scripts/prebuilt_extension.py record BUILD_LIB [--dir prebuilt] [--seconds S]
    python scripts/prebuilt_extension.py check [--dir prebuilt]     # exit 0: fits; 3: does not; 2: none
    python scripts/prebuilt_extension.py install [--dir prebuilt]   # copies it into elmo_fast/

It fits when the interpreter that runs ``check`` has the same torch release (X.Y.Z) built for the
same CUDA version, the same C++ ABI flag, the same Python extension suffix (``cpython-312-x86_64-
linux-gnu``), and when csrc/, setup.py and build_support/ are those it was built from (their
digest): an extension built from other sources would test other kernels. ``check`` prints both
sides either way. Standard library only, besides torch for ``check`` and ``describe``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MANIFEST = "manifest.json"
BUILD_INFO = "_build_info.py"


def sources_digest(root: Path = ROOT) -> str:
    """sha256 over what the extension is compiled from: csrc/**, setup.py, build_support/*.py."""
    files = sorted(p for p in (root / "csrc").rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    files += [root / "setup.py"] + sorted((root / "build_support").glob("*.py"))
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def ext_suffix() -> str:
    """This interpreter's extension-module suffix, e.g. ``.cpython-312-x86_64-linux-gnu.so``."""
    return sysconfig.get_config_var("EXT_SUFFIX")


def _git_commit(root: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=30
        )
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "csrc", "setup.py", "build_support"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.SubprocessError):
        return "?"
    return out.stdout.strip() + (" (csrc modified)" if dirty.stdout.strip() else "")


def _read_build_info(path: Path) -> dict:
    values: dict = {}
    exec(compile(path.read_text(), str(path), "exec"), {}, values)  # noqa: S102  (setup.py's own record)
    return {k: v for k, v in values.items() if k.isupper()}


def record(build_lib: Path, dest: Path, seconds: float | None) -> dict:
    """Copies BUILD_LIB/elmo_fast/_C<suffix> and _build_info.py into DEST with a manifest."""
    import torch

    package = build_lib / "elmo_fast"
    name = "_C" + ext_suffix()
    so = package / name
    if not so.is_file():
        raise SystemExit(
            f"prebuilt_extension: {so} not found (the build wrote {sorted(p.name for p in package.glob('_C*'))})"
        )
    info = _read_build_info(package / BUILD_INFO)
    if not info.get("WITH_CUDA"):
        raise SystemExit(f"prebuilt_extension: {so} was built without its CUDA kernels ({info.get('CUDA_DECISION')})")
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("_C*.so"):
        old.unlink()
    shutil.copy2(so, dest / name)
    # The host objects' debug info is 9/10 of the file (24 MiB of 27 for sm_90): it would only travel.
    stripped = (
        shutil.which("strip") is not None
        and subprocess.run(["strip", "--strip-debug", str(dest / name)], capture_output=True, timeout=120).returncode
        == 0
    )
    shutil.copy2(package / BUILD_INFO, dest / BUILD_INFO)
    manifest = {
        "file": name,
        "bytes": (dest / name).stat().st_size,
        "debug_info_stripped": stripped,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": sys.version.split()[0],
        "ext_suffix": ext_suffix(),
        "cuda_archs": info.get("CUDA_ARCHS"),
        "sources": sources_digest(),
        "commit": _git_commit(ROOT),
        "built_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "build_seconds": None if seconds is None else round(seconds),
    }
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def _release(version: str) -> str:
    return version.split("+", 1)[0]


def here() -> dict:
    import torch

    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cxx11_abi": bool(torch._C._GLIBCXX_USE_CXX11_ABI),
        "python": sys.version.split()[0],
        "ext_suffix": ext_suffix(),
        "sources": sources_digest(),
    }


def mismatches(built: dict, now: dict) -> list[str]:
    """Why the prebuilt extension does not fit this interpreter and tree (empty: it fits)."""
    why = []
    if _release(built["torch"]) != _release(now["torch"]):
        why.append(f"torch {built['torch']} != {now['torch']}")
    if built["torch_cuda"] != now["torch_cuda"]:
        why.append(f"torch's CUDA {built['torch_cuda']} != {now['torch_cuda']}")
    if built["cxx11_abi"] != now["cxx11_abi"]:
        why.append(f"C++11 ABI {built['cxx11_abi']} != {now['cxx11_abi']}")
    if built["ext_suffix"] != now["ext_suffix"]:
        why.append(f"Python ABI {built['ext_suffix']} != {now['ext_suffix']}")
    if built["sources"] != now["sources"]:
        why.append(
            f"built from other sources (csrc/, setup.py, build_support/: {built['sources']} != {now['sources']}; "
            "run scripts/prepare_gpu_run.sh again)"
        )
    return why


def _line(d: dict) -> str:
    return (
        f"torch {d['torch']} (CUDA {d['torch_cuda']}, cxx11 ABI {d['cxx11_abi']}), Python {d['python']} "
        f"({d['ext_suffix']}), sources {d['sources']}"
    )


def describe() -> str:
    """The flags of scripts/prepare_gpu_run.sh that build an extension for this machine (its torch, CUDA and
    Python, and its GPUs' compute capabilities), to run where the extension will run."""
    import torch

    release = _release(torch.__version__)
    if torch.version.cuda is None:
        return f"prebuilt: torch {torch.__version__} here is not a CUDA build: install a CUDA build of torch first"
    archs = sorted(
        {"{}.{}".format(*torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())},
        key=lambda a: tuple(map(int, a.split("."))),
    )
    python = "python{}.{}".format(*sys.version_info[:2])
    flags = f"--torch {release} --cuda {torch.version.cuda} --python {python}"
    if archs:
        flags += f' --archs "{";".join(archs)}"'
    else:
        flags += "  (no GPU visible here: add --archs for the GPU, e.g. --archs 9.0)"
    return f"bash scripts/prepare_gpu_run.sh {flags}"


def check(dest: Path) -> int:
    path = dest / MANIFEST
    if not path.is_file():
        print(f"prebuilt: none ({path} not found; scripts/prepare_gpu_run.sh makes it)")
        return 2
    built = json.loads(path.read_text())
    now = here()
    print(
        f"prebuilt: {built['file']}, {built['bytes'] / 2**20:.1f} MiB, archs {built['cuda_archs']}, commit "
        f"{built['commit']}, built {built['built_utc']} in {built['build_seconds']} s"
    )
    print(f"  built against: {_line(built)}")
    print(f"  this machine:  {_line(now)}")
    why = mismatches(built, now)
    if why:
        print("  does NOT fit: " + "; ".join(why))
        return 3
    note = "" if built["torch"] == now["torch"] else f" (local version tags differ: {built['torch']} vs {now['torch']})"
    print(f"  fits{note}")
    return 0


def install(dest: Path) -> None:
    built = json.loads((dest / MANIFEST).read_text())
    target = ROOT / "elmo_fast"
    shutil.copy2(dest / built["file"], target / built["file"])
    shutil.copy2(dest / BUILD_INFO, target / BUILD_INFO)
    print(f"prebuilt: installed {target / built['file']} and {target / BUILD_INFO}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("describe", "record", "check", "install", "digest"))
    parser.add_argument("build_lib", nargs="?", help="record: the build's --build-lib folder")
    parser.add_argument("--dir", default=str(ROOT / "prebuilt"), help="the prebuilt folder (default: prebuilt/)")
    parser.add_argument("--seconds", type=float, help="record: how long the build took")
    args = parser.parse_args(argv)
    dest = Path(args.dir)
    if args.command == "digest":
        print(sources_digest())
        return 0
    if args.command == "describe":
        text = describe()
        print(text)
        return 0 if text.startswith("bash ") else 1
    if args.command == "record":
        if not args.build_lib:
            parser.error("record needs BUILD_LIB")
        manifest = record(Path(args.build_lib), dest, args.seconds)
        print(f"prebuilt: recorded {dest / manifest['file']} ({manifest['bytes'] / 2**20:.1f} MiB): {_line(manifest)}")
        return 0
    if args.command == "check":
        return check(dest)
    install(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
