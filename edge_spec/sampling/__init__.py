"""Sampling, pure numpy: the parameters and llama.cpp's transform of logits into probabilities
(transform.py), and the keyed draws that make the same seed give the same text whatever was
drafted (keys.py). Imports nothing of llama.cpp."""

from __future__ import annotations

from edge_spec.sampling.transform import (
    LazyProbs,
    SamplingParams,
    argmax,
    make_rng,
    probs_from_logits,
    sample,
    weights_from_logits,
)

__all__ = [
    "LazyProbs",
    "SamplingParams",
    "argmax",
    "make_rng",
    "probs_from_logits",
    "sample",
    "weights_from_logits",
]
