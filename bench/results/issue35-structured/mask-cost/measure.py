"""Mask cost per token, llguidance against XGrammar, on both registry vocabularies: the bench's
eight extraction schemas (edge_spec/bench/structured.json), each walked along a real answer
(the chat pair's constrained target's own, from an `edge-spec bench --structured` run, its text
re-tokenized for Gemma-3), one mask per position. Kept beside its results because it ran once
to choose the engine; XGrammar needs torch and transformers, so it runs in a venv of its own.

    .venv/bin/python bench/results/issue35-structured/mask-cost/measure.py dump RUN_FOLDER OUT.json
    .venv/bin/python bench/results/issue35-structured/mask-cost/measure.py llguidance OUT.json
    XG_VENV/bin/python bench/results/issue35-structured/mask-cost/measure.py xgrammar OUT.json
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def dump(run_folder: str, out: str) -> None:
    """Vocabularies (token bytes, end tokens) and the answers' token ids per model."""
    import edge_spec  # noqa: F401  (llama.cpp before numpy)
    from edge_spec.backend import LlamaModel
    from edge_spec.bench.structured import load_tasks
    from edge_spec.models import resolve

    record = json.loads((Path(run_folder) / "results.json").read_text())
    schemas = {t.id: t.schema for t in load_tasks(["extraction"])}
    data: dict = {"schemas": schemas, "models": {}}
    answers: dict[str, str] = {}
    with LlamaModel(resolve("smollm2-135m-f16"), n_ctx=256) as smol:
        for run in record["runs"]:
            task = run["prompt_id"].split("/")[0]
            if run["strategy"] == "target" and task in schemas and task not in answers:
                answers[task] = smol.detokenize(run["token_ids"])
    for name in ("smollm2-135m-f16", "gemma3-270m-f16"):
        with LlamaModel(resolve(name), n_ctx=256) as model:
            pieces = [model.token_bytes(t).hex() for t in range(model.n_vocab)]
            ids = {k: model.tokenize(v, add_special=False) for k, v in answers.items()}
            data["models"][name] = {
                "pieces": pieces,
                "eos": [model.info.eos_id],
                "answers": ids,
            }
    Path(out).write_text(json.dumps(data))


def run_llguidance(dumped: str) -> dict:
    """llguidance through edge_spec's own bridge (the target's llama.cpp vocabulary)."""
    import edge_spec  # noqa: F401
    import numpy as np
    from llguidance import LLMatcher

    from edge_spec.backend import LlamaModel
    from edge_spec.backend.grammar_vocab import grammar_tokenizer
    from edge_spec.models import resolve

    data = json.loads(Path(dumped).read_text())
    out = {}
    for name, model in data["models"].items():
        llama = LlamaModel(resolve(name), n_ctx=256)  # open while its tokenizer is used
        tokenizer = grammar_tokenizer(llama)
        bits = np.zeros((len(model["pieces"]) + 31) // 32, dtype=np.int32)

        def make(schema):
            grammar = LLMatcher.grammar_from_json_schema(schema, defaults=OPTIONS)
            return LLMatcher(tokenizer, grammar)

        out[name] = _walk(
            data,
            model,
            make,
            lambda m: m.unsafe_compute_mask_ptr(bits.ctypes.data, bits.nbytes),
            lambda m, t: m.consume_token(t),
        )
        llama.close()
    return out


def run_xgrammar(dumped: str) -> dict:
    import xgrammar as xgr

    data = json.loads(Path(dumped).read_text())
    out = {}
    for name, model in data["models"].items():
        tokens = [bytes.fromhex(p) for p in model["pieces"]]
        info = xgr.TokenizerInfo(tokens, xgr.VocabType.RAW, stop_token_ids=model["eos"])
        compiler = xgr.GrammarCompiler(info)
        bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)

        def make(schema):
            compiled = compiler.compile_json_schema(
                json.dumps(schema), any_whitespace=False, separators=(", ", ": ")
            )
            return xgr.GrammarMatcher(compiled)

        out[name] = _walk(
            data,
            model,
            make,
            lambda m: m.fill_next_token_bitmask(bitmask),
            lambda m, t: m.accept_token(t),
        )
    return out


def _walk(data, model, make, mask, consume) -> dict:
    compile_ms, mask_us = [], []
    for task, schema in data["schemas"].items():
        ids = model["answers"].get(task)
        if not ids:
            continue
        t0 = time.perf_counter()
        matcher = make(schema)
        compile_ms.append(1e3 * (time.perf_counter() - t0))
        for token in ids:
            t0 = time.perf_counter()
            mask(matcher)
            mask_us.append(1e6 * (time.perf_counter() - t0))
            if not consume(matcher, token):
                break
    mask_us.sort()
    return {
        "schemas": len(compile_ms),
        "positions": len(mask_us),
        "compile_ms_median": round(statistics.median(compile_ms), 2),
        "mask_us_median": round(statistics.median(mask_us), 1),
        "mask_us_p90": round(mask_us[int(0.9 * len(mask_us))], 1),
        "mask_us_mean": round(statistics.fmean(mask_us), 1),
    }


if __name__ == "__main__":
    what = sys.argv[1]
    if what == "dump":
        dump(sys.argv[2], sys.argv[3])
    else:
        result = run_llguidance(sys.argv[2]) if what == "llguidance" else run_xgrammar(sys.argv[2])
        print(json.dumps({what: result}, indent=1))
