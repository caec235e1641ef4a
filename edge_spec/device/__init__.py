"""This device: its profile (what a target pass over n tokens and each draft source cost here,
measured once and cached: profile.py, probes.py), and the self-draft, a layer subset of the
target chosen by what it costs and agrees on here (self_draft.py)."""
