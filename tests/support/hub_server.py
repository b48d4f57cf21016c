"""A Hugging Face Hub endpoint on 127.0.0.1 for tests: huggingface_hub pointed at it with HF_ENDPOINT
fetches a repository's files as it fetches them from the Hub.

It answers what ``list_repo_files``, ``snapshot_download`` and ``hf_hub_download`` ask:

* ``GET /api/models/{repo}[/revision/{rev}]``: the repository's info (``sha``: the commit; ``siblings``);
* ``GET /api/models/{repo}/tree/{rev}``: its files (``?recursive=true``), each with its git ``oid`` and,
  for an LFS file, ``lfs: {oid: sha256, size}``;
* ``HEAD`` / ``GET /{repo}/resolve/{rev}/{path}``: the file, with ``X-Repo-Commit``, ``ETag`` (the git
  hash; an LFS file's SHA-256 in ``X-Linked-Etag`` too) and ``X-Linked-Size``;
* errors with the Hub's ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``), and
  401 for a private repository without its token.

Files ending in ``.hdf5`` or ``.pkl`` are LFS files, as on the Hub. Every request is counted
(``requests``: (method, path) in order).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import threading
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".hdf5", ".pkl")


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Repo:
    """A repository: commits (sha -> {path: bytes}), branches and tags (name -> sha), a token if private."""

    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)
    refs: dict[str, str] = field(default_factory=dict)
    token: str | None = None

    def commit(self, files: dict[str, bytes], branch: str = "main") -> str:
        sha = hashlib.sha1(json.dumps(sorted((p, hashlib.sha256(d).hexdigest()) for p, d in files.items())).encode())
        sha = sha.hexdigest()
        self.commits[sha] = dict(files)
        self.refs[branch] = sha
        return sha

    def resolve(self, revision: str) -> str | None:
        if revision in self.commits:
            return revision
        return self.refs.get(revision)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # noqa: A002 - keep test output quiet
        pass

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str, head: bool, extra: dict | None = None) -> None:
        body = json.dumps({"error": code}).encode()
        self._send(status, body, {"X-Error-Code": code, "Content-Type": "application/json", **(extra or {})}, head)

    def _authorized(self, repo: Repo) -> bool:
        return repo.token is None or self.headers.get("Authorization") == f"Bearer {repo.token}"

    def _route(self, head: bool) -> None:
        url = urlsplit(self.path)
        with self.hub.lock:
            self.hub.requests.append(("HEAD" if head else "GET", url.path))
        parts = [unquote(p) for p in url.path.strip("/").split("/")]
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            return self._api(parts[2] + "/" + parts[3], parts[4], parts[5], head)
        if parts[:2] == ["api", "models"] and len(parts) == 4:  # the default branch's info
            return self._api(parts[2] + "/" + parts[3], "revision", "main", head)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(parts[0] + "/" + parts[1], parts[3], "/".join(parts[4:]), head)
        self._error(404, "NotFound", head)

    def _repo(self, repo_id: str, head: bool) -> Repo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(404, "RepoNotFound", head)
            return None
        if not self._authorized(repo):
            self._error(401, "RepoNotFound", head)
            return None
        return repo

    def _api(self, repo_id: str, kind: str, revision: str, head: bool) -> None:
        repo = self._repo(repo_id, head)
        if repo is None:
            return
        sha = repo.resolve(revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", head)
        files = repo.commits[sha]
        if kind == "revision":
            info = {"id": repo_id, "sha": sha, "private": repo.token is not None, "siblings": []}
            info["siblings"] = [{"rfilename": p} for p in sorted(files)]
            body = json.dumps(info).encode()
        else:
            entries, folders = [], set()
            for path, data in sorted(files.items()):
                parts = path.split("/")
                for i in range(1, len(parts)):
                    folders.add("/".join(parts[:i]))
                entry = {"type": "file", "path": path, "size": len(data), "oid": git_oid(data)}
                if path.endswith(LFS_SUFFIXES):
                    entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                entries.append(entry)
            entries += [{"type": "directory", "path": f, "oid": hashlib.sha1(f.encode()).hexdigest()} for f in folders]
            body = json.dumps(entries).encode()
        self._send(200, body, {"Content-Type": "application/json"}, head)

    def _resolve(self, repo_id: str, revision: str, path: str, head: bool) -> None:
        repo = self._repo(repo_id, head)
        if repo is None:
            return
        sha = repo.resolve(revision)
        if sha is None:
            return self._error(404, "RevisionNotFound", head)
        data = repo.commits[sha].get(path)
        if data is None:
            return self._error(404, "EntryNotFound", head, {"X-Repo-Commit": sha})
        headers = {"X-Repo-Commit": sha, "Content-Type": "application/octet-stream", "ETag": f'"{git_oid(data)}"'}
        if path.endswith(LFS_SUFFIXES):
            digest = hashlib.sha256(data).hexdigest()
            headers.update({"ETag": f'"{digest}"', "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(data))})
        body = self.hub.served(path, data)
        self._send(200, body, headers, head)

    def do_GET(self):
        self._route(head=False)

    def do_HEAD(self):
        self._route(head=True)


class HubServer:
    """``with HubServer() as hub:`` a Hub endpoint at ``hub.url`` (repositories in ``hub.repos``);
    ``corrupt``: paths whose GET bodies are altered (the headers still announce the true file)."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str]] = []
        self.corrupt: set[str] = set()
        self.lock = threading.Lock()
        self._httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.hub = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    def served(self, path: str, data: bytes) -> bytes:
        if path in self.corrupt:
            return bytes([data[0] ^ 0xFF]) + data[1:]
        return data

    def add(self, repo_id: str, files: dict[str, bytes], token: str | None = None) -> Repo:
        repo = self.repos.setdefault(repo_id, Repo(token=token))
        repo.commit(files)
        return repo

    def downloads(self) -> list[str]:
        """The paths of the files' GETs so far."""
        return [p for m, p in self.requests if m == "GET" and "/resolve/" in p]

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)
