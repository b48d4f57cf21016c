"""A Python interpreter that has imported torch, numpy and h5py once and forks, on request, a child that runs
``python -m MODULE ARGS``, ``python -c CODE ARGS`` or ``python SCRIPT ARGS`` as a fresh interpreter would:
the suite's command-line runs start in a fraction of a second instead of torch's 2-3 s of imports on a small
machine (tests/support/cli_process.py is the client and says which runs qualify).

The child is the process a test signals and waits for (its real pid); it gets the test's standard streams,
working directory and environment, then imports the project anew: only third-party libraries, whose imports
read nothing the suite varies, are imported here (torch, numpy, h5py, and those ELMO_FAST_TEST_PREIMPORT names),
and nothing has run on them (no thread pool exists to be lost in the fork).

Protocol, one Unix-socket connection per child: the client sends a JSON request with its three standard
streams as file descriptors; the server answers the child's pid (8 bytes) and, when the child ends, its
wait status (8 bytes), then closes the connection.

Run as ``python process_server.py SOCKET_PATH``: it prints "ready" on its standard output once it listens.
"""

import array
import gc
import importlib
import io
import json
import os
import runpy
import select
import signal
import socket
import struct
import sys
import types

import h5py  # noqa: F401  (the point: imported once, here)
import numpy  # noqa: F401
import torch  # noqa: F401

_STATUS = struct.Struct("q")


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: its JSON (up to the connection's end of writing) and the file descriptors sent with it."""
    chunks, fds = [], []
    while True:
        data, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(16 * array.array("i").itemsize))
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                got = array.array("i")
                got.frombytes(payload[: len(payload) - len(payload) % got.itemsize])
                fds.extend(got)
        if not data:
            break
        chunks.append(data)
    return json.loads(b"".join(chunks)), fds


def serve(path: str) -> tuple[dict, list[int]]:
    """Serves until it is killed (or the test run that started it ends); returns only in a forked child, with
    its request."""
    try:  # go with the test run if it dies (Linux)
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # child pid -> its client's connection
    while True:
        readable, _, _ = select.select([listener, wake_r], [], [])
        if wake_r in readable:
            os.read(wake_r, 4096)
            while waiting:
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if pid == 0:
                    break
                conn = waiting.pop(pid, None)
                if conn is not None:
                    try:
                        conn.sendall(_STATUS.pack(status))
                    except OSError:
                        pass
                    conn.close()
        if listener in readable:
            conn, _ = listener.accept()
            request, fds = _receive(conn)
            pid = os.fork()
            if pid == 0:  # the child: drop the server's state, keep the request
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for sock in (listener, conn, *waiting.values()):
                    sock.close()
                os.close(wake_r)
                os.close(wake_w)
                return request, fds
            for fd in fds:
                os.close(fd)
            conn.sendall(_STATUS.pack(pid))
            waiting[pid] = conn


def become(request: dict, fds: list[int]) -> None:
    """In the child: the request's streams, folder, environment, session and arguments, as a fresh start."""
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    if request.get("start_new_session"):
        os.setsid()
    elif request.get("process_group", -1) >= 0:
        os.setpgid(0, request["process_group"])
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    _rearm_preloaded()
    import tempfile

    tempfile.tempdir = None  # read TMPDIR again
    # sys.stdin, stdout and stderr anew on descriptors 0-2, as a fresh interpreter makes them (Python's
    # create_stdio): a text stream keeps what it learnt of its descriptor at its making (seekable or not)
    buffered = not sys.stdout.write_through  # -u or PYTHONUNBUFFERED (as this interpreter was started)
    for fd, name, old in ((0, "stdin", sys.stdin), (1, "stdout", sys.stdout), (2, "stderr", sys.stderr)):
        writing = fd != 0
        buffer = open(fd, "wb" if writing else "rb", buffering=-1 if buffered or not writing else 0, closefd=False)
        raw = buffer if isinstance(buffer, io.FileIO) else buffer.raw
        raw.name = f"<{name}>"
        stream = io.TextIOWrapper(
            buffer,
            encoding=old.encoding,
            errors=old.errors,
            newline="\n",
            line_buffering=buffered and (raw.isatty() or fd == 2),
            write_through=not buffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _rearm_preloaded() -> None:
    """A library this interpreter preloaded (LD_PRELOAD: the fault shim of tests/support/faults) read its
    environment when it loaded, this interpreter's: it reads the child's now, as it would have at the child's
    start."""
    if not os.environ.get("LD_PRELOAD"):
        return
    import ctypes

    rearm = getattr(ctypes.CDLL(None), "fault_arm_from_environment", None)
    if rearm is not None:
        rearm()


#: libraries a test's children all import, named in this variable (comma-separated; tests/compat/test_flair.py:
#: flair's import is ~7 s after torch's): imported here too, so the server started with it is a server of its own
PREIMPORT = "ELMO_FAST_TEST_PREIMPORT"


def main() -> None:
    for name in filter(None, os.environ.get(PREIMPORT, "").split(",")):
        importlib.import_module(name)
    # what is imported so far stays out of every child's garbage collections: untouched, its memory stays
    # shared with this process instead of copied page by page (a child's exit took 2 s instead of 0.4 s)
    gc.freeze()
    request, fds = serve(sys.argv[1])
    become(request, fds)
    mode, target, args = request["mode"], request["target"], request["args"]
    if mode == "-m":
        sys.argv = [target, *args]  # runpy puts the module's file first
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif mode == "script":  # python path/to/script.py: its folder first on the path
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(target)
        runpy.run_path(target, run_name="__main__")
    else:  # -c: its code runs as __main__, with sys.argv[0] "-c" and "" (the folder) first on the path
        sys.argv = ["-c", *args]
        sys.path[0] = ""
        main_module = types.ModuleType("__main__")
        sys.modules["__main__"] = main_module
        exec(compile(target, "<string>", "exec"), main_module.__dict__)


if __name__ == "__main__":
    main()
