"""Downloads through a real aria2c daemon against a loopback HTTP server (Range support, throttling, redirects)."""
import hashlib
import json
import logging
import re
import shutil
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from servesweep import download
from servesweep.download import Aria2Daemon, DownloadError, RemoteFile, aria2_options, fetch

pytestmark = [pytest.mark.skipif(shutil.which("aria2c") is None,
                                 reason="aria2c not installed (./setup.sh or apt-get install aria2 provides it)"),
              pytest.mark.shares_host]

COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_test_token_not_real"


def blob(n_bytes: int, seed: int = 1) -> bytes:
    return (hashlib.sha256(str(seed).encode()).digest() * (n_bytes // 32 + 1))[:n_bytes]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Site:
    """What the loopback server serves, and what it saw."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.json: dict[str, object] = {}
        self.redirects: dict[str, callable] = {}
        self.protected: set[str] = set()
        self.signed: dict[str, dict] = {}  # path -> {"sig": current, "budget": bytes per signature}
        self.throttle_bps = 0
        self.lock = threading.Lock()
        self.requests: list[dict] = []
        self.bytes_served = 0
        self.open_connections = 0
        self.max_open_connections = 0


class Handler(BaseHTTPRequestHandler):
    site: Site

    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.handle_request(body=False)

    def do_GET(self):
        self.handle_request(body=True)

    def handle_request(self, body: bool):
        site = self.site
        url = urllib.parse.urlsplit(self.path)
        path, query = url.path, urllib.parse.parse_qs(url.query)
        with site.lock:
            site.requests.append({"method": self.command, "path": path, "range": self.headers.get("Range"),
                                  "auth": self.headers.get("Authorization")})
        if path in site.protected and self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self.reply(401, b"unauthorised", body)
        if path in site.json:
            return self.reply(200, json.dumps(site.json[path]).encode(), body, "application/json")
        if path in site.redirects:
            self.send_response(302)
            self.send_header("Location", site.redirects[path]())
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if path in site.signed:
            state = site.signed[path]
            if query.get("sig", [""])[0] != str(state["sig"]) or state["served"] >= state["budget"]:
                return self.reply(403, b"signature expired", body)
        if path not in site.files:
            return self.reply(404, b"not found", body)
        self.serve_file(path, site.files[path], body)

    def reply(self, status: int, payload: bytes, body: bool, ctype: str = "text/plain"):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if body:
            self.wfile.write(payload)

    def serve_file(self, path: str, data: bytes, body: bool):
        start, end = 0, len(data) - 1
        rng = self.headers.get("Range")
        if rng:
            first, _, last = rng.removeprefix("bytes=").partition("-")
            start, end = int(first), int(last) if last else len(data) - 1
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        else:
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(end - start + 1))
        self.end_headers()
        if not body:
            return
        site = self.site
        with site.lock:
            site.open_connections += 1
            site.max_open_connections = max(site.max_open_connections, site.open_connections)
        try:
            pos, chunk = start, 16 * 1024
            while pos <= end:
                piece = data[pos:min(pos + chunk, end + 1)]
                self.wfile.write(piece)
                pos += len(piece)
                with site.lock:
                    site.bytes_served += len(piece)
                    if path in site.signed:
                        site.signed[path]["served"] += len(piece)
                        if site.signed[path]["served"] >= site.signed[path]["budget"]:
                            break  # the signature expired mid-stream: the CDN drops the connection
                if site.throttle_bps:
                    time.sleep(len(piece) / site.throttle_bps)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with site.lock:
                site.open_connections -= 1


@pytest.fixture
def site():
    s = Site()
    handler = type("BoundHandler", (Handler,), {"site": s})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    s.base = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield s
    server.shutdown()
    server.server_close()


def url_model(*entries, fmt="hf"):
    return {"source": {"urls": list(entries)}, "format": fmt}


def test_options_are_strings_and_capped():
    opts = aria2_options(RemoteFile("a.bin", "http://x/a.bin", 3, "ab" * 32), ["Authorization: Bearer t"])
    assert all(isinstance(v, str) for k, v in opts.items() if k != "header")
    assert opts["max-connection-per-server"] == "16" and opts["split"] == "16"
    assert opts["checksum"] == "sha-256=" + "ab" * 32 and opts["header"] == ["Authorization: Bearer t"]


def test_multi_connection_download_and_no_refetch(site, tmp_path, capsys):
    data = blob(6 << 20)
    site.files["/m/model.gguf"] = data
    site.throttle_bps = 2 << 20  # per connection: slow enough that the pieces overlap
    model = url_model({"url": site.base + "/m/model.gguf", "sha256": sha(data)}, fmt="gguf")
    out = fetch("m", model, tmp_path / "models" / "m")

    assert out["path"] == str((tmp_path / "models" / "m" / "model.gguf").resolve())
    assert out["files"] == [{"name": "model.gguf", "size": len(data), "sha256": sha(data)}]
    assert (tmp_path / "models" / "m" / "model.gguf").read_bytes() == data
    ranged = {r["range"] for r in site.requests if r["path"] == "/m/model.gguf" and r["range"]}
    assert len(ranged) >= 4 and site.max_open_connections >= 4, (ranged, site.max_open_connections)
    assert not list((tmp_path / "downloads" / "m").iterdir()), "scratch is empty once files are moved"
    assert "B/s" in capsys.readouterr().err, "progress bar shows the rate"

    served = site.bytes_served
    again = fetch("m", model, tmp_path / "models" / "m")
    assert again == out and site.bytes_served == served, "a complete model is not downloaded again"


def test_resume_after_killing_aria2c(site, tmp_path):
    data = blob(8 << 20, seed=2)
    site.files["/big.bin"] = data
    # per connection, and aria2 opens up to 8 here: at most 1 MiB/s in all, so the kill comes long before the end
    site.throttle_bps = 128 << 10
    scratch = tmp_path / "downloads" / "m"
    control = scratch / "big.bin.aria2"
    f = RemoteFile("big.bin", site.base + "/big.bin", len(data), sha(data))
    with Aria2Daemon(scratch) as daemon:
        d = daemon.api.add_uris([f.url], options=aria2_options(f, []))
        deadline = time.monotonic() + 30
        reached = None
        while time.monotonic() < deadline:
            d.update()
            if reached is None and d.completed_length > (2 << 20) and control.exists():
                reached = time.time()
            # kill only once the control file was saved after 2 MiB had arrived (a fixed sleep raced a slow host)
            if reached is not None and control.stat().st_mtime > reached + 0.05:
                break
            time.sleep(0.05)
        daemon.proc.kill()
        daemon.proc.wait()
    assert (scratch / "big.bin").exists() and (scratch / "big.bin.aria2").exists()

    site.throttle_bps = 0
    n_before = len(site.requests)
    out = fetch("m", url_model({"url": f.url, "sha256": f.sha256}), tmp_path / "models" / "m")
    # aria2 opens with one range-less GET to learn the size and drops it; the pieces come as Range requests.
    spans = [tuple(int(x) for x in r["range"].removeprefix("bytes=").split("-"))
             for r in site.requests[n_before:] if r["range"]]
    assert out["files"][0]["sha256"] == sha(data)
    assert (tmp_path / "models" / "m" / "big.bin").read_bytes() == data
    assert spans and min(start for start, _ in spans) > 0, f"the second try fetched byte 0 again: {spans}"
    assert sum(end - start + 1 for start, end in spans) < len(data) - (1 << 20), f"did not resume: {spans}"


def test_checksum_mismatch_removes_file_and_control_file(site, tmp_path):
    data = blob(3 << 20, seed=3)
    site.files["/w.bin"] = data
    model = url_model({"url": site.base + "/w.bin", "sha256": "0" * 64})
    with pytest.raises(DownloadError, match="sha256") as err:
        fetch("m", model, tmp_path / "models" / "m")
    assert "removed" in str(err.value)
    scratch = tmp_path / "downloads" / "m"
    assert not (scratch / "w.bin").exists() and not (scratch / "w.bin.aria2").exists()
    assert not (tmp_path / "models" / "m" / "w.bin").exists()


def test_size_mismatch_is_an_error(site, tmp_path):
    site.files["/s.bin"] = blob(1000)
    with pytest.raises(DownloadError, match="1000 bytes, the source says 999"):
        fetch("m", url_model({"url": site.base + "/s.bin", "size": 999}), tmp_path / "models" / "m")


def test_404_is_a_clear_error(site, tmp_path):
    with pytest.raises(DownloadError, match="404") as err:
        fetch("m", url_model(site.base + "/missing.gguf"), tmp_path / "models" / "m")
    assert "models.m.source" in str(err.value)


# --- the Hub -----------------------------------------------------------------------------------------------------

REPO = "org/tiny"


def hub(site, files: dict[str, bytes], lfs: set[str], protected=False, signed: set[str] = frozenset(),
        budget=None):
    """Serve a stand-in of the Hub's revision, tree and resolve endpoints for REPO."""
    site.json[f"/api/models/{REPO}/revision/main"] = {"id": REPO, "sha": COMMIT}
    tree = [{"type": "directory", "path": "sub", "oid": "d" * 40}]
    for path, data in files.items():
        entry = {"type": "file", "path": path, "size": len(data), "oid": "b" * 40}
        if path in lfs:
            entry["lfs"] = {"oid": sha(data), "size": len(data), "pointerSize": 134}
        tree.append(entry)
        resolve = f"/{REPO}/resolve/{COMMIT}/{path}"
        if path in signed:
            cdn = f"/cdn/{path}"
            site.files[cdn] = data
            site.signed[cdn] = {"sig": 0, "served": 0, "budget": budget}

            def sign(cdn=cdn):
                state = site.signed[cdn]
                state["sig"] += 1
                state["served"] = 0
                return f"{site.base}{cdn}?sig={state['sig']}"

            site.redirects[resolve] = sign
        else:
            site.files[resolve] = data
        if protected:
            site.protected.add(resolve)
    site.json[f"/api/models/{REPO}/tree/{COMMIT}"] = tree
    if protected:
        site.protected.update(site.json)


@pytest.fixture
def hub_env(site, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", site.base)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    return site


def test_hub_listing_include_exclude_and_lfs_sha256(hub_env, tmp_path):
    files = {"config.json": b'{"a": 1}', "model.safetensors": blob(2 << 20, seed=4), "sub/tok.json": b"{}",
             "big.bin": blob(10, seed=5), "README.md": b"# tiny"}
    hub(hub_env, files, lfs={"model.safetensors", "big.bin"})
    spec = {"repo": REPO, "revision": "main", "include": ["*.json", "*.safetensors", "sub/*"], "exclude": ["*.bin"]}
    listed, revision = download.hub_files("tiny", spec, token=None)
    assert revision == COMMIT
    by_name = {f.name: f for f in listed}
    assert sorted(by_name) == ["config.json", "model.safetensors", "sub/tok.json"]
    assert by_name["model.safetensors"].sha256 == sha(files["model.safetensors"])
    assert by_name["config.json"].sha256 is None and by_name["config.json"].size == len(files["config.json"])
    assert by_name["config.json"].url == f"{hub_env.base}/{REPO}/resolve/{COMMIT}/config.json"

    out = fetch("tiny", {"source": {"huggingface": spec}}, tmp_path / "models" / "tiny")
    assert out["revision"] == COMMIT and out["path"] == str((tmp_path / "models" / "tiny").resolve())
    assert {f["name"]: f["sha256"] for f in out["files"]} == {n: sha(files[n]) for n in by_name}
    assert (tmp_path / "models" / "tiny" / "sub" / "tok.json").read_bytes() == b"{}"


def test_hub_token_only_from_env_and_never_logged(hub_env, tmp_path, monkeypatch, caplog, capsys):
    hub(hub_env, {"w.safetensors": blob(1 << 20, seed=6)}, lfs={"w.safetensors"}, protected=True)
    spec = {"source": {"huggingface": {"repo": REPO, "token_required": True}}}
    with pytest.raises(DownloadError, match="HF_TOKEN"):
        fetch("tiny", spec, tmp_path / "models" / "tiny")

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    caplog.set_level(logging.DEBUG)
    out = fetch("tiny", spec, tmp_path / "models" / "tiny")
    assert out["files"][0]["name"] == "w.safetensors"
    assert caplog.text and TOKEN not in caplog.text and TOKEN not in capsys.readouterr().err
    assert TOKEN not in json.dumps(out)
    assert any(r["auth"] == f"Bearer {TOKEN}" and "resolve" in r["path"] for r in hub_env.requests)


def test_gated_file_without_token_is_an_auth_error(hub_env, tmp_path):
    hub(hub_env, {"w.safetensors": blob(1 << 20, seed=7)}, lfs={"w.safetensors"})
    hub_env.protected.add(f"/{REPO}/resolve/{COMMIT}/w.safetensors")  # listing is public, the file is not
    with pytest.raises(DownloadError, match="refused access .*HTTP 401.*HF_TOKEN"):
        fetch("tiny", {"source": {"huggingface": {"repo": REPO}}}, tmp_path / "models" / "tiny")


def test_expired_signed_url_is_resolved_again(hub_env, tmp_path, monkeypatch):
    # One connection, so the signed URL must serve several requests in a row, as in a long download.
    monkeypatch.setattr(download, "MAX_CONNECTIONS_PER_SERVER", 1)
    data = blob(4 << 20, seed=8)
    # Each signature expires after 1 MiB, as a CDN's signed URL would expire during a long download.
    hub(hub_env, {"shard.safetensors": data}, lfs={"shard.safetensors"}, signed={"shard.safetensors"},
        budget=1 << 20)
    hub_env.throttle_bps = 4 << 20
    out = fetch("tiny", {"source": {"huggingface": {"repo": REPO}}}, tmp_path / "models" / "tiny",
                max_attempts=20, retry_wait_s=0.1)
    assert out["files"][0]["sha256"] == sha(data)
    assert hub_env.signed["/cdn/shard.safetensors"]["sig"] >= 4, "each expired signature was resolved again"
    ranges = [r["range"] for r in hub_env.requests if r["path"] == "/cdn/shard.safetensors" and r["range"]]
    assert ranges and all(not r.startswith("bytes=0-") for r in ranges), "later tries resumed, not restarted"


class FailedDownload:
    def __init__(self, code):
        self.error_code, self.error_message = code, "failed"


@pytest.mark.parametrize("code, path, outcome", [
    ("22", "/redirect", "retry"),   # the origin still redirects: the signed URL expired, resolve it again
    ("6", "/file", "retry"),        # network error, origin fine
    ("22", "/missing", "not found (HTTP 404)"),
    ("22", "/private", "refused access (HTTP 401)"),
    ("24", "/file", "refused access"),
    ("3", "/file", "not found"),
])
def test_failure_classification(site, tmp_path, code, path, outcome, caplog):
    site.files["/file"] = b"x"
    site.files["/private"] = b"x"
    site.protected.add("/private")
    site.redirects["/redirect"] = lambda: site.base + "/file"
    f = RemoteFile("f.bin", site.base + path)
    attempts = {"f.bin": 1}
    if outcome == "retry":
        with caplog.at_level(logging.INFO, logger="servesweep.download"):
            download._retry_or_raise(f, FailedDownload(code), attempts, 5, [], tmp_path, "m")
        assert "retry 2 of 5 from the original URL" in caplog.text
        with pytest.raises(DownloadError, match="failed 5 times"):
            download._retry_or_raise(f, FailedDownload(code), {"f.bin": 5}, 5, [], tmp_path, "m")
    else:
        with pytest.raises(DownloadError, match=re.escape(outcome)):
            download._retry_or_raise(f, FailedDownload(code), attempts, 5, [], tmp_path, "m")


def test_unknown_repo_names_the_key(hub_env, tmp_path):
    with pytest.raises(DownloadError, match=r"models\.x\.source\.huggingface\.repo"):
        download.hub_files("x", {"repo": "org/none", "revision": "main"}, token=None)
