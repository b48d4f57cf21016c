"""``metrics.jsonl``: one JSON object per line, training intervals and held-out evaluations.

It grows by whole, fsync'ed lines (:func:`elmo_fast.durable.append_line`, which truncates a line
back when its write fails). An append is not atomic, so the last line can still be torn: cut short
by a kill in mid-append, or zeros where a crash of the machine lost the page. Reading therefore
leaves out a last line that is not a JSON object, silently: the resumed run logs its step again.

A bad line anywhere else was not torn by a run: something else wrote to the log. That is an error
naming the line, rather than a line silently dropped, because a resume rewrites the log (it trims
what comes after its checkpoint) and would lose it for good.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..durable import append_line, write_text
from ..errors import InputError

METRICS = "metrics.jsonl"


class MetricsLog:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, record: dict) -> None:
        append_line(self.path, json.dumps(record))

    def lines(self) -> list[tuple[str, dict]]:
        """Each line and its record, a torn last line left out; InputError for a bad line elsewhere."""
        if not self.path.exists():
            return []
        text = self.path.read_text(encoding="utf-8", errors="replace").split("\n")
        if text and text[-1] == "":
            text.pop()
        out = []
        for number, line in enumerate(text, 1):
            try:
                record = json.loads(line)
            except ValueError:
                record = None
            if isinstance(record, dict):
                out.append((line, record))
            elif number < len(text):
                shown = line if len(line) <= 60 else line[:57] + "..."
                raise InputError(
                    f"{self.path} line {number}: not a JSON object ({shown!r}); only the last line can "
                    f"be cut short by a crash, this one was written by something else: remove or mend it, "
                    f"then resume"
                )
        return out

    def records(self) -> list[dict]:
        return [record for _, record in self.lines()]

    def trim(self, step: int) -> None:
        """Keep the records of steps up to ``step`` (a resumed run logs the later ones again), durably."""
        if self.path.exists():
            keep = [line for line, record in self.lines() if record.get("step", 0) <= step]
            write_text(self.path, "".join(line + "\n" for line in keep))

    def has_eval(self, step: int) -> bool:
        return any(r.get("step") == step and "heldout" in r for r in self.records())

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
