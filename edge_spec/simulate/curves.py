"""Device profiles for `edge-spec simulate`: bundled curves (edge_spec/profiles/) and
profiles measured here by `edge-spec profile`.

A device profile (edge_spec/profiles/*.json) is a verify-cost curve t(n) / t(1) for n = 1..16,
t(1) in ms and a draft cost ratio c, each with where it comes from. Replay charges a step
draft cost + t(k + 1); the model draft's cost counts the tokens its cache must re-decode
(CostCurve.draft_s).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from edge_spec.policy.types import CostCurve

PROFILE_DIR = Path(__file__).resolve().parents[1] / "profiles"


@dataclass(frozen=True)
class CurveProfile:
    name: str
    description: str
    source: str
    t1_ms: float
    t_rel: tuple[float, ...]  # t(n) / t(1), n = 1..len
    c: float
    ngram_s: float
    raw: dict = field(repr=False, compare=False, default_factory=dict)

    def costs(self) -> CostCurve:
        t1_s = self.t1_ms / 1e3
        return CostCurve(
            verify_s=tuple(t1_s * r for r in self.t_rel),
            draft_token_s=self.c * t1_s,
            ngram_s=self.ngram_s,
        )


def list_profiles() -> list[str]:
    return sorted(p.stem for p in PROFILE_DIR.glob("*.json"))


def load_profile(name_or_path: str | Path) -> CurveProfile:
    """A bundled profile by name, or a JSON file. Raises ValueError for an unknown name."""
    path = Path(name_or_path)
    if not path.is_file():
        path = PROFILE_DIR / f"{name_or_path}.json"
        if not path.is_file():
            known = ", ".join(list_profiles())
            raise ValueError(f"unknown device profile {str(name_or_path)!r}; known: {known}")
    data = json.loads(path.read_text(encoding="utf-8"))
    if "host" in data and "target" in data:  # a profile measured by `edge-spec profile`
        return _measured_curve(path, data)
    t_rel = tuple(float(x) for x in data["t_rel"])
    if not t_rel or abs(t_rel[0] - 1.0) > 1e-9 or min(t_rel) <= 0:
        raise ValueError(f"{path}: t_rel must start at 1.0 and be positive")
    return CurveProfile(
        name=data["name"],
        description=data.get("description", ""),
        source=data.get("source", ""),
        t1_ms=float(data["t1_ms"]),
        t_rel=t_rel,
        c=float(data["c"]),
        ngram_s=float(data.get("ngram_s", 2e-5)),
        raw=data,
    )


def _measured_curve(path: Path, data: dict) -> CurveProfile:
    """A device profile measured here (edge_spec.device), seen as a curve: the target's t(n)
    relative to t(1), and c = the draft's t(1) over the target's."""
    from edge_spec.device.profile import DeviceProfile

    profile = DeviceProfile.from_dict(data)
    costs = profile.cost_curve()
    t1_s = costs.verify_s[0]
    host = profile.host
    return CurveProfile(
        name=f"measured-{path.stem[:8]}",
        description=f"measured by edge-spec profile on {host.hostname} ({host.cpu_model}), "
        f"target {profile.target.file_name}",
        source=str(path),
        t1_ms=t1_s * 1e3,
        t_rel=tuple(t / t1_s for t in costs.verify_s),
        c=costs.c,
        ngram_s=costs.ngram_s,
        raw=data,
    )
