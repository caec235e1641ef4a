"""GGUF files, read in pure Python before llama.cpp sees them: a bounded walk of the header that
refuses what would abort llama.cpp (validate.py) and the facts placement and profiles need
(facts.py). The lowest layer with the errors and files: the backend validates every file
through it."""
