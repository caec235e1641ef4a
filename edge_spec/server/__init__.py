"""The OpenAI-compatible HTTP server (`edge-spec serve`, the optional `server` extra).

app.py      routes, errors, SSE        schemas.py   request bodies -> GenerationConfig
worker.py   the thread owning the models responses.py response bodies and chunks
metrics.py  Prometheus text            command.py   the CLI subcommand
"""
