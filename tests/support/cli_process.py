"""``run`` and ``Popen`` as in ``subprocess``, for the tests' runs of ``python -m elmo_fast ...`` (and other
``python -m``, ``-c`` and ``script.py`` children): the child is forked from an interpreter that has imported
torch, numpy and h5py once (tests/support/process_server.py) instead of importing them again, 2-3 s of each
run on a small machine. It is still a separate process, with its own pid to signal and wait for, the test's
standard streams, working directory and environment, and the project imported anew in it.

The preimported interpreter was started with the child's environment, but for variables nothing preimported
reads (the project's, the Hub's, the cache folders, HOME, TMPDIR): one per other environment, up to 4. A run
with ``LD_PRELOAD`` is forked from an interpreter started with that library preloaded (its ``FAULT_*``
variables left out: the fault shim, tests/support/faults, reads the child's in the fork). A run the fork
could make differ from a fresh interpreter is one (the plain ``subprocess`` path): with interpreter options
(``-u``, ``-X``), ``preexec_fn``, ``pass_fds``, a user or group, or a program other than this Python. ``ELMO_FAST_TEST_FRESH_PROCESSES=1``
makes every run a fresh interpreter (to rule the fork out when a test fails). A child whose environment names
more libraries in ``ELMO_FAST_TEST_PREIMPORT`` (comma-separated) is forked from an interpreter that imported
those too (flair's children: its import is most of their time).
"""

import atexit
import json
import os
import select
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading

from repo_paths import SUPPORT

PIPE, STDOUT, DEVNULL = subprocess.PIPE, subprocess.STDOUT, subprocess.DEVNULL
CompletedProcess, TimeoutExpired, CalledProcessError = (
    subprocess.CompletedProcess,
    subprocess.TimeoutExpired,
    subprocess.CalledProcessError,
)

_STATUS = struct.Struct("q")
#: environment variables a child may set differently from the test run: nothing the preimported libraries read
_FREE_PREFIXES = ("ELMO_FAST_", "HF_", "HUGGINGFACE_", "XDG_", "PYTEST_", "FAULT_")
_FREE_NAMES = {"HOME", "TMPDIR", "CI", "NO_COLOR", "COLUMNS"}


#: the libraries a preimported interpreter imports besides torch, numpy and h5py (process_server.PREIMPORT)
_PREIMPORT = "ELMO_FAST_TEST_PREIMPORT"


def _free(key: str) -> bool:
    return (key.startswith(_FREE_PREFIXES) or key in _FREE_NAMES) and key != _PREIMPORT


