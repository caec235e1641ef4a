"""Scoring the choices of one question, as lm-evaluation-harness's loglikelihood requests do
(context + choice, prompt logprobs, one token generated): with the rows of the last scored
prompt kept (the default) against scoring every prompt from its start, interleaved question by
question on one engine. Prints the time per question, the ratio, and the largest difference
between the two runs' logprobs.

    .venv/bin/python bench/results/prompt-logprobs/shared_prefix.py
"""

import statistics
import time

from edge_spec import EdgeSpec, EngineConfig
from edge_spec.decode.logprobs import PromptScores
from edge_spec.models.cache import resolve

TOPICS = ["rivers", "volcanoes", "bridges", "comets", "forests", "deserts", "glaciers", "tides"]
CHOICES = [" the first answer.", " a second, longer answer than that.", " no.", " all of them."]


def context(topic: str, n_sentences: int) -> str:
    return " ".join(
        f"Sentence {i} of a passage about {topic}: it says something true about {topic}."
        for i in range(n_sentences)
    ) + " Question: which is right? Answer:"


for name in ("smollm2-135m-f16", "gemma3-270m-f16"):
    with EdgeSpec(resolve(name, progress=False), config=EngineConfig(n_ctx=2048)) as spec:
        for n_sentences in (4, 16):
            times: dict[bool, list[float]] = {True: [], False: []}
            worst = 0.0
            for topic in TOPICS:
                ids = spec.tokenize(context(topic, n_sentences))
                scored: dict[bool, list[float]] = {}
                for keep in (True, False):
                    spec._scores = PromptScores() if keep else None  # noqa: SLF001 - the switch
                    t0 = time.perf_counter()
                    values = []
                    for choice in CHOICES:
                        prompt = ids + spec.target.tokenize(choice, add_special=False)
                        done = spec.generate(prompt, max_tokens=1, temperature=0, prompt_logprobs=1)
                        values += [t.logprob for t in done.prompt_logprobs[1:]]
                    times[keep].append(time.perf_counter() - t0)
                    scored[keep] = values
                worst = max(worst, max(abs(a - b) for a, b in zip(scored[True], scored[False])))
            kept, fresh = statistics.median(times[True]), statistics.median(times[False])
            print(
                f"{name}: context {len(ids)} tokens, 4 choices: {kept:.3f} s per question with "
                f"the rows kept, {fresh:.3f} s without ({fresh / kept:.2f}x); "
                f"largest |logprob difference| {worst:.4f}"
            )
