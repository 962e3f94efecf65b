"""A Hugging Face Hub endpoint on 127.0.0.1 for the tests, and checks that huggingface_hub itself
downloads from it.

`HubServer` serves repositories from a folder (`<root>/<owner>/<name>/<files>`) with the parts of
the Hub HTTP API that `snapshot_download` / `hf_hub_download` use:

- GET  /api/models/<repo>/revision/<rev>       repo info: {"id", "sha", "siblings"}
- GET  /api/models/<repo>/tree/<rev>?recursive  files: {"type", "path", "size", "oid", "lfs"}
- HEAD /<repo>/resolve/<rev>/<path>             X-Repo-Commit, ETag (sha256 for LFS files, the git
                                                blob sha1 otherwise), X-Linked-Etag/-Size, Content-Length
- GET  /<repo>/resolve/<rev>/<path>             the bytes
- 404 with X-Error-Code RepoNotFound / RevisionNotFound / EntryNotFound, as the Hub answers.

The revision "main" (and the commit sha) resolve to a commit id hashed from the files. Faults
can be injected per file: "truncate" (serve half the bytes under the full advertised size) and
"corrupt" (same size, different bytes). Every request is logged in `requests`.
"""

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

pytestmark = pytest.mark.backend_independent

_LFS_SUFFIXES = (".safetensors", ".h5", ".npz", ".keras", ".bin")


def _sha256(data):
    return hashlib.sha256(data).hexdigest()


