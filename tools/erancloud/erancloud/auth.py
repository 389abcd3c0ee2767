"""Authenticated roles, enforced by nats-server: the server config ERANCLOUD ships.

Who may write what is decided by the NATS server, per authenticated user, not by the
coordinator's goodwill. One directory (``--auth-dir``, mode 0700) holds:

* ``users.json``: the roles and bcrypt hashes the config is generated from (0600);
* ``nats-server.conf``: generated (0600): listen address, JetStream, two accounts and one
  user per actor with publish/subscribe allow lists (JSON, which nats-server reads as config);
* ``coordinator.creds.json``, ``coordinator-replies.creds.json``, ``erangrid-agent.creds.json``,
  ``workers/<NAME>.creds.json``: a user and password each (0600). The server stores only
  bcrypt hashes.

Roles (everything not listed is refused by the server, which answers with a permissions
violation and drops the message):

* **coordinator** (account ERANCLOUD): the JetStream API, every key of the KV bucket, every
  Object Store bucket. It alone writes ``state``, ``worker.*``, ``verdict.*``, ``round.*``,
  models, momenta, shards and the accepted deltas. It publishes to no reply subject.
* **coordinator-replies** (account ERANCLOUD): the coordinator's second connection, the one
  that acts on a worker's behalf: it receives registrations and answers them, and may publish
  only to inboxes (``_INBOX.*.>``). A reply subject is the requester's text: answered with the
  coordinator's own rights, a reply to ``$KV.ERANCLOUD.state`` once overwrote the round state.
  Here the server refuses it whatever the coordinator's code does (which also checks that the
  reply is the requester's own inbox, ``protocol.reply_subject_ok``).
* **worker W** (account ERANCLOUD): publishes only ``erancloud.v1.register.W`` (so the subject
  the coordinator sees is the server's identity of the sender), KV key ``push.<round>.W`` (in
  the push bucket, apart from the coordinator's rows: store.py) and
  its own Object Store bucket ``ERANCLOUD_D_W``; reads the KV bucket and ``ERANCLOUD_OBJ``
  (read-only JetStream API calls on those streams); subscribes only to ``_INBOX.W.>``.
* **erangrid-agent** (account ERANGRID, a JetStream namespace of its own): its queue
  (``erangrid.>``, ``$KV.ERANGRID_STATE.>``, the JetStream API inside that account). It cannot
  see any ERANCLOUD subject; an ERANCLOUD worker running as one of its jobs uses its own
  worker credential.

nats-server 2.9 has permission templates only for JWT accounts (operator mode), so the
per-worker subjects are generated here, one user block per worker; ``issue-worker`` adds a
user and makes the running server reload the file (SIGHUP, what ``nats-server --signal
reload`` sends).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any

from . import PROTOCOL
from .errors import UserError
from .protocol import REGISTER_PREFIX, WORKER_ID, inbox_bucket
from .store import KV_BUCKET, OBJ_BUCKET, PUSH_BUCKET, write_private

COORDINATOR = "coordinator"
RESPONDER = "coordinator-replies"
AGENT = "erangrid-agent"
RESERVED = {COORDINATOR, RESPONDER, AGENT}
ROLES = {COORDINATOR: "coordinator", RESPONDER: "responder", AGENT: "agent"}
BCRYPT_COST = 10  # nats-server checks it on every connect: ~0.1 s on a board
# Per account: what JetStream may hold, so no user can fill the disk (the buckets have their
# own, smaller limits: store.py).
ACCOUNT_FILE_MAX = 2 * 1024**3
ACCOUNT_MEM_MAX = 64 * 1024**2
ACCOUNT_STREAMS_MAX = 300  # 3 buckets + one inbox bucket per worker


def _streams(worker: str) -> tuple[str, str, str, str]:
    return f"KV_{KV_BUCKET}", f"KV_{PUSH_BUCKET}", f"OBJ_{OBJ_BUCKET}", f"OBJ_{inbox_bucket(worker)}"


def permissions(role: str, user: str) -> dict[str, Any]:
    """The server-side allow lists of one user."""
    if role == "coordinator":
        return {
            "publish": {
                "allow": ["$JS.API.>", f"$KV.{KV_BUCKET}.>", f"$KV.{PUSH_BUCKET}.>", "$O.>", "$JS.ACK.>", "$JS.FC.>"]
            },
            "subscribe": {"allow": [f"_INBOX.{user}.>"]},
        }
    if role == "responder":
        return {
            "publish": {"allow": ["_INBOX.*.>"]},
            "subscribe": {"allow": [f"{REGISTER_PREFIX}.*", f"_INBOX.{user}.>"]},
        }
    if role == "worker":
        kv, push, obj, own = _streams(user)
        api = "$JS.API"
        return {
            "publish": {
                "allow": [
                    f"erancloud.v1.register.{user}",
                    f"$KV.{PUSH_BUCKET}.push.*.{user}",
                    f"$O.{inbox_bucket(user)}.>",
                    f"{api}.INFO",
                    f"{api}.STREAM.NAMES",  # nats-py finds the stream of a subject it reads
                    *(f"{api}.STREAM.INFO.{s}" for s in (kv, push, obj, own)),
                    *(f"{api}.STREAM.MSG.GET.{s}" for s in (kv, push, obj, own)),
                    *(f"{api}.DIRECT.GET.{s}" for s in (kv, push, obj, own)),
                    *(f"{api}.DIRECT.GET.{s}.>" for s in (kv, push, obj, own)),
                    f"{api}.STREAM.PURGE.{own}",  # nats-py replacing an object of its own
                    # No consumers: objects are read chunk by chunk with direct gets (store.py),
                    # so a worker cannot create consumers (durable ones, without end).
                ]
            },
            "subscribe": {"allow": [f"_INBOX.{user}.>"]},
        }
    if role == "agent":
        return {
            "publish": {"allow": ["erangrid.>", "$JS.API.>", "$JS.ACK.>", "$JS.FC.>", "$KV.ERANGRID_STATE.>"]},
            "subscribe": {"allow": ["_INBOX.>"]},
        }
    raise ValueError(role)


class AuthDir:
    """The operator's directory: users.json in, nats-server.conf and credential files out."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.users_file = path / "users.json"
        self.conf = path / "nats-server.conf"
        self.pid_file = path / "nats-server.pid"

    def creds_path(self, user: str) -> Path:
        return (
            self.path / "workers" / f"{user}.creds.json" if user not in RESERVED else self.path / f"{user}.creds.json"
        )

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.users_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(
                f"{self.users_file} does not exist",
                hint=f"create it: eran-cloud coordinator init-auth --auth-dir {self.path}",
            ) from None
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read {self.users_file}: {exc}") from exc
        if not isinstance(data, dict) or data.get("v") != PROTOCOL or not isinstance(data.get("users"), dict):
            raise UserError(f"{self.users_file} is not an eran-cloud users file")
        return data

    def init(self, listen: str, store_dir: Path) -> list[Path]:
        """A new directory; on an existing one, only the reserved roles it lacks are added (a
        directory made before a role existed), everything else is kept."""
        if self.users_file.exists():
            data = self.load()
            missing = [user for user in ROLES if user not in data["users"]]
            if not missing:
                raise UserError(
                    f"{self.users_file} exists already", hint="issue workers with: eran-cloud coordinator issue-worker"
                )
        else:
            self.path.mkdir(parents=True, exist_ok=True, mode=0o700)
            os.chmod(self.path, 0o700)
            data = {"v": PROTOCOL, "listen": listen, "store_dir": str(store_dir.resolve()), "users": {}}
            missing = list(ROLES)
        made = [self._add(data, user, ROLES[user]) for user in missing]
        self._save(data)
        return made

    def issue(self, user: str, reload: bool) -> Path:
        if not WORKER_ID.match(user) or user in RESERVED:
            raise UserError(
                f"worker name {user[:70]!r}: use 1-64 characters of A-Z a-z 0-9 _ - (not {sorted(RESERVED)})"
            )
        data = self.load()
        if user in data["users"]:
            raise UserError(
                f"{user} has a credential already", hint=f"revoke it first: eran-cloud coordinator revoke-worker {user}"
            )
        path = self._add(data, user, "worker")
        self._save(data)
        if reload:
            self.reload()
        return path

    def revoke(self, user: str, reload: bool) -> None:
        data = self.load()
        if data["users"].get(user, {}).get("role") != "worker":
            raise UserError(f"{user[:70]!r} is not an issued worker")
        del data["users"][user]
        self._save(data)
        self.creds_path(user).unlink(missing_ok=True)
        if reload:
            self.reload()

    def _add(self, data: dict[str, Any], user: str, role: str) -> Path:
        import bcrypt  # the operator's side only (eran-cloud[coordinator]); workers never import this module

        password = secrets.token_urlsafe(24)
        hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(BCRYPT_COST)).decode()
        data["users"][user] = {"role": role, "bcrypt": hashed}
        path = self.creds_path(user)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        write_private(path, json.dumps({"v": PROTOCOL, "user": user, "password": password}).encode() + b"\n")
        return path

    def _save(self, data: dict[str, Any]) -> None:
        write_private(self.users_file, json.dumps(data, indent=1, sort_keys=True).encode() + b"\n")
        write_private(self.conf, render(data, self.pid_file).encode())

    def reload(self) -> None:
        """Make the running nats-server re-read the config (SIGHUP = ``nats-server --signal reload``)."""
        try:
            pid = int(self.pid_file.read_text().strip())
            comm = Path(f"/proc/{pid}/comm").read_text().strip()
        except (OSError, ValueError) as exc:
            raise UserError(
                f"no running nats-server found through {self.pid_file}: the config is written, not loaded",
                hint=f"start it: nats-server -c {self.conf}",
            ) from exc
        if comm != "nats-server":
            raise UserError(f"{self.pid_file} names pid {pid}, which is {comm!r}, not nats-server: not signalled")
        os.kill(pid, signal.SIGHUP)


