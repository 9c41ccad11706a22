"""Result folders read for a comparison, and what differs between them according to their meta.json files.

A result folder is what :mod:`servesweep.rebuild` reads: ``runs/<cfg>/`` folders, each with ``cells.csv``,
``repeats.csv`` and ``meta.json`` (a pipeline's ``results/``, or a recorded example). Its ``config.yaml``, where
it has one, names the sweep's baseline.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import pandas as pd

# The meta.json fields a comparison reports when they differ, by what they describe (flattened: options.x, ...).
META_FIELDS = {
    "engine": ("engine", "engine_version", "engine_facts"),
    "command line": ("options", "env", "labels", "argv", "load_format"),
    "model": ("model", "model_sha256", "model_manifest_files", "model_architecture"),
    "host": ("host", "cpu_model", "cpu_count", "platform", "telemetry_host.driver", "telemetry_host.gpus"),
    "design": ("launches", "matrix", "slo"),
}
# Fields that differ between any two launches and say nothing about what was measured.
IGNORED = ("port", "argv.<port>", "engine_facts.python", "telemetry_host.gpus.0.index")
# What a reference config must share in both runs for the shift to be read from it.
REFERENCE_FIELDS = ("engine", "engine_version", "options", "env", "model", "model_sha256", "load_format")


@dataclass
class ResultFolder:
    """One run to compare: its label, folder, per-config meta records, cells and repeats (configs renamed by the
    comparison's mapping), and its baseline (from ``config.yaml``; None without one)."""

    label: str
    path: Path
    metas: dict[str, dict]
    cells: pd.DataFrame
    repeats: pd.DataFrame
    baseline: str | None = None
    renamed: dict[str, str] = field(default_factory=dict)   # common name -> the name this run gave the config

    @property
    def configs(self) -> list[str]:
        return sorted(self.metas)

    def started(self) -> str:
        """When its first launch started (UTC), from the meta records; '?' where none records it."""
        starts = [m.get("start_time") for m in self.metas.values() if isinstance(m.get("start_time"), (int, float))]
        return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(min(starts))) if starts else "?"

    def launches(self, config: str) -> int:
        """How many launches of a config the folder holds (1 for recordings made before blocks)."""
        return len(self.metas[config].get("blocks") or [None])


def _read_csv(path: Path) -> pd.DataFrame:
    return pd.read_csv(path) if path.is_file() and path.stat().st_size else pd.DataFrame()


def load_folder(path: Path, label: str, mapping: Mapping[str, str] | None = None) -> ResultFolder:
    """A result folder, its configs renamed by ``mapping`` (a name in this run -> the name compared). Each run's
    ``block_run`` ids are prefixed by its label, so no launch of one run is ever paired with one of another: two runs
    are different sessions, and :func:`servesweep.compare.estimate` then compares them unpaired."""
    path = Path(path)
    run_dirs = sorted(d for d in (path / "runs").glob("*") if (d / "meta.json").is_file())
    if not run_dirs:
        raise FileNotFoundError(f"{path}: no runs/<cfg>/meta.json; a result folder holds the bench jobs' run folders "
                                "(a pipeline's results/ or a recorded example)")
    mapping = dict(mapping or {})
    metas, cells, repeats, renamed = {}, [], [], {}
    for d in run_dirs:
        meta = json.loads((d / "meta.json").read_text())
        name = mapping.get(meta.get("config", d.name), meta.get("config", d.name))
        renamed[name] = meta.get("config", d.name)
        if meta.get("status", "ok") != "ok":
            continue
        metas[name] = meta
        for table, frames in (("cells.csv", cells), ("repeats.csv", repeats)):
            df = _read_csv(d / table)
            if not df.empty:
                frames.append(df.assign(config=name))
    repeats_df = pd.concat(repeats, ignore_index=True) if repeats else pd.DataFrame()
    if not repeats_df.empty:
        run = (repeats_df["block_run"].astype(object).where(repeats_df["block_run"].notna(), "").astype(str)
               if "block_run" in repeats_df else "")
        repeats_df["block_run"] = f"{label}:" + run
    baseline = None
    if (path / "config.yaml").is_file():
        import yaml

        baseline = (yaml.safe_load((path / "config.yaml").read_text()) or {}).get("baseline")
        baseline = mapping.get(baseline, baseline)
    return ResultFolder(label, path, metas, pd.concat(cells, ignore_index=True) if cells else pd.DataFrame(),
                        repeats_df, baseline, renamed)


