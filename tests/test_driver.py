"""One generation's driver (api/driver.py) on a fake target whose tokens are words: the deltas
add up to the result's text and tokens, each with its tokens' logprobs; an end-of-generation
token ends the answer (finish "eos") and its logprob is kept beside it (the result's
end_logprob, and in to_dict); max_tokens and a stop string end it too. The answer is the
target alone's whatever was drafted."""

from __future__ import annotations

import numpy as np
from fake_model import FakeLlama, FakeModel, make_target

from edge_spec.api import GenerationConfig
from edge_spec.api.driver import Generation, deltas
from edge_spec.constrain.tools import HERMES
from edge_spec.drafts import NgramDraft, NoDraft
from edge_spec.policy.simple import FixedK

PROMPT = [1, 2, 3, 1, 2, 4, 1, 2, 3]


class WordLlama(FakeLlama):
    """Token t reads "w<t> "; `end` is the end-of-generation token."""

    def __init__(self, model: FakeModel, end: int = -1) -> None:
        super().__init__(model)
        self.end = end

    def token_bytes(self, token: int) -> bytes:
        return f"w{token} ".encode()

    def is_eog(self, token: int) -> bool:
        return token == self.end


def _run(model: FakeModel, cfg: GenerationConfig, end: int = -1, k: int = 3) -> list:
    source = NgramDraft(max_ngram=2) if k else NoDraft()
    run = Generation(
        WordLlama(model, end),
        {source.name: source, "none": NoDraft()},
        FixedK(k),
        cfg,
        "ngram" if k else "none",
        HERMES,
        target_name="fake",
    )
    return list(deltas(run, PROMPT))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


def test_deltas_add_up_and_an_end_token_ends_the_answer_with_its_logprob() -> None:
    model = make_target()
    alone = _run(model, GenerationConfig(max_tokens=24), k=0)[-1].result
    assert alone is not None and alone.finish_reason == "length"
    tokens = list(alone.token_ids)
    # The end token: one the target first chooses after a few tokens.
    at = next(i for i in range(3, len(tokens)) if tokens[i] not in tokens[:i])
    end = tokens[at]
    got = _run(model, GenerationConfig(max_tokens=24, logprobs=2), end=end)
    result = got[-1].result
    assert result is not None and result.finish_reason == "eos" and result.stats.n_accepted > 0
    assert list(result.token_ids) == tokens[:at]
    assert "".join(d.text for d in got) == result.text == "".join(f"w{t} " for t in tokens[:at])
    assert [t for d in got for t in d.token_ids] == tokens[:at]
    assert all(len(d.logprobs) == len(d.token_ids) for d in got)
    log_p = _log_softmax(model.logits(PROMPT + tokens[:at]))
    assert result.end_logprob is not None and result.end_logprob.token_id == end
    assert abs(result.end_logprob.logprob - log_p[end]) < 1e-5
    assert result.to_dict()["end_logprob"]["token_id"] == end

    cut = _run(model, GenerationConfig(max_tokens=2, logprobs=0), end=end)[-1].result
    assert cut is not None and cut.finish_reason == "length" and cut.end_logprob is None
    assert "end_logprob" not in cut.to_dict() and len(cut.token_ids) == 2
    stop = f"w{tokens[2]} "
    stopped = _run(model, GenerationConfig(max_tokens=24, stop=(stop,)))[-1].result
    assert stopped is not None and stopped.finish_reason == "stop"
    assert stopped.stop_string == stop and stop not in stopped.text
