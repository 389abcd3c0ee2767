"""What kas itself will build: MACHINE, DISTRO, targets and task from the merged kas
configuration and the environment, resolved the way kas resolves them.

kas 5.5 (kas/config.py ``Config.get_machine``, ``get_distro``, ``get_bitbake_targets``,
``get_bitbake_task``): an exported ``KAS_MACHINE`` / ``KAS_DISTRO`` / ``KAS_TARGET`` (split on
whitespace) / ``KAS_TASK`` beats the kas files, which beat the schema's defaults; the command
line's target and task (``kas build --target``) beat both. kas writes MACHINE and DISTRO into
``local.conf``, so they reach bitbake whatever command kas runs; targets and task are what
``kas build`` runs, and ``alma build`` runs them the same way through ``kas shell -c``.
tests/imagebuild/test_kas_env.py checks each rule against kas's own getters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Value:
    value: Any
    source: str  # "environment KAS_MACHINE", "kas files", "--target", "kas default"


@dataclass(frozen=True)
class KasView:
    machine: Value
    distro: Value
    targets: Value  # list[str]
    task: Value

    def to_dict(self) -> dict[str, dict[str, Any]]:
        return {k: {"value": v.value, "source": v.source} for k, v in self.__dict__.items()}


def _schema_default(name: str) -> Any:
    from kas.configschema import CONFIGSCHEMA

    return CONFIGSCHEMA["properties"][name]["default"]


def _pick(name: str, env_name: str, data: Mapping[str, Any], env: Mapping[str, str]) -> Value:
    if env_name in env:  # kas: os.environ.get(name, ...): an exported empty value counts too
        return Value(env[env_name], f"environment {env_name}")
    if name in data:
        return Value(data[name], "kas files")
    return Value(_schema_default(name), "kas default")


def resolve(
    data: Mapping[str, Any],
    env: Mapping[str, str],
    *,
    targets: tuple[str, ...] = (),
    task: str | None = None,
) -> KasView:
    """``data``: the merged kas configuration; ``env``: the environment kas will run in;
    ``targets``/``task``: given on alma's command line (kas's --target/--task)."""
    if targets:
        tv = Value(list(targets), "--target")
    elif [t for t in env.get("KAS_TARGET", "").split() if t]:
        tv = Value([t for t in env["KAS_TARGET"].split() if t], "environment KAS_TARGET")
    else:
        picked = _pick("target", "", data, {})
        tv = Value([picked.value] if isinstance(picked.value, str) else list(picked.value), picked.source)
    tk = Value(task, "--task") if task else _pick("task", "KAS_TASK", data, env)
    return KasView(
        machine=_pick("machine", "KAS_MACHINE", data, env),
        distro=_pick("distro", "KAS_DISTRO", data, env),
        targets=tv,
        task=tk,
    )
