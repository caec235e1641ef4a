"""A draft head on the target's own hidden states, run by ONNX Runtime.

The engine hands the head the target's final hidden state of the row that chose the newest
token (observe()); the head reads it with that token's embedding and proposes the next token,
then chains on its own predicted hidden state for k > 1 (EAGLE's scheme). Its distribution is
over a reduced vocabulary mapped back to target ids; outside it p_draft is zero. At T = 0 it
proposes its argmax; at T > 0 it draws with the request's keys for that position from its
distribution over the full vocabulary, so that it agrees with the target's own keyed draw as
often as the two distributions allow. Verification is the target's own, so the output is the
target's whatever the head proposes.

The head drafts only from a hidden state of this context: the first step of a request (the
prompt's last token has no hidden state yet: prefill computes none) proposes nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from edge_spec.drafts.base import NO_DRAFT, Draft, KeepDrafting
from edge_spec.errors import ModelFileError
from edge_spec.models.heads import GRAPH_NAME, HeadInfo, TargetEmbeddings, load_info
from edge_spec.sampling.keys import SampleKeys
from edge_spec.sampling.transform import SamplingParams

log = logging.getLogger(__name__)

# Execution providers in order of preference, where this onnxruntime build has them.
PREFERRED_PROVIDERS = (
    "CUDAExecutionProvider",
    "CoreMLExecutionProvider",
    "DmlExecutionProvider",
    "OpenVINOExecutionProvider",
    "QNNExecutionProvider",
    "CPUExecutionProvider",
)


# One head step: (hidden state, newest token) -> (logits over the reduced vocabulary, the
# predicted next hidden state).
HeadStep = Callable[[np.ndarray, int], tuple[np.ndarray, np.ndarray]]


class HeadDraft:
    name = "head"
    vocabulary = "shared"
    wants_hidden = True  # the engine asks the target for hidden states and calls observe()

    def __init__(
        self, step: HeadStep, vocab_ids: Sequence[int], n_target_vocab: int, provider: str = ""
    ) -> None:
        self._step = step
        self.vocab_ids = np.asarray(vocab_ids, dtype=np.int64)
        if self.vocab_ids.size == 0 or self.vocab_ids.min() < 0:
            raise ModelFileError("a draft head needs a non-empty reduced vocabulary")
        if self.vocab_ids.max() >= n_target_vocab:
            raise ModelFileError("the draft head has token ids outside the target's vocabulary")
        self.n_target_vocab = n_target_vocab
        self.provider = provider  # the onnxruntime execution provider it runs on
        self.decode_s = 0.0  # seconds inside the head, ever (the engine's draft time)
        self._hidden: np.ndarray | None = None
        self._n_context = -1
        self._full = np.full(n_target_vocab, -np.inf, dtype=np.float32)
        self.token_s = 0.0  # one head step's cost here (load() measures it)
        self.info: HeadInfo | None = None  # how it was trained (a head loaded from the cache)

    @classmethod
    def load(cls, directory: Path, target_path: Path, n_target_vocab: int) -> HeadDraft:
        """The head `edge-spec head train` stored in `directory`, run by onnxruntime on the
        best execution provider present, with its cost per step measured now."""
        import onnxruntime as ort

        info = load_info(directory)
        embeddings = TargetEmbeddings(target_path)
        if embeddings.n_embd != info.n_embd:
            raise ModelFileError(
                f"the head in {directory} reads {info.n_embd}-wide hidden states; "
                f"the target's are {embeddings.n_embd}"
            )
        options = ort.SessionOptions()
        # One thread: the head is a few small matrix products, and llama.cpp holds the cores.
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        available = ort.get_available_providers()
        providers = [p for p in PREFERRED_PROVIDERS if p in available]
        graph = directory / GRAPH_NAME
        try:
            session = ort.InferenceSession(str(graph), options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own exception types
            raise ModelFileError(f"onnxruntime cannot load {graph}: {exc}") from exc

        inputs = [tuple(i.shape) for i in session.get_inputs()]
        outputs = [tuple(o.shape) for o in session.get_outputs()]
        want_in = [("N", info.n_embd)] * 2
        want_out = [("N", len(info.vocab_ids)), ("N", info.n_embd)]
        if [i[1:] for i in inputs] != [w[1:] for w in want_in] or [o[1:] for o in outputs] != [
            w[1:] for w in want_out
        ]:
            raise ModelFileError(
                f"{graph} takes {inputs} and gives {outputs}; head.json describes "
                f"{want_in} -> {want_out}"
            )

        def step(hidden: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
            feeds = {"hidden": hidden[None], "embed": embeddings.rows([token])}
            logits, feature = session.run(None, feeds)
            return logits[0], feature[0]

        head = cls(step, info.vocab_ids, n_target_vocab, session.get_providers()[0])
        head.info = info
        head.token_s = head.token_cost_s(info.n_embd)
        head.decode_s = 0.0
        return head

    def begin(self, prompt: Sequence[int]) -> None:
        self._hidden = None

    def observe(self, n_context: int, hidden: np.ndarray) -> None:
        """The target's hidden state of the row that chose the context's last token, the
        context now being n_context tokens long."""
        self._hidden = hidden
        self._n_context = n_context

    def run(self, hidden: np.ndarray, token: int) -> tuple[np.ndarray, np.ndarray]:
        """One head step: (logits over the reduced vocabulary, predicted next hidden state)."""
        t0 = time.perf_counter()
        out = self._step(hidden, token)
        self.decode_s += time.perf_counter() - t0
        return out

    def propose(
        self,
        context: Sequence[int],
        k: int,
        params: SamplingParams,
        keys: SampleKeys,
        keep_drafting: KeepDrafting | None = None,
    ) -> Draft:
        if k <= 0 or self._hidden is None or self._n_context != len(context):
            return NO_DRAFT
        hidden, token = self._hidden, int(context[-1])
        tokens: list[int] = []
        confidences: list[float] = []
        alternates: list[tuple[int, int, float]] = []
        for i in range(k):
            logits, hidden = self.run(hidden, token)
            if params.greedy:
                best = int(logits.argmax())
                token = int(self.vocab_ids[best])
                shifted = np.exp(logits - logits[best], dtype=np.float64)
                confidence = float(1.0 / shifted.sum())
            else:
                full = self._full
                full[self.vocab_ids] = logits
                token, confidence = keys.draw(full, params, len(context) + i)
                full[self.vocab_ids] = -np.inf
            tokens.append(token)
            confidences.append(confidence)
            alternates.append(self._runner_up(i, logits, token, params))
            if i + 1 == k or (keep_drafting is not None and not keep_drafting(i, confidence)):
                break
        return Draft(tuple(tokens), tuple(confidences), alternates=tuple(alternates))

    def _runner_up(
        self, i: int, logits: np.ndarray, chosen: int, params: SamplingParams
    ) -> tuple[int, int, float]:
        """The head's most probable token other than the one it proposed at position i, with
        its probability (at the request's temperature): a token tree's one-token branch."""
        top2 = np.argpartition(logits, -2)[-2:]
        first, second = sorted(top2.tolist(), key=lambda j: -float(logits[j]))
        other = second if int(self.vocab_ids[first]) == chosen else first
        scale = 1.0 if params.greedy else 1.0 / params.temperature
        z = (logits.astype(np.float64) - float(logits.max())) * scale
        weight = float(np.exp(z[other]) / np.exp(z).sum())
        return i, int(self.vocab_ids[other]), weight

    def token_cost_s(self, n_embd: int, repeats: int = 64) -> float:
        """Median seconds of one head step here (embedding row + onnxruntime), for profiles."""
        hidden = np.zeros(n_embd, dtype=np.float32)
        times = []
        for i in range(repeats + 8):
            t0 = time.perf_counter()
            self.run(hidden, int(self.vocab_ids[i % len(self.vocab_ids)]))
            times.append(time.perf_counter() - t0)
        return float(np.median(times[8:]))
