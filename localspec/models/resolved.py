"""`ResolvedPair`: what to load, as every entry point (generate, bench, the chat) resolves it.

A small module of its own so that loading plain --target/--draft files imports neither the Hub client nor
models.toml's schema.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from localspec.core.params import PairDefaults


@dataclass(frozen=True, slots=True)
class ResolvedPair:
    """What to load, for every entry point: local paths, the defaults that come with them, and what to show.

    A models.toml pair or --target/--draft/--mmproj files (then `name` is None and `defaults` are empty).
    """

    target: Path
    draft: Path | None  # None: a target alone (plain or n-gram drafting)
    label: str  # what the chat's header shows: the pair's name, or the file names
    name: str | None  # the pair's name in models.toml
    defaults: PairDefaults = PairDefaults()  # its settings, compatibility hint and notice (e.g. the demo stands in)
    mmproj: Path | None = None  # the target's projector (images, audio); None: the pair reads text only

    @classmethod
    def files(cls, target: str | Path, draft: str | Path | None, mmproj: str | Path | None = None) -> ResolvedPair:
        """--target/--draft/--mmproj: files with no pair around them."""
        target, draft = Path(target), Path(draft) if draft else None
        label = target.name + (f" + {draft.name}" if draft else "")
        return cls(target, draft, label, None, mmproj=Path(mmproj) if mmproj else None)
