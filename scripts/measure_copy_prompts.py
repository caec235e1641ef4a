#!/usr/bin/env python3
"""Copy prompts -- answers that re-emit text the prompt holds, whole or transformed (repeat
a listing or a paragraph, CSV to a Markdown table or JSON, JSON to YAML, rename a variable,
add an item or docstrings, quote a passage) -- through each draft mode, against the target
alone: decode tokens/s per prompt and the median ratio. Written for this check, never tuned on.

    .venv/bin/python scripts/measure_copy_prompts.py            # the chat pair, --chat form
    .venv/bin/python scripts/measure_copy_prompts.py --base     # the default pair, documents
    .venv/bin/python scripts/measure_copy_prompts.py --set 2    # a second set, written later

Set 2 (ten more prompts, written after set 1 had been measured, and not tuned on either) asks
in the same words in both forms; the default pair gets it as "Request: ...  Answer:".

--cli runs every prompt and mode as its own `edge-spec generate --json` process, as a user
would, and reports the decode rate it prints and the process's wall time (load and prefill
included) beside it.

Each request drafts from itself alone (session None), as a fresh `edge-spec generate` does;
greedy, up to 256 tokens; the script says where a mode's text differs from the first mode's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
EDGE_SPEC = Path(sys.executable).parent / "edge-spec"

CODE = """def parse_config(path):
    settings = {}
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            if "=" not in line:
                raise ValueError(f"{path}:{line_number}: expected key=value")
            key, value = line.split("=", 1)
            settings[key.strip()] = value.strip()
    return settings


def merge(defaults, overrides):
    merged = dict(defaults)
    for key, value in overrides.items():
        if value == "":
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged
"""
PROSE = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He trimmed the "
    "wick, polished the great lens until it shone, and wrote the weather in a leather "
    "logbook: wind from the north-west, a heavy swell, two fishing boats returning late. In "
    "forty years he had missed only one night, the winter his daughter was born, and even "
    "then his brother kept the light burning until dawn."
)
CSV = """name,age,city,role
Alice Martin,34,Lyon,engineer
Bruno Costa,28,Porto,designer
Chen Wei,45,Shenzhen,manager
Dana Kowalski,39,Krakow,analyst
Emeka Obi,31,Lagos,developer
Farah Haddad,26,Beirut,researcher"""
JSON = """{
  "server": {"host": "0.0.0.0", "port": 8080, "workers": 4},
  "database": {"url": "postgres://db.internal:5432/app", "pool_size": 10, "timeout_s": 30},
  "logging": {"level": "info", "file": "/var/log/app.log", "rotate_mb": 50},
  "features": {"signup": true, "billing": false, "search": true}
}"""
HTML = """<ul class="menu">
  <li><a href="/home">Home</a></li>
  <li><a href="/products">Products</a></li>
  <li><a href="/pricing">Pricing</a></li>
  <li><a href="/blog">Blog</a></li>
  <li><a href="/contact">Contact</a></li>
</ul>"""
SQL = """SELECT customers.id, customers.name, orders.total, orders.created_at
FROM customers
JOIN orders ON orders.customer_id = customers.id
WHERE orders.created_at >= '2024-01-01'
  AND orders.status = 'shipped'
