"""`localspec bench --peer`'s runs on llama-server: which of localspec's settings it runs too (`peer_settings`,
`same_k`), its own strong settings (`best_peer_settings`: its draft at its default k, 8 and 16, its n-gram pool), and
their runs a round at a time between localspec's own (`run_peer`, tallied in a `PeerTally`; with `bench --image`, each
server also runs the image turns, `PeerImages`). Starting the server is peer.py's; the order of the rounds is run.py's.
"""

from __future__ import annotations

import dataclasses
import functools
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from localspec.core.placement import GpuPlan
from localspec.core.sampling import SamplingParams

from .run import Setting, bar, rotated

if TYPE_CHECKING:
    from .peer import LlamaServer, PeerResult


@dataclass(frozen=True, slots=True)
class PeerSetting:
    """One way llama-server decodes: plain, with its draft model (`draft-simple`), its n-gram pool (`ngram-mod`), or
    both chained ("ngram-mod,draft-simple"); k None: the build's own default draft length."""

    temperature: float
    spec: str = ""  # --spec-type ("": plain)
    k: int | None = 0  # --spec-draft-n-max (0 for plain and the n-gram pool alone; None: the build's default)
    probabilistic: bool | None = False  # --spec-draft-sampling probabilistic (None: a build without the option)
    name: str = "plain"

    @property
    def drafts_with_model(self) -> bool:
        return "draft-simple" in self.spec.split(",")

    @property
    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature)


def peer_settings(settings: list[Setting], *, draft_sampling: bool = True) -> list[Setting]:
    """The settings llama-server can run too: plain and each fixed k (greedy drafting for T 0 and `match`,
    its probabilistic mode for `pq` where the build has `--spec-draft-sampling`)."""
    return [s for s in settings if s.k is not None and (draft_sampling or not _probabilistic(s))]


def same_k(setting: Setting, *, draft_sampling: bool = True) -> PeerSetting:
    """llama-server's run of one of localspec's settings (plain, or a fixed k: see `peer_settings`)."""
    if not setting.k:
        return PeerSetting(setting.temperature)
    return PeerSetting(
        setting.temperature,
        "draft-simple",
        setting.k,
        _probabilistic(setting) if draft_sampling else None,
        name=dataclasses.replace(setting, drafter="").name,  # the peer has one drafter: its draft model
    )


def best_peer_settings(temperatures: Sequence[float], build) -> list[PeerSetting]:
    """llama-server's own strong settings at each temperature (`build`: a `peer.PeerBuild`): its draft at its default
    draft length, at 8 and at 16, its n-gram pool (`ngram-mod`) alone and chained before the draft at 8 — the draft
    verified by rejection sampling at T > 0 where the build has it, as its users would run it."""
    out = []
    for t in temperatures:
        probabilistic = (t > 0) if build.draft_sampling else None
        suffix = " prob" if probabilistic else ""
        for k in dict.fromkeys([build.default_k, 8, 16]):  # the default first, once
            label = f"draft k={k}" if k is not None else "draft"
            label += " (default)" if k == build.default_k else ""
            out.append(PeerSetting(t, "draft-simple", k, probabilistic, name=label + suffix))
        if "ngram-mod" in build.spec_types:
            out.append(PeerSetting(t, "ngram-mod", 0, None, name="ngram-mod"))
            out.append(PeerSetting(t, "ngram-mod,draft-simple", 8, probabilistic, name=f"ngram-mod+draft k=8{suffix}"))
    return out


def needs_draft_sampling(setting: Setting) -> bool:
    """Whether llama-server runs `setting` only with `--spec-draft-sampling probabilistic` (a pq row)."""
    return _probabilistic(setting)


def _probabilistic(setting: Setting) -> bool:
    return bool(setting.k) and setting.temperature > 0 and setting.verify == "pq"


