"""llama.cpp's own sampler chains: `ChainLawBuilder`, which builds the target's law at T > 0 on a CPU context, and
`NativeSampler`, the chain as llama-server runs it (the yardstick `localspec bench` times our sampling against).

llama.cpp samples a row by copying it into an array of n_vocab candidates (in C) and running a chain over it. Right
after a decode on a CPU that is much cheaper than anything Python does: the decode streamed the weights through the
caches, and every numpy call then pays cold misses (docs/benchmarks.md "Where the Python time goes"). So where no
sampler runs in the graph, the target's law at T > 0 with top-k on is llama.cpp's chain: top-k, temperature, top-p,
min-p — our law's order (DESIGN §2) — then its `dist` draw. A plain step is that one native call. A verified row
needs the law itself: the same chain ends in a capture sampler instead of `dist`, and the law is rebuilt from the
survivors exactly as `dist` computes it (its float32 weights expf(l − l_max), summed in double), so a drawn token and
a verified one come from the same law, bit for bit (tests/llama/test_chain_law.py compares it with what `dist`
itself writes).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import math
import os
import struct
from collections.abc import Callable

import llama_cpp

from localspec.errors import NonFiniteLogitsError

from .context import Context

_TOKEN_DATA = struct.Struct("<iff")  # llama_token_data: int32 id, float logit, float p
assert _TOKEN_DATA.size == ctypes.sizeof(llama_cpp.llama_token_data)
# llama_token_data_array as three 64-bit words: data, size, selected (then `sorted`)
_ARRAY_HEAD = ctypes.POINTER(ctypes.c_uint64)
assert [f.offset for f in (llama_cpp.llama_token_data_array.size, llama_cpp.llama_token_data_array.selected)] == [8, 16]
_APPLY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, _ARRAY_HEAD)  # apply(sampler, token data array)
MAX_TOP_K = 128  # llama.cpp's top-k is one std::partial_sort up to here (a bucket pass beyond)


def _libm_expf():
    """The C library's expf, which llama.cpp's `dist` sampler calls for each weight (None where it cannot be found:
    the law then stays with numpy)."""
    name = ctypes.util.find_library("m") or ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        expf = ctypes.CDLL(name).expf
    except (OSError, AttributeError):
        return None
    expf.restype, expf.argtypes = ctypes.c_float, [ctypes.c_float]
    return expf


_EXPF = _libm_expf()


CHAIN_LAW_ENV = "LOCALSPEC_CHAIN_LAW"  # "off": numpy builds the target's law everywhere (to compare the two)


def chain_law_available() -> bool:
    """Whether `ChainLawBuilder` may build the target's law: the C library's expf was found (to rebuild `dist`'s
    weights) and $LOCALSPEC_CHAIN_LAW is not "off"."""
    return _EXPF is not None and os.environ.get(CHAIN_LAW_ENV, "on") != "off"


class _Capture:
    """A sampler for the end of a chain: it keeps where the survivors lie and selects the first (a chain must select
    one). The survivors stay in the chain's own buffer until its next use.

    Its callback takes the array as a pointer to 64-bit words, not as a ctypes structure: building those on every
    row cost about a third of the chain's own pass right after a decode (49,152 tokens: 25 µs of 67), and reading
    the words through `string_at` cost 2–4 µs more per row than this.
    """

    def __init__(self) -> None:
        self.data, self.size = 0, 0  # where the survivors of the last row lie (in the chain's own buffer), how many
        self._callback = _APPLY(self._on_apply)  # the callbacks live as long as the sampler
        self._apply = ctypes.cast(self._callback, llama_cpp.llama_sampler_i_apply)
        self._name = llama_cpp.llama_sampler_i_name(lambda _smpl: b"localspec-capture")
        self._iface = llama_cpp.llama_sampler_i(name=self._name, apply=self._apply)
        self.handle = llama_cpp.llama_sampler_init(ctypes.pointer(self._iface), None)

    def _on_apply(self, _smpl: int, head) -> None:
        # The array itself lives on llama_sampler_sample's stack: read where its data lies now, not later.
        self.data, self.size = head[0], head[1]
        head[2] = 0  # selected: the first survivor

    def survivors(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """The survivors' ids and logits, in the chain's order (best first after top-k)."""
        fields = self._fields()
        return fields[0::3], fields[1::3]

    def probabilities(self) -> tuple[float, ...]:
        """The survivors' p fields (what a `dist` before this sampler wrote), in the same order."""
        return self._fields()[2::3]

    def _fields(self) -> tuple:
        """(id, logit, p) of each survivor, one after another: one unpack of the chain's buffer."""
        unpack = _UNPACK.get(self.size)
        if unpack is None:
            unpack = _UNPACK[self.size] = struct.Struct("<" + "iff" * self.size).unpack
        return unpack(ctypes.string_at(self.data, _TOKEN_DATA.size * self.size))


_UNPACK: dict[int, Callable[[bytes], tuple]] = {}  # survivors' count -> the unpacker of that many llama_token_data


def _chain(links: list) -> object:
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    for link in links:
        llama_cpp.llama_sampler_chain_add(chain, link)  # the chain owns its links from here on
    return chain