ORDER BY orders.created_at DESC
LIMIT 50;"""

# (id, chat instruction, base-model document prompt)
PROMPTS = [
    (
        "repeat-code",
        f"Repeat this code exactly, with no changes:\n\n{CODE}",
        f"Original file:\n\n{CODE}\n\nThe same file, copied exactly:\n\n",
    ),
    (
        "repeat-prose",
        f"Repeat this paragraph word for word:\n\n{PROSE}",
        f"Paragraph:\n{PROSE}\n\nThe same paragraph, copied word for word:\n",
    ),
    (
        "csv-to-markdown",
        f"Convert these CSV rows to a Markdown table:\n\n{CSV}",
        f"CSV:\n{CSV}\n\nThe same data as a Markdown table:\n\n"
        "| name | age | city | role |\n|---|---|---|---|\n",
    ),
    (
        "json-to-yaml",
        f"Convert this JSON to YAML:\n\n{JSON}",
        f"JSON:\n{JSON}\n\nThe same configuration in YAML:\n\n",
    ),
    (
        "rename-variable",
        f"Rewrite this code with the variable `settings` renamed to `config`:\n\n{CODE}",
        f"Before:\n\n{CODE}\n\nAfter renaming `settings` to `config`:\n\n",
    ),
    (
        "add-item",
        f"Add a 'Careers' link before 'Contact' in this HTML and show the full list:\n\n{HTML}",
        f"Before:\n{HTML}\n\nAfter adding a Careers link before Contact:\n",
    ),
    (
        "sql-format",
        f"Rewrite this SQL query with the keywords in lowercase:\n\n{SQL}",
        f"Query:\n{SQL}\n\nThe same query with lowercase keywords:\n",
    ),
    (
        "quote-answer",
        f"{PROSE}\n\nQuote the sentence that says how long he kept the light, then say who "
        "kept it the night he missed.",
        f'{PROSE}\n\nQuestion: Quote the sentence about the night he missed.\nAnswer: "',
    ),
    (
        "docstring",
        "Add a one-line docstring to each function in this code and show the whole file:"
        f"\n\n{CODE}",
        f"Without docstrings:\n\n{CODE}\n\nWith a one-line docstring in each function:\n\n",
    ),
    (
        "csv-to-json",
        f"Convert these CSV rows to a JSON list of objects:\n\n{CSV}",
        f"CSV:\n{CSV}\n\nThe same rows as JSON:\n\n[",
    ),
]


JS = """function totalPrice(items, taxRate) {
  var subtotal = 0;
  for (var i = 0; i < items.length; i++) {
    var item = items[i];
    subtotal += item.price * item.quantity;
  }
  var tax = subtotal * taxRate;
  var total = subtotal + tax;
  return Math.round(total * 100) / 100;
}"""
AVERAGE = """def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    result = []
    total = 0.0
    for index, value in enumerate(values):
        total += value
        if index >= window:
            total -= values[index - window]
        if index >= window - 1:
            result.append(total / window)
    return result"""
NGINX = """server {
    listen 8080;
    server_name example.org www.example.org;
    root /var/www/example;
    index index.html;

    location / {
        try_files $uri $uri/ =404;
    }

    location /api/ {
        proxy_pass http://127.0.0.1:5000/;
        proxy_set_header Host $host;
    }
}"""
MENU = """- Tomato soup
- Grilled cheese sandwich
- Caesar salad
- Mushroom risotto
- Beef stew
- Lemon tart
- Apple crumble
- Chicken curry"""
YAML = """service:
  name: billing
  replicas: 3
  image: registry.local/billing:2.4.1
  env:
    LOG_LEVEL: info
    DB_HOST: db.internal
    DB_PORT: 5432
  ports:
    - 8000
    - 8001"""
MINUTES = (
    "The comittee met on Tuesday to review the budget for the coming year. After a long "
    "discussion, the members agreed to increase funding for the public library and to "
    "postpone the renovation of the town hall until the spring."
)
PLANETS = """| Planet | Moons | Distance (AU) |
|---|---|---|
| Mercury | 0 | 0.39 |
| Venus | 0 | 0.72 |
| Earth | 1 | 1.00 |
| Mars | 2 | 1.52 |
| Jupiter | 95 | 5.20 |"""

# Set 2: (id, request), the same words for both pairs.
REQUESTS_2 = [
    (
        "js-const",
        "Rewrite this JavaScript with let and const instead of var, and show the whole "
        f"function:\n\n{JS}",
    ),
    (
        "type-hints",
        f"Add type hints to this Python function and show the whole function:\n\n{AVERAGE}",
    ),
    (
        "nginx-port",
        "Change the port from 8080 to 9090 in this nginx config and show the full config:"
        f"\n\n{NGINX}",
    ),
    ("numbered-list", f"Turn this bulleted list into a numbered list:\n\n{MENU}"),
    ("yaml-to-json", f"Convert this YAML to JSON:\n\n{YAML}"),
    (
        "fix-typo",
        "Fix the spelling mistake in this paragraph and return the whole corrected paragraph:"
        f"\n\n{MINUTES}",
    ),
    ("markdown-to-csv", f"Convert this Markdown table to CSV:\n\n{PLANETS}"),
    (
        "comment-lines",
        "Add a comment above each line of the loop body in this function, and show the whole "
        f"function:\n\n{AVERAGE}",
    ),
    (
        "rename-function",
        f"Rename the function totalPrice to computeTotal and show the code:\n\n{JS}",
    ),
    ("sort-list", f"Sort this list alphabetically:\n\n{MENU}"),
]
PROMPTS_2 = [(pid, request, f"Request: {request}\n\nAnswer:\n") for pid, request in REQUESTS_2]


def main() -> int:
    from edge_spec.api import EdgeSpec, EngineConfig
    from edge_spec.models.manifest import choose_pair

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", action="store_true", help="the default pair on document prompts")
    ap.add_argument("--modes", nargs="+", default=["none", "ngram", "auto"])
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--set", type=int, choices=(1, 2), default=1, help="which prompt set")
    ap.add_argument("--cli", action="store_true", help="a fresh edge-spec process per run")
    args = ap.parse_args()
    prompts = PROMPTS if args.set == 1 else PROMPTS_2
    rates: dict[str, dict[str, float]] = {}
    walls: dict[str, dict[str, float]] = {}
    if args.cli:
        for pid, instruction, document in prompts:
            rates[pid], walls[pid], texts = {}, {}, []
            for mode in args.modes:
                text, rates[pid][mode], walls[pid][mode] = _cli_run(
                    document if args.base else instruction, mode, args
                )
                texts.append(text)
            _report(pid, rates[pid], texts, walls[pid])
    else:
        target, draft = choose_pair(None, None, chat=not args.base)
        config = EngineConfig(n_ctx=2048, n_threads=args.threads)
        with EdgeSpec(target, draft, config=config) as spec:
            spec.generate("Hello", max_tokens=8, draft_mode="none")  # page the weights in
            for pid, instruction, document in prompts:
                text = (
                    document
                    if args.base
                    else spec.render_chat([{"role": "user", "content": instruction}])
                )
                rates[pid], texts = {}, []
                for mode in args.modes:
                    result = spec.generate(
                        text,
                        max_tokens=args.max_tokens,
                        temperature=0.0,
                        draft_mode=mode,
                        session=None,
                    )
                    rates[pid][mode] = result.stats.tokens_per_s
                    texts.append(result.text)
                _report(pid, rates[pid], texts)
    base = args.modes[0]
    for mode in args.modes[1:]:
        ratios = [rates[p][mode] / rates[p][base] for p in rates]
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        line = f"{mode} / {base}: median {statistics.median(ratios):.2f}x ({listed})"
        if walls:
            wall = statistics.median(walls[p][base] / walls[p][mode] for p in walls)
            line += f"; wall time {wall:.2f}x"
        print(line)
    return 0


def _cli_run(prompt: str, mode: str, args: argparse.Namespace) -> tuple[str, float, float]:
    """(text, decode tokens/s, wall seconds) of one `edge-spec generate` process."""
    command = [str(EDGE_SPEC), "generate", "--json", "-n", str(args.max_tokens), "--temp", "0"]
    command += ["--draft-mode", mode] + ([] if args.base else ["--chat"])
    if args.threads:
        command += ["--threads", str(args.threads)]
    t0 = time.perf_counter()
    done = subprocess.run(command + ["--", prompt], capture_output=True, text=True, check=True)
    wall_s = time.perf_counter() - t0
    out = json.loads(done.stdout)
    return out["text"], out["stats"]["tokens_per_s"], wall_s


def _report(pid: str, rates: dict[str, float], texts: list[str], walls=None) -> None:
    cells = "  ".join(
        f"{m} {r:.1f}" + (f" ({walls[m]:.2f} s)" if walls else "") for m, r in rates.items()
    )
    same = "" if len(set(texts)) == 1 else "  (texts differ)"
    print(f"{pid}: tokens/s {cells}{same}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