class HubServer:
    """A threaded Hub endpoint for the repositories under `root`. Use as a context manager."""

    def __init__(self, root):
        self.root = os.fspath(root)
        self.faults = {}  # (repo_id, path) -> "truncate" | "corrupt"
        self.delays = {}  # (repo_id, path) -> seconds between 1 MiB chunks (a slow download)
        self.requests = []  # (method, path)
        self.sent = {}  # (repo_id, path) -> bytes of the last GET of it written so far
        self._hashes = {}
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self):
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._server.shutdown()
        self._server.server_close()

    # --- repository contents ---

    def repo_dir(self, repo_id):
        return os.path.join(self.root, *repo_id.split("/"))

    def files(self, repo_id):
        """{path in the repository: (absolute path, size, sha256, git blob sha1)}; hashes are
        computed once per file version (large benchmark repositories are served too)."""
        base = self.repo_dir(repo_id)
        out = {}
        for folder, _, names in os.walk(base):
            for name in names:
                path = os.path.join(folder, name)
                st = os.stat(path)
                key = (path, st.st_size, st.st_mtime_ns)
                if key not in self._hashes:
                    sha256, sha1 = hashlib.sha256(), hashlib.sha1(b"blob %d\0" % st.st_size)
                    with open(path, "rb") as f:
                        while block := f.read(1 << 22):
                            sha256.update(block)
                            sha1.update(block)
                    self._hashes[key] = (sha256.hexdigest(), sha1.hexdigest())
                out[os.path.relpath(path, base).replace(os.sep, "/")] = (path, st.st_size) + self._hashes[key]
        return out

    def commit(self, repo_id):
        digest = hashlib.sha1()
        for path, (_, _, sha256, _) in sorted(self.files(repo_id).items()):
            digest.update(path.encode() + b"\0" + sha256.encode())
        return digest.hexdigest()

    def _handler(self):
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status, body=b"", headers=None, head=False):
                self.send_response(status)
                headers = dict(headers or {})
                headers.setdefault("Content-Length", str(len(body)))
                for key, value in headers.items():
                    self.send_header(key, value)
                self.end_headers()
                if not head and body:
                    self.wfile.write(body)

            def _send_file(self, path, size, headers, delay, key):
                # Streamed in chunks; `delay` seconds between chunks make a slow download.
                self.send_response(200)
                for name, value in dict(headers, **{"Content-Length": str(size)}).items():
                    self.send_header(name, value)
                self.end_headers()
                server.sent[key] = 0
                with open(path, "rb") as f:
                    while block := f.read(1 << 20):
                        try:
                            self.wfile.write(block)
                            self.wfile.flush()
                        except (BrokenPipeError, ConnectionResetError):
                            return
                        server.sent[key] += len(block)
                        if delay:
                            time.sleep(delay)

            def _error(self, code, message, head=False):
                body = json.dumps({"error": message}).encode()
                self._send(404, body, {"X-Error-Code": code, "X-Error-Message": message,
                                       "Content-Type": "application/json"}, head)

            def _json(self, value):
                self._send(200, json.dumps(value).encode(), {"Content-Type": "application/json"})

            def _repo_and_rev(self, repo_id, revision):
                if not os.path.isdir(server.repo_dir(repo_id)):
                    return None, "RepoNotFound"
                commit = server.commit(repo_id)
                if revision not in ("main", commit):
                    return None, "RevisionNotFound"
                return commit, None

            def do_HEAD(self):
                self._dispatch(head=True)

            def do_GET(self):
                self._dispatch(head=False)

            def _dispatch(self, head):
                url = urllib.parse.urlsplit(self.path)
                path = urllib.parse.unquote(url.path)
                server.requests.append((self.command, path))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
                    repo_id, kind, revision = "/".join(parts[2:4]), parts[4], parts[5]
                    commit, error = self._repo_and_rev(repo_id, revision)
                    if error:
                        return self._error(error, f"{error}: {repo_id}@{revision}", head)
                    files = server.files(repo_id)
                    if kind == "revision":
                        return self._json({"id": repo_id, "sha": commit, "private": False,
                                           "siblings": [{"rfilename": p} for p in sorted(files)]})
                    entries = []
                    for p, (_, size, sha256, sha1) in sorted(files.items()):
                        entry = {"type": "file", "path": p, "size": size, "oid": sha1}
                        if p.endswith(_LFS_SUFFIXES):
                            entry["lfs"] = {"oid": sha256, "size": size, "pointerSize": 134}
                        entries.append(entry)
                    return self._json(entries)
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo_id, revision, file_path = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                    commit, error = self._repo_and_rev(repo_id, revision)
                    if error:
                        return self._error(error, f"{error}: {repo_id}@{revision}", head)
                    entry = server.files(repo_id).get(file_path)
                    if entry is None:
                        return self._send(404, b"", {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": commit}, head)
                    path, size, sha256, sha1 = entry
                    lfs = file_path.endswith(_LFS_SUFFIXES)
                    etag = sha256 if lfs else sha1
                    headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"',
                               "Content-Type": "application/octet-stream"}
                    if lfs:
                        headers.update({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(size)})
                    fault = server.faults.get((repo_id, file_path))
                    if head:
                        return self._send(200, b"", dict(headers, **{"Content-Length": str(size)}), head=True)
                    if fault in ("truncate", "corrupt"):
                        with open(path, "rb") as f:
                            data = f.read()
                        if fault == "truncate":
                            data = data[: len(data) // 2]
                        else:
                            data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
                        return self._send(200, data, headers)
                    return self._send_file(path, size, headers, server.delays.get((repo_id, file_path), 0.0),
                                           (repo_id, file_path))
                return self._send(404, b"", {"X-Error-Code": "RepoNotFound"}, head)

        return Handler


def wait_for(condition, timeout, what):
    """Poll `condition()` every 10 ms until it is true; AssertionError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def hub_env(server, tmp_path, **extra):
    """Environment for a fresh process that talks to `server` with its own empty caches."""
    env = {
        "HF_ENDPOINT": server.endpoint,
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_CACHE": str(tmp_path / "hf_home" / "hub"),
        "KERAS_VIT_CACHE": str(tmp_path / "keras_vit_cache"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
        "HF_HUB_DOWNLOAD_TIMEOUT": "10",
    }
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_hub_python(code, env, timeout=300):
    """Run `code` in a fresh interpreter (huggingface_hub reads HF_* at import time)."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=dict(os.environ, **env), timeout=timeout)
    if out.returncode:
        raise AssertionError(f"subprocess failed ({out.returncode}):\n{out.stdout}\n{out.stderr[-4000:]}")
    return out


# === Tests of the endpoint itself, through huggingface_hub ===


@pytest.fixture
def tiny_repo_server(tmp_path):
    repo = tmp_path / "repos" / "someone" / "tiny"
    repo.mkdir(parents=True)
    (repo / "config.json").write_text('{"a": 1}\n')
    (repo / "model.safetensors").write_bytes(os.urandom(5000))
    with HubServer(tmp_path / "repos") as server:
        yield server


def test_huggingface_hub_downloads_and_caches_from_the_local_endpoint(tiny_repo_server, tmp_path):
    server = tiny_repo_server
    code = """
import json, os
from huggingface_hub import snapshot_download, hf_hub_download
folder = snapshot_download("someone/tiny")
one = hf_hub_download("someone/tiny", "config.json")
print(json.dumps({"folder": folder, "files": sorted(os.listdir(folder)), "one": one}))
"""
    env = hub_env(server, tmp_path)
    out = json.loads(run_hub_python(code, env).stdout.strip().splitlines()[-1])
    assert out["files"] == ["config.json", "model.safetensors"]
    assert os.path.basename(out["folder"]) == server.commit("someone/tiny")
    data = (tmp_path / "repos" / "someone" / "tiny" / "model.safetensors").read_bytes()
    assert open(os.path.join(out["folder"], "model.safetensors"), "rb").read() == data
    # The blob is stored under the sha256 the endpoint advertised for the LFS file.
    assert os.path.basename(os.path.realpath(os.path.join(out["folder"], "model.safetensors"))) == _sha256(data)
    methods = {m for m, _ in server.requests}
    assert {"GET", "HEAD"} <= methods
    # Offline, the same call is answered from the cache without a single request.
    count = len(server.requests)
    run_hub_python(code, dict(env, HF_HUB_OFFLINE="1"))
    assert len(server.requests) == count


def test_missing_repository_is_reported_as_such(tiny_repo_server, tmp_path):
    code = """
from huggingface_hub import snapshot_download
from huggingface_hub.errors import RepositoryNotFoundError
try:
    snapshot_download("someone/absent")
except RepositoryNotFoundError:
    print("not-found")
"""
    assert "not-found" in run_hub_python(code, hub_env(tiny_repo_server, tmp_path)).stdout
