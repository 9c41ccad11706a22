"""Two or more result folders compared, cell by cell (docs/compare.md).

``python -m servesweep.sweepcompare A B [C ...] --out DIR`` (or the pipeline's ``compare`` target, config key
``compare``): matched cells (same workload, prompt length and load; configs by name or through a mapping), B over
A per cell with its interval and verdict under the sweep's rule, the session shift read from a reference config
that ran identically in both, each other config's change relative to it, what differs in the meta records, an
append-only changelog, and COMPARE.md with its charts. Consecutive runs are compared: A → B, B → C, ...
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

from servesweep.decide import Rule
from servesweep.sweepcompare import changelog
from servesweep.sweepcompare.document import render
from servesweep.sweepcompare.estimates import Pair, compare_pairs, make_pair
from servesweep.sweepcompare.runs import ResultFolder, labels_for, load_folder

__all__ = ["ComparePaths", "compare_folders", "load_folder", "make_pair", "compare_pairs", "Pair", "ResultFolder"]


@dataclass(frozen=True)
class ComparePaths:
    """What a comparison writes in its folder."""

    out: Path

    @property
    def markdown(self) -> Path:
        return self.out / "COMPARE.md"

    @property
    def table(self) -> Path:
        return self.out / "comparisons.csv"

    @property
    def charts(self) -> list[Path]:
        return [self.out / "ratios.png", self.out / "ratios.svg"]

    @property
    def trend(self) -> Path:
        return self.out / "trend"


def compare_folders(folders: Sequence[Path], out: Path, mapping: Mapping[str, str] | None = None,
                    reference: str | None = None, rule: Rule | None = None, log: Path | None = None,
                    labels: Sequence[str] | None = None, command: str = "", charts: bool = True,
                    default_reference: str | None = None) -> str:
    """Compare result folders (in the order given, consecutive pairs) and write COMPARE.md, comparisons.csv and the
    charts under ``out``; append the runs not yet in the changelog ``log`` (default ``out/changelog.jsonl``).
    ``mapping``: a config's name in some run -> the name it is compared under. ``reference``: the config the session
    shift is read from (default: the first run's baseline, from its config.yaml, else ``default_reference``). Returns
    COMPARE.md's text."""
    if len(folders) < 2:
        raise ValueError("a comparison needs two or more result folders")
    rule = rule or Rule()
    paths = ComparePaths(Path(out))
    paths.out.mkdir(parents=True, exist_ok=True)
    labels = list(labels) if labels else labels_for([Path(f) for f in folders])
    runs = [load_folder(Path(f), label, mapping) for f, label in zip(folders, labels)]
    reference = reference or runs[0].baseline or default_reference
    pairs = [make_pair(a, b, reference) for a, b in zip(runs, runs[1:])]
    table = compare_pairs(pairs, rule)
    table.to_csv(paths.table, index=False)
    log = Path(log) if log else paths.out / "changelog.jsonl"
    changelog.append(log, pairs, table)
    if charts:
        from servesweep.sweepcompare.figures import write_figures

        write_figures(table, runs, paths.out)
    text = render(pairs, runs, table, rule, changelog.read(log),
                  command or "python -m servesweep.sweepcompare " + " ".join(map(str, folders)), len(runs) > 2)
    paths.markdown.write_text(text)
    return text
