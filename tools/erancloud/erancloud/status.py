"""The honest figures: live workers, registered workers and dry-run runs, always apart.

* live: workers whose delta was applied within the last ``live_window`` rounds;
* registered: rows in the registry (a worker that registered once and vanished still counts);
* dry-run runs: DRY-RUN records in a local directory (they never reach a coordinator);
* silent: workers the last round expected (live or recently registered) whose delta was not
  in it when it closed (a registration that never pushes shows here, round after round);
* outliers: workers whose last applied delta was clipped or trimmed by the robust
  aggregation, with its norm and how many rounds running; "suspect" after ``suspect_after``
  rounds running. A suspect worker is not counted as live.

``status.json`` (schema ``erancloud.status/1``) is written by the coordinator atomically;
``eran-cloud status`` computes the same figures from JetStream.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any

from .protocol import WORKER_ID

SCHEMA = "erancloud.status/1"
DRY_RUN_GLOB = "erancloud-dry-run-*.json"


def outliers(state: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows = state.get("outliers", {})
    return {w: o for w, o in rows.items() if isinstance(o, dict)} if isinstance(rows, dict) else {}


def suspects(state: dict[str, Any]) -> list[str]:
    after = int(state.get("suspect_after", 3))
    return sorted(w for w, o in outliers(state).items() if isinstance(o.get("streak"), int) and o["streak"] >= after)


def live_workers(state: dict[str, Any]) -> list[str]:
    window = int(state.get("live_window", 3))
    now = int(state.get("round", 0))
    last = state.get("last_push", {})
    if not isinstance(last, dict):
        return []
    bad = set(suspects(state))
    return sorted(w for w, r in last.items() if isinstance(r, int) and r >= now - window and w not in bad)


def count_dry_runs(directory: Path | None) -> int:
    """DRY-RUN records in ``directory`` (files the dry-run client wrote); unreadable ones do not count."""
    if directory is None:
        return 0
    n = 0
    with contextlib.suppress(OSError):
        for path in directory.glob(DRY_RUN_GLOB):
            with contextlib.suppress(OSError, ValueError):
                row = json.loads(path.read_text(encoding="utf-8"))
                if isinstance(row, dict) and row.get("mode") == "DRY-RUN":
                    n += 1
    return n


def silent(state: dict[str, Any]) -> list[str]:
    rows = state.get("silent", [])
    return sorted({w for w in rows if isinstance(w, str) and WORKER_ID.match(w)}) if isinstance(rows, list) else []


def figures(state: dict[str, Any], registered: int, dry_runs: int) -> dict[str, Any]:
    history = state.get("accuracy", [])
    last = history[-1] if history else None
    live = live_workers(state)
    return {
        "schema": SCHEMA,
        "updated": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "phase": state.get("phase", "open"),
        "round": int(state.get("round", 0)),
        "rounds": int(state.get("rounds", 0)),
        "test_accuracy": None if last is None else last[1],
        "accuracy_history": history[-50:],
        "live_workers": len(live),
        "live_worker_ids": live,
        "live_window": int(state.get("live_window", 3)),
        "registered_workers": registered,
        "quorum": int(state["quorum"]) if isinstance(state.get("quorum"), int) else None,
        "dry_run_runs": dry_runs,
        "rejected": state.get("rejected", {}),
        "outliers": outliers(state),
        "suspect_workers": suspects(state),
        "silent_workers": silent(state),
        "aggregate": state.get("outer", {}).get("aggregate", "mean") if isinstance(state.get("outer"), dict) else "",
        "model_sha256": state.get("model_sha256", ""),
        "outer": state.get("outer", {}),
    }


def write_atomic(path: Path, data: dict[str, Any]) -> None:
    """The figure as JSON, written atomically (erancloud.store.write_atomic)."""
    from .store import write_atomic as write_bytes

    write_bytes(path, (json.dumps(data, indent=2, sort_keys=True) + "\n").encode())


def render(fig: dict[str, Any]) -> str:
    acc = fig["test_accuracy"]
    acc_s = "n/a" if acc is None else f"{100 * acc:.1f} %"
    return (
        f"round {fig['round']}/{fig['rounds']} ({fig['phase']}): test accuracy {acc_s}; "
        f"live workers {fig['live_workers']} (delta applied within {fig['live_window']} rounds), "
        f"registered {fig['registered_workers']}, dry-run runs {fig['dry_run_runs']} (not counted as live)"
        + (f"; the round closes on {fig['quorum']} deltas (quorum)" if fig.get("quorum") else "")
        + "".join(
            f"\n  {w}: {o.get('verdict')} (norm {o.get('norm')}, {o.get('streak')} round(s) running)"
            + (" SUSPECT" if w in fig.get("suspect_workers", []) else "")
            for w, o in sorted(fig.get("outliers", {}).items())
        )
        + (f"\n  silent (expected, no delta in the last round): {', '.join(fig['silent_workers'])}"
           if fig.get("silent_workers") else "")
        + (f"\n  rejected: {fig['rejected']}" if fig.get("rejected") else "")
    )
