"""Which quantization of SmolLM2-135M-Instruct still answers like itself, and how small it gets.

Each variant is made from the F16 (which carries the Q4_1 release's values) with llama.cpp's
quantizer; its top-1 agreement with the F16 is read along the F16's own greedy chat answers
(teacher-forced: one batched pass per answer, 12 prompts of the bench set, 64 tokens each).

    .venv/bin/python bench/results/issue38-full-depth-model/agreement.py
"""

import ctypes
import tempfile
from pathlib import Path

import edge_spec  # noqa: F401  (llama.cpp's libraries before numpy)

# isort: split
import llama_cpp
import numpy as np

from edge_spec import EdgeSpec, EngineConfig
from edge_spec.backend import LlamaModel
from edge_spec.models import resolve
from edge_spec.prompts import load_prompts

F16 = resolve("smollm2-135m-f16", progress=False)
Q4_0, Q8_0 = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0
VARIANTS = {  # name: (ftype, token embedding type or None, pure)
    "q8_0": (Q8_0, None, False),
    "q4_0 (token embedding q8_0)": (Q4_0, None, False),
    "q4_0, token embedding q5_0": (
        llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
        llama_cpp.GGML_TYPE_Q5_0,
        False,
    ),
    "q4_0, token embedding q4_1": (
        llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0,
        llama_cpp.GGML_TYPE_Q4_1,
        False,
    ),
    "q4_0 pure (the GPU check's)": (Q4_0, None, True),
}


def quantize(dst: Path, ftype: int, embd: int | None, pure: bool) -> Path:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.allow_requantize, params.pure, params.nthread = ftype, True, pure, 2
    if embd is not None:
        params.token_embedding_type = params.output_tensor_type = embd
    assert (
        llama_cpp.llama_model_quantize(str(F16).encode(), str(dst).encode(), ctypes.byref(params))
        == 0
    )
    return dst


def rows(path: Path, answers: list[tuple[list[int], list[int]]]) -> list[np.ndarray]:
    out = []
    with LlamaModel(path, n_ctx=1024) as model:
        for ids, answer in answers:
            model.reset()
            model.decode(ids[:-1])
            seq = [ids[-1], *answer[:-1]]
            out.append(model.decode(seq, range(len(seq))).copy())
    return out


prompts = load_prompts()[::4]
with EdgeSpec(str(F16), config=EngineConfig(n_ctx=1024)) as spec:
    answers = []
    for p in prompts:
        text = spec.render_chat(list(p.messages))
        result = spec.generate(text, max_tokens=64, temperature=0, draft_mode="none")
        answers.append((spec.tokenize(text), list(result.token_ids)))
reference = rows(F16, answers)
with tempfile.TemporaryDirectory() as tmp:
    for i, (name, how) in enumerate(VARIANTS.items()):
        path = quantize(Path(tmp) / f"v{i}.gguf", *how)
        got = rows(path, answers)
        agree = np.concatenate([r.argmax(1) == g.argmax(1) for r, g in zip(reference, got)])
        print(
            f"{name:30s} {path.stat().st_size / 2**20:6.1f} MiB  top-1 agreement with the F16 "
            f"along its greedy answers {agree.mean():.3f} ({agree.size} positions)"
        )