class _Server:
    """A preimported interpreter started with one environment: on first use, stopped at exit."""

    def __init__(self, env: dict):
        self.lock = threading.Lock()
        self.proc = None
        self.env = env
        self.path = None
        self.folder = None
        self.running = 0  # children launched and not yet waited for (counted from their launch)

    def address(self) -> str | None:
        with self.lock:
            if self.proc is not None and self.proc.poll() is None:
                return self.path
            if self.proc is not None:  # it died: every later run is a fresh interpreter
                return None
            folder = self.folder = tempfile.mkdtemp(prefix="elmo-fast-test-forks-")
            self.path = os.path.join(folder, "socket")
            with open(os.path.join(folder, "log"), "wb") as log:  # its own errors, if any
                self.proc = subprocess.Popen(
                    [sys.executable, str(SUPPORT / "process_server.py"), self.path],
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=self.env,
                    text=True,
                )
            atexit.register(self.stop)
            if self.proc.stdout.readline().strip() != "ready":
                self.proc.kill()
                self.proc.wait()
                return None
            return self.path

    def stop(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.proc.stdout.close()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


#: one preimported interpreter per environment (what the libraries may read of it): the run's own, and one
#: for each other that children ask for (a test's OMP_NUM_THREADS, Ray's variables once it started); at most
#: 4 at once, the one least recently used stopped (when no child of it runs) to start another
_SERVERS: dict[tuple, _Server] = {}
_SERVERS_LOCK = threading.Lock()
_MOST_SERVERS = 4


def _server_for(env: dict) -> _Server | None:
    key = tuple(sorted((k, v) for k, v in env.items() if not _free(k)))
    with _SERVERS_LOCK:
        server = _SERVERS.pop(key, None)
        if server is None:
            if len(_SERVERS) >= _MOST_SERVERS:
                idle = [k for k, s in _SERVERS.items() if s.running == 0]
                if not idle:
                    return None
                _SERVERS.pop(idle[0]).stop()
            server = _Server({k: v for k, v in env.items() if not k.startswith("FAULT_")})  # an unarmed shim
        _SERVERS[key] = server  # (last: the most recently used)
        server.running += 1
        return server


def _forkable(args, kwargs) -> tuple[str, str, list[str]] | None:
    """(mode, target, arguments) where this run can be a fork of a preimported interpreter, else None."""
    if os.environ.get("ELMO_FAST_TEST_FRESH_PROCESSES") == "1":
        return None
    if isinstance(args, (str, bytes, os.PathLike)) or kwargs.get("shell") or kwargs.get("executable"):
        return None
    args = [os.fspath(a) for a in args]
    if len(args) < 2 or args[0] != sys.executable:
        return None
    if args[1] in ("-m", "-c") and len(args) >= 3:
        mode, target, rest = args[1], args[2], args[3:]
    elif not args[1].startswith("-") and args[1].endswith(".py"):  # a script: python path/to/script.py ...
        mode, target, rest = "script", os.path.abspath(args[1]), args[2:]
    else:
        return None
    if any(kwargs.get(k) for k in ("preexec_fn", "pass_fds", "user", "group", "extra_groups")):
        return None
    if kwargs.get("umask", -1) >= 0:
        return None
    return mode, target, rest


class Popen(subprocess.Popen):
    """``subprocess.Popen``; a qualifying Python child is forked from the preimported interpreter."""

    def __init__(self, args, *a, **kwargs):
        self._fork_request = _forkable(args, kwargs) if not a else None
        self._fork_conn = None
        super().__init__(args, *a, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo,
                       creationflags, shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite,
                       restore_signals, gid, gids, uid, umask, start_new_session, process_group):  # fmt: skip
        env = {os.fsdecode(k): os.fsdecode(v) for k, v in (os.environ if env is None else env).items()}
        server = _server_for(env) if self._fork_request is not None else None
        address = server.address() if server is not None else None
        if address is None:
            if server is not None:
                server.running -= 1
            return super()._execute_child(
                args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags, shell,
                p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, restore_signals, gid, gids, uid, umask,
                start_new_session, process_group,
            )  # fmt: skip
        mode, target, rest = self._fork_request
        request = {
            "mode": mode,
            "target": target,
            "args": rest,
            "cwd": os.fspath(cwd) if cwd is not None else os.getcwd(),
            "env": env,
            "start_new_session": bool(start_new_session),
            "process_group": process_group,
        }
        fds = [fd if fd != -1 else default for fd, default in ((p2cread, 0), (c2pwrite, 1), (errwrite, 2))]
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(address)
            socket.send_fds(conn, [json.dumps(request).encode()], fds)
            conn.shutdown(socket.SHUT_WR)
            self.pid = _STATUS.unpack(_read(conn, _STATUS.size))[0]
        except BaseException:
            conn.close()
            server.running -= 1
            raise
        self._fork_conn, self._fork_server = conn, server
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _internal_poll(self, _deadstate=None, **kwargs):
        if self._fork_conn is None or self.returncode is not None:
            return super()._internal_poll(_deadstate=_deadstate, **kwargs)
        if not self._waitpid_lock.acquire(False):
            return None  # another thread waits for it
        try:
            pid, status = self._try_wait(os.WNOHANG)
            if pid == self.pid:
                self._handle_exitstatus(status)
        except (OSError, RuntimeError):
            if _deadstate is not None:
                self.returncode = _deadstate
            else:
                raise
        finally:
            self._waitpid_lock.release()
        return self.returncode

    def _try_wait(self, wait_flags):
        conn = self._fork_conn
        if conn is None:
            return super()._try_wait(wait_flags)
        if wait_flags & os.WNOHANG and not select.select([conn], [], [], 0)[0]:
            return (0, 0)
        try:
            data = _read(conn, _STATUS.size)
        finally:
            conn.close()
            self._fork_conn = None
            self._fork_server.running -= 1
        return (self.pid, _STATUS.unpack(data)[0])


def _read(conn: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        part = conn.recv(size - len(data))
        if not part:
            raise RuntimeError("the tests' process server ended while a child of it ran")
        data += part
    return data


def run(*popenargs, input=None, capture_output=False, timeout=None, check=False, **kwargs):
    """``subprocess.run`` through ``Popen`` above."""
    if input is not None:
        kwargs["stdin"] = PIPE
    if capture_output:
        kwargs["stdout"] = PIPE
        kwargs["stderr"] = PIPE
    with Popen(*popenargs, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
        retcode = process.poll()
        if check and retcode:
            raise CalledProcessError(retcode, process.args, output=stdout, stderr=stderr)
    return CompletedProcess(process.args, retcode, stdout, stderr)
