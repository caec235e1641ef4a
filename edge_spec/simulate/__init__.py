"""`edge-spec simulate`: replay recorded acceptance traces against device cost curves and report
every k policy against the oracle.

traces.py   the recorded traces (scripts/record_traces.py) and their reader
curves.py   device profiles: bundled t(n) curves and ones measured here
replay.py   one policy over one trace as the engine runs it; the oracle; simulate()
command.py  the CLI subcommand and its report
"""