class ChainLawBuilder:
    """Builds the law llama.cpp's chain (top-k, temperature, top-p, min-p) gives a row, and draws from it (`dist`).

    For contexts with no sampler in their graph (`Context.device_greedy` off: llama.cpp would hand back the graph's
    token). One per generation: `dist` keeps its own random state, seeded here. `close()` frees both chains.
    """

    def __init__(self, *, temperature: float, top_k: int, top_p: float, min_p: float, seed: int) -> None:
        assert temperature > 0 and 0 < top_k <= MAX_TOP_K and _EXPF is not None

        def filters() -> list:
            return [
                llama_cpp.llama_sampler_init_top_k(top_k),
                llama_cpp.llama_sampler_init_temp(temperature),
                llama_cpp.llama_sampler_init_top_p(top_p, 1),
                llama_cpp.llama_sampler_init_min_p(min_p, 1),
            ]

        self._capture = _Capture()
        self._draw = _chain([*filters(), llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF)])
        self._law = _chain([*filters(), self._capture.handle])

    def draw(self, ctx: Context, i: int) -> int:
        """A token from row `i`'s law, drawn by llama.cpp (one native call).

        Raises:
            NonFiniteLogitsError: the drawn token's logit is NaN or infinite (a row of NaN, as damaged weights give;
                a NaN elsewhere in the row is not looked for: that would be a second pass over it).
        """
        handle = ctx.handle
        token = llama_cpp.llama_sampler_sample(self._draw, handle, i)  # an int (ctypes' c_int32 result)
        # The drawn logit through llama.cpp's own pointer, not a numpy view (`ctx.logits`): right after a decode the
        # view's lookup and numpy's scalar cost ~25 µs more, the whole gap to llama.cpp's chain on a plain step.
        if not math.isfinite(llama_cpp.llama_get_logits_ith(handle, i)[token]):
            raise NonFiniteLogitsError()
        return token

    def law(self, ctx: Context, i: int) -> tuple[tuple[int, ...], list[float]]:
        """Row `i`'s law as `dist` draws from it: (token ids, their probabilities), best first, in Python floats — a
        few values, and a numpy call costs more than the whole walk right after a decode.

        `dist` weighs the survivors, sorted best first, by float32 expf(l − l_0) and draws against their running sum
        in double; the same operations here give the same numbers.
        """
        llama_cpp.llama_sampler_sample(self._law, ctx.handle, i)
        ids, logits = self._capture.survivors()
        # A few values (top-k), all looked at: their sum in double is finite exactly when each is (float32 values
        # cannot overflow it; a NaN or an infinity carries through), one C loop instead of a generator.
        if not ids or not math.isfinite(sum(logits)):
            raise NonFiniteLogitsError()
        if len(ids) == 1:
            return ids, [1.0]
        best = logits[0]
        weights = [_EXPF(logit - best) for logit in logits]  # ctypes rounds the difference to float32
        total = 0.0
        for weight in weights:  # in order, in double: dist's sum
            total += weight
        return ids, [weight / total for weight in weights]

    def close(self) -> None:
        """Free both chains (idempotent)."""
        for name in ("_draw", "_law"):
            chain = getattr(self, name, None)
            if chain is not None:
                llama_cpp.llama_sampler_free(chain)
                setattr(self, name, None)

    def __del__(self) -> None:  # a drafter's chain lives as long as the drafter: freed with it
        with contextlib.suppress(Exception):  # at interpreter shutdown the module may be gone already
            self.close()


class NativeSampler:
    """llama.cpp's sampler chain for one set of sampling settings; `close()` frees it."""

    def __init__(
        self,
        *,
        temperature: float,
        top_k: int,
        top_p: float,
        min_p: float,
        repeat_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
        repeat_last_n: int = 64,
        seed: int = 0,
    ) -> None:
        self._chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        links = []
        if repeat_penalty != 1.0 or frequency_penalty or presence_penalty:
            links.append(
                llama_cpp.llama_sampler_init_penalties(
                    repeat_last_n, repeat_penalty, frequency_penalty, presence_penalty
                )
            )
        if temperature <= 0:
            links.append(llama_cpp.llama_sampler_init_greedy())
        else:
            if top_k > 0:
                links.append(llama_cpp.llama_sampler_init_top_k(top_k))
            links += [
                llama_cpp.llama_sampler_init_top_p(top_p, 1),
                llama_cpp.llama_sampler_init_min_p(min_p, 1),
                llama_cpp.llama_sampler_init_temp(temperature),
                llama_cpp.llama_sampler_init_dist(seed & 0xFFFFFFFF),
            ]
        for link in links:
            llama_cpp.llama_sampler_chain_add(self._chain, link)  # the chain owns its links from here on

    def sample(self, ctx: Context, i: int = -1) -> int:
        """A token for row `i` of `ctx`'s last decode, as llama.cpp samples it (the chain then counts it as seen).

        On a context that samples in the graph (`device_greedy`) llama.cpp hands back the graph's token instead.
        """
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx.handle, i))

    def close(self) -> None:
        """Free the chain (idempotent)."""
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None

    def __enter__(self) -> NativeSampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
