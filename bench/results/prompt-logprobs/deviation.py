"""A prompt's logprobs (GenerationConfig.prompt_logprobs, the server's echo) against
llama-cpp-python's logits_all (the whole prompt in one batch), per model and prompt length:
the largest difference, and whether the answer after scoring is the answer without it.

    .venv/bin/python bench/results/prompt-logprobs/deviation.py
"""

import numpy as np
from llama_cpp import Llama

from edge_spec import EdgeSpec, EngineConfig
from edge_spec.models.cache import resolve

SENTENCE = "The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon, and"

for name in ("smollm2-135m-f16", "gemma3-270m-q4_0"):
    path = resolve(name, progress=False)
    llm = Llama(str(path), n_ctx=512, n_threads=2, logits_all=True, verbose=False)
    with EdgeSpec(path, config=EngineConfig(n_ctx=512)) as spec:
        for repeats in (1, 4):
            text = " ".join([SENTENCE] * repeats)
            ids = spec.tokenize(text)
            plain = spec.generate(text, max_tokens=8, temperature=0)
            scored = spec.generate(text, max_tokens=8, temperature=0, prompt_logprobs=0)
            ours = np.array([t.logprob for t in scored.prompt_logprobs[1:]])
            llm.reset()
            llm.eval(ids)
            logits = np.array(llm.scores[: len(ids)], dtype=np.float64)
            log_z = logits.max(1) + np.log(np.exp(logits - logits.max(1)[:, None]).sum(1))
            reference = np.array([logits[i, ids[i + 1]] - log_z[i] for i in range(len(ids) - 1)])
            print(
                f"{name}: {len(ids)} tokens, largest |difference| "
                f"{np.abs(ours - reference).max():.4f}, same answer: "
                f"{scored.token_ids == plain.token_ids}"
            )
