"""Materialise a model entry on this host and write its manifest (files, sizes, sha256, source, revision).

Local paths and files shipped inside Python packages are handled here; URL lists and Hugging Face repositories go
through :mod:`servesweep.download` (aria2c). A complete model is never fetched or copied again.
"""
from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

from servesweep.download import fetch, sha256_file


def _file_entry(path: Path, root: Path, with_hash: bool = True) -> dict:
    return {"name": str(path.relative_to(root)) if path != root else path.name, "size": path.stat().st_size,
            "sha256": sha256_file(path) if with_hash else None}


def _check_sha(name: str, path: Path, expected: str | None) -> str:
    actual = sha256_file(path)
    if expected and actual != expected:
        raise ValueError(f"config key `models.{name}.sha256`: {path} has sha256 {actual}, expected {expected} — "
                         "fix: correct the sha256 or replace the file")
    return actual


def materialise(name: str, model: dict, dest_dir: Path, log=None) -> dict:
    """Make model ``name`` available under ``dest_dir`` (or in place for local paths); return its manifest."""
    source = model["source"]
    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    manifest: dict = {"model": name, "source": source, "format": model.get("format", "hf"),
                      "load_format": model.get("load_format", "auto")}
    if "python_package" in source:
        spec = source["python_package"]
        module = importlib.import_module(spec["package"])
        func = getattr(module, spec.get("function", "assemble"))
        filename = getattr(module, "MODEL_NAME", f"{name}.bin")
        target = dest_dir / filename
        path = Path(func(output_path=target))
        digest = _check_sha(name, path, model.get("sha256"))
        manifest.update(path=str(path.resolve()), revision=getattr(module, "__version__", None)
                        or _dist_version(spec["package"]),
                        files=[{"name": path.name, "size": path.stat().st_size, "sha256": digest}])
    elif "local" in source:
        path = Path(os.path.expanduser(source["local"])).resolve()
        if not path.exists():
            raise FileNotFoundError(f"config key `models.{name}.source.local`: {path} does not exist — fix: give the "
                                    "path of the model file or directory on this host")
        if path.is_file():
            files = [{"name": path.name, "size": path.stat().st_size,
                      "sha256": _check_sha(name, path, model.get("sha256"))}]
        else:
            # Directories can hold hundreds of GB: sizes only, hashes come from the download manifest if any.
            files = [_file_entry(p, path, with_hash=False) for p in sorted(path.rglob("*")) if p.is_file()]
        manifest.update(path=str(path), revision=None, files=files)
    else:
        manifest.update(fetch(name, model, dest_dir, log=log))
    return manifest


def _dist_version(module_name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for candidate in (module_name, module_name.replace("_", "-")):
        try:
            return version(candidate)
        except PackageNotFoundError:
            continue
    return None


def write_manifest(manifest: dict, path: Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(manifest, indent=2) + "\n")