@dataclass(slots=True)
class PeerTally:
    """llama-server's runs of each setting so far: each prompt's tok/s, and the tokens drafted and accepted."""

    rates: dict[PeerSetting, list[float]] = field(default_factory=dict)
    drafted: dict[PeerSetting, list[int]] = field(default_factory=dict)  # [drafted, accepted]

    def result(self) -> dict[PeerSetting, tuple[float, float]]:
        """(median tok/s, acceptance) per setting."""
        return {
            s: (statistics.median(rates), self.drafted[s][1] / self.drafted[s][0] if self.drafted[s][0] else 0.0)
            for s, rates in self.rates.items()
        }

    def add(self, setting: PeerSetting, result: PeerResult) -> None:
        """One completion's figures."""
        self.rates.setdefault(setting, []).append(result.tokens_per_second)
        counts = self.drafted.setdefault(setting, [0, 0])
        counts[0] += result.drafted
        counts[1] += result.accepted


@dataclass(slots=True)
class PeerImages:
    """The image turns llama-server runs beside the text turns (`bench --image`): the projector it starts with, each
    prompt as the text its multimodal `/completion` reads (a media marker where each image goes), the image files in
    the markers' order, their runs' tally, and why it stopped running them ("": it runs them)."""

    mmproj: str
    prompts: list[str]
    files: list[bytes]
    tally: PeerTally = field(default_factory=PeerTally)
    failed: str = ""


def run_peer(
    binary: Path,
    target: str,
    draft: str,
    prompts: list[list[int]],
    settings: list[PeerSetting],
    *,
    tokens: int,
    rounds: range,
    threads: int,
    n_ctx: int,
    placed: GpuPlan | None,
    progress: Callable[[str], None],
    tally: PeerTally | None = None,
    images: PeerImages | None = None,
) -> PeerTally:
    """llama-server's runs of each setting in each of `rounds` (one alone between localspec's own), one server per
    setting and round, every prompt (and every image turn of `images`, on the same server); added to `tally` where
    given (the rounds before). A server that does not start with the projector, or fails an image turn, runs the text
    turns alone from then on (`images.failed` says why)."""
    tally = PeerTally() if tally is None else tally
    done = 0
    for round_ in rounds:
        for setting in rotated(settings, round_):  # one server per setting and round: the whole prompt list
            server, mmproj = _start(binary, target, draft, setting, threads, n_ctx, placed, images)
            try:
                sp = setting.sampling
                ask = functools.partial(
                    server.complete, n_predict=tokens, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p,
                    min_p=sp.min_p,
                )  # fmt: skip
                for p, prompt in enumerate(prompts):
                    tally.add(setting, ask(prompt, seed=1000 * round_ + p))
                if mmproj and images is not None:
                    _image_turns(ask, images, setting, round_)
            finally:
                server.stop()
            done += 1
            progress(f"{bar(done, len(rounds) * len(settings))} llama-server {setting.name}, round {round_ + 1}")
    return tally


def _image_turns(ask: Callable[..., PeerResult], images: PeerImages, setting: PeerSetting, round_: int) -> None:
    """Every image turn on one started server (`ask`: its `complete`), until one fails."""
    from .peer import PeerError

    for p, text in enumerate(images.prompts):
        try:
            result = ask(text, images=images.files, seed=1000 * round_ + p)
        except PeerError as e:
            images.failed = f"an image turn failed: {e}"
            return
        images.tally.add(setting, result)


def _start(
    binary: Path,
    target: str,
    draft: str,
    setting: PeerSetting,
    threads: int,
    n_ctx: int,
    placed: GpuPlan | None,
    images: PeerImages | None,
) -> tuple[LlamaServer, bool]:
    """One started server for `setting`, with the projector while `images` still run; a server that does not start
    with it is started again without it (the image turns stop). Returns (the server, whether it reads images)."""
    from .peer import LlamaServer, PeerError

    def start(mmproj: str | None) -> LlamaServer:
        server = LlamaServer(
            binary,
            target,
            draft if setting.drafts_with_model else None,
            k=setting.k,
            probabilistic=setting.probabilistic,
            spec=setting.spec,
            threads=threads,
            n_ctx=n_ctx,
            placed=placed,
            mmproj=mmproj,
        )
        try:
            server.start()
        except BaseException:
            server.stop()
            raise
        return server

    if images is None or images.failed:
        return start(None), False
    try:
        return start(images.mmproj), True
    except PeerError as e:
        server = start(None)  # a failure here is the peer's own: the caller says so
        images.failed = f"it did not start with --mmproj: {e}"
        return server, False
