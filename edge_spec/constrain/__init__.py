"""Structured output: what a request may constrain its answer to (a JSON schema, any JSON object,
a regular expression, a Lark or GBNF grammar, or a call of one of its tools: spec.py), compiled
by llguidance (grammars.py) into a per-request matcher over the target's own tokens
(matcher.py), and the tool-call format of each model family (tools.py).

The decode loop sees a constraint only through decode.constraint.StepConstraint: it masks the
target's rows, cuts drafts at their first disallowed token, and drafts the text the grammar
forces next."""
