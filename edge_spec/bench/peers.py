"""Peers in the bench, run on the same prompts and models as edge_spec's strategies.

- `lcpp`: llama-cpp-python's plain decoding (the bench's structured category gives it the
  request's grammar, as its response_format does).
- `lcpp-lookup[-nNgG]`: llama-cpp-python's own prompt lookup, in this process
  (`Llama(draft_model=LlamaPromptLookupDecoding(max_ngram_size=G, num_pred_tokens=N))`;
  its defaults are N = 10, G = 2). It lives in edge_spec/backend/peer.py (the backend package is
  the only llama_cpp importer).
- `cpp-lookup[-kK]`, `cpp-speculative[-kK]`: llama.cpp's C++ examples `llama-lookup` and
  `llama-speculative-simple`, built from the same vendored llama.cpp by
  `scripts/build_llama_examples.py`, run as subprocesses (cpp_peers.py). Default k: 3, the
  vendored llama.cpp's own default (`--spec-draft-n-max`).

Every peer answers `run(text, prompt_ids, max_tokens, temperature, seed) -> PeerResult`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from edge_spec.backend import PromptLookupPeer

PEER_PATTERN = re.compile(
    r"^(lcpp|lcpp-lookup(?:-n(\d+)g(\d+))?|cpp-(lookup|speculative)(?:-k(\d+))?)$"
)


@dataclass(frozen=True)
class PeerResult:
    token_ids: tuple[int, ...]  # empty when the peer reports text only (the C++ examples)
    text: str
    n_generated: int
    prefill_s: float
    decode_s: float
    n_steps: int  # target passes over drafts (0 when unknown)
    n_drafted: int
    n_accepted: int
    finish_reason: str


class Peer(Protocol):
    name: str

    def run(
        self,
        text: str,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float,
        seed: int,
        grammar: str | None = None,
    ) -> PeerResult: ...

    def close(self) -> None: ...


def is_peer(spec: str) -> bool:
    return PEER_PATTERN.match(spec) is not None


@dataclass(frozen=True)
class PeerSetup:
    target_path: Path
    draft_path: Path | None
    n_ctx: int
    n_threads: int
    cpp_bin_dir: str | None = None  # None: $EDGE_SPEC_LLAMA_EXAMPLES or the default build


def make_peers(specs: list[str], setup: PeerSetup) -> list[Peer]:
    """Peers from their strategy names (see the module docstring); the llama-cpp-python ones
    share one loaded model. Raises ValueError on an unknown name; CppPeerError when the C++
    examples are not built."""
    peers: list[Peer] = []
    shared: PromptLookupPeer | None = None
    for spec in specs:
        m = PEER_PATTERN.match(spec)
        if m is None:
            raise ValueError(f"unknown peer {spec!r}")
        if spec == "lcpp" or spec.startswith("lcpp-"):
            if shared is None:
                from edge_spec.backend import PromptLookupPeer

                shared = PromptLookupPeer(
                    setup.target_path, n_ctx=setup.n_ctx, n_threads=setup.n_threads
                )
            n_pred, n_gram = (int(m[2]), int(m[3])) if m[2] else (10, 2)
            peers.append(LlamaCppPythonLookup(spec, shared, n_pred, n_gram, lookup=spec != "lcpp"))
        else:
            kind = m[4]
            k = int(m[5]) if m[5] else 3
            peers.append(CppExample(spec, setup, kind, k))
    return peers


class LlamaCppPythonLookup:
    def __init__(
        self,
        name: str,
        peer: PromptLookupPeer,
        num_pred_tokens: int,
        max_ngram: int,
        lookup: bool = True,
    ) -> None:
        self.name = name
        self._peer = peer
        self.num_pred_tokens = num_pred_tokens
        self.max_ngram = max_ngram
        self.lookup = lookup  # False: llama-cpp-python's plain decoding ("lcpp")

    def run(
        self,
        text: str,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float,
        seed: int,
        grammar: str | None = None,
    ) -> PeerResult:
        gen = self._peer.generate(
            prompt_ids,
            max_tokens,
            temperature,
            seed,
            num_pred_tokens=self.num_pred_tokens,
            max_ngram_size=self.max_ngram,
            grammar=grammar,
            lookup=self.lookup,
        )
        return PeerResult(
            token_ids=gen.token_ids,
            text="",
            n_generated=len(gen.token_ids),
            prefill_s=gen.prefill_s,
            decode_s=gen.decode_s,
            n_steps=gen.n_steps,
            n_drafted=gen.n_drafted,
            n_accepted=gen.n_accepted,
            finish_reason=gen.finish_reason,
        )

    def close(self) -> None:
        self._peer.close()  # shared: closing twice is harmless


class CppExample:
    def __init__(self, name: str, setup: PeerSetup, kind: str, k: int) -> None:
        from edge_spec.bench.cpp_peers import find_bin_dir

        if kind == "speculative" and setup.draft_path is None:
            raise ValueError(f"{name} needs a draft model")
        self.name = name
        self.kind = kind
        self.k = k
        self.setup = setup
        self.bin_dir = find_bin_dir(setup.cpp_bin_dir)

    def run(
        self,
        text: str,
        prompt_ids: list[int],
        max_tokens: int,
        temperature: float,
        seed: int,
        grammar: str | None = None,
    ) -> PeerResult:
        from edge_spec.bench.cpp_peers import run_cpp_peer

        if grammar is not None:
            raise ValueError(f"{self.name} takes no grammar here: not in the structured bench")

        s = self.setup
        result = run_cpp_peer(
            self.kind,  # type: ignore[arg-type]
            self.bin_dir,
            s.target_path,
            s.draft_path,
            text,
            n_predict=max_tokens,
            threads=s.n_threads,
            n_ctx=s.n_ctx,
            draft_n=self.k,
            temperature=temperature,
            seed=seed,
            timeout_s=600,
        )
        return PeerResult(
            token_ids=(),
            text=result.text,
            n_generated=result.n_generated,
            prefill_s=result.prefill_s,
            decode_s=result.decode_s,
            n_steps=0,
            n_drafted=result.n_drafted,
            n_accepted=result.n_accepted,
            finish_reason="length",
        )

    def close(self) -> None:
        pass
