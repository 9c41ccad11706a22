"""Version strings as comparable tuples."""
from __future__ import annotations

import re


def version_tuple(version: str | None) -> tuple[int, ...]:
    """(0, 5, 23) from '0.5.23', '0.5.23.post1' or '0.5.23rc0'; () when there is no leading number."""
    parts = []
    for part in str(version or "").split(".")[:3]:
        m = re.match(r"\d+", part)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)