def render(data: dict[str, Any], pid_file: Path) -> str:
    """nats-server.conf as JSON (a subset of the NATS config syntax: every string quoted, so
    no value is ever read as a variable or a unit)."""
    accounts: dict[str, Any] = {
        "ERANCLOUD": {"users": [], "jetstream": {"max_file": ACCOUNT_FILE_MAX, "max_mem": ACCOUNT_MEM_MAX,
                                                 "max_streams": ACCOUNT_STREAMS_MAX}},
        "ERANGRID": {"users": [], "jetstream": {"max_file": ACCOUNT_FILE_MAX, "max_mem": ACCOUNT_MEM_MAX}},
    }  # fmt: skip
    for user, entry in sorted(data["users"].items()):
        role = entry["role"]
        account = "ERANGRID" if role == "agent" else "ERANCLOUD"  # the agent sees nothing of ERANCLOUD
        accounts[account]["users"].append(
            {"user": user, "password": entry["bcrypt"], "permissions": permissions(role, user)}
        )
    host, _, port = str(data["listen"]).rpartition(":")
    conf = {
        "host": host or "127.0.0.1",
        "port": int(port),
        "pid_file": str(pid_file),
        "jetstream": {"store_dir": data["store_dir"]},
        "accounts": accounts,
    }
    return json.dumps(conf, indent=1, sort_keys=True) + "\n"
