"""The decode core: the speculative loop (engine.py), verification of chains and token trees,
greedy or keyed (verify.py), per-request statistics (stats.py) and the text a request streams
(text.py). Pure numpy over what the backend returns."""