def labels_for(paths: list[Path]) -> list[str]:
    """A short label per folder: its name, or its parent's and its own where two names repeat."""
    names = [Path(p).resolve().name for p in paths]
    if len(set(names)) == len(names):
        return names
    out = [f"{Path(p).resolve().parent.name}/{n}" for p, n in zip(paths, names)]
    return out if len(set(out)) == len(out) else [f"{i + 1}:{n}" for i, n in enumerate(names)]


def _flat(value, prefix: str, out: dict) -> None:
    if isinstance(value, Mapping):
        for k, v in value.items():
            _flat(v, f"{prefix}.{k}", out)
    elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
        for i, v in enumerate(value):
            _flat(v, f"{prefix}.{i}", out)
    else:
        out[prefix] = value


def argv_flags(meta: dict) -> list[str]:
    """The command line without what changes with every launch or host: the port, the model's local path and the
    interpreter or binary (its version is in the engine's facts)."""
    argv, port, model_path = list(meta.get("argv") or []), str(meta.get("port")), meta.get("model_path")
    out = []
    for i, token in enumerate(argv[1:], start=1):
        if token == port and i > 1 and argv[i - 1].lstrip("-") == "port":
            out.append("<port>")
        elif model_path and token == model_path:
            out.append("<model>")
        else:
            out.append(token)
    return [t for t in out if not t.endswith(("python", "python3")) and t != "-m"]


def facts(meta: dict) -> dict:
    """A launch's meta record flattened to the fields :data:`META_FIELDS` names (dotted keys)."""
    record = dict(meta)
    record["argv"] = " ".join(argv_flags(meta))
    record["launches"] = len(meta.get("blocks") or [None])
    flat: dict = {}
    for fields in META_FIELDS.values():
        for name in fields:
            head, _, rest = name.partition(".")
            value = record.get(head)
            for part in rest.split(".") if rest else []:
                value = value.get(part) if isinstance(value, Mapping) else None
            _flat(value, name, flat)
    return {k: v for k, v in flat.items() if k not in IGNORED and not k.startswith(IGNORED)}


def shown(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "not recorded"
    return json.dumps(value) if isinstance(value, (list, dict)) else str(value)


def differences(a: dict, b: dict) -> list[dict]:
    """What differs between two launches' meta records: rows of {group, field, a, b}, in :data:`META_FIELDS`
    order."""
    fa, fb = facts(a), facts(b)
    rows = []
    for group, fields in META_FIELDS.items():
        for key in sorted(set(fa) | set(fb)):
            if not any(key == f or key.startswith(f + ".") for f in fields):
                continue
            va, vb = fa.get(key), fb.get(key)
            if shown(va) != shown(vb):
                rows.append({"group": group, "field": key, "a": shown(va), "b": shown(vb)})
    return rows


def run_differences(a: ResultFolder, b: ResultFolder) -> tuple[list[dict], dict[str, list[dict]]]:
    """What differs between two runs: the rows every matched config shares (the run's), and per config the rows
    only some configs have; configs in one run only are named as such."""
    common = [c for c in a.configs if c in b.metas]
    per = {c: differences(a.metas[c], b.metas[c]) for c in common}
    keyed = {c: {(r["field"], r["a"], r["b"]) for r in rows} for c, rows in per.items()}
    shared = set.intersection(*keyed.values()) if keyed else set()
    run_rows = [r for r in (per[common[0]] if common else []) if (r["field"], r["a"], r["b"]) in shared]
    only = {c: [r for r in rows if (r["field"], r["a"], r["b"]) not in shared] for c, rows in per.items()}
    for c in sorted(set(a.configs) ^ set(b.configs)):
        where = a.label if c in a.metas else b.label
        only[c] = [{"group": "configs", "field": "config", "a": "measured" if c in a.metas else "absent",
                    "b": "measured" if c in b.metas else "absent", "note": f"measured only in {where}"}]
    return run_rows, {c: rows for c, rows in only.items() if rows}


def reference_problems(a: ResultFolder, b: ResultFolder, reference: str | None) -> list[str]:
    """Why ``reference`` cannot carry the session shift between two runs (empty: it can): it must be measured in
    both, with the same engine, engine version, options, environment and model."""
    if not reference:
        return ["no reference config was named and neither run's config.yaml names a baseline"]
    missing = [r.label for r in (a, b) if reference not in r.metas]
    if missing:
        return [f"`{reference}` was not measured in {', '.join(missing)}"]
    fa, fb = facts(a.metas[reference]), facts(b.metas[reference])
    out = []
    for key in sorted(set(fa) | set(fb)):
        if key.split(".")[0] in REFERENCE_FIELDS and shown(fa.get(key)) != shown(fb.get(key)):
            out.append(f"`{reference}`'s {key} differs: {shown(fa.get(key))} in {a.label}, "
                       f"{shown(fb.get(key))} in {b.label}")
    return out
