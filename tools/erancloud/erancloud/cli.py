"""``eran-cloud``: coordinator, client (live or --dry-run) and status. Parsing and printing only.

Exit codes: 0 success; 1 failure (a second coordinator on the same store, an unexpected
error); 2 usage or configuration error; 3 registration refused; 4 coordinator unreachable
(no NATS server, no JetStream buckets, nobody answering, no new round within
--idle-timeout, NATS away for longer than --outage-window); 5 integrity (model, shard or
state whose hash does not match, or a round state that fails its checks: refusing to
train / resume); 75 vacated by SIGTERM with a checkpoint saved (ERAN-GRID resumes it);
130 interrupted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import __version__
from .errors import CloudError, UserError

EPILOG = __doc__.split("\n\n", 1)[1]


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a finite number above 0")
    return value


def _count(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r} must be at least {low}")
        return value

    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="eran-cloud",
        description="Local-SGD (DiLoCo-style) training in borrowed cycles, over NATS JetStream.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--version", action="version", version=f"eran-cloud {__version__}")
    sub = ap.add_subparsers(dest="verb", required=True)

    co = sub.add_parser("coordinator", help="keep the global model and run the rounds; init-auth / issue-worker")
    ops = co.add_subparsers(dest="action", required=False, metavar="{init-auth,issue-worker,revoke-worker}")
    ia = ops.add_parser("init-auth", help="write the NATS server config with authenticated roles (docs/erancloud.md)")
    ia.add_argument("--auth-dir", type=Path, required=True, help="directory for users.json, nats-server.conf, creds")
    ia.add_argument("--listen", default="127.0.0.1:4222", help="HOST:PORT the server listens on")
    ia.add_argument("--store-dir", type=Path, default=None, help="JetStream directory (default AUTH_DIR/jetstream)")
    for verb, text in (("issue-worker", "mint a worker credential and add its user"),
                       ("revoke-worker", "remove a worker's user")):  # fmt: skip
        iw = ops.add_parser(verb, help=text)
        iw.add_argument("name", help="worker name = its NATS user = its worker id")
        iw.add_argument("--auth-dir", type=Path, required=True)
        iw.add_argument("--no-reload", action="store_true", help="only write the config; do not signal nats-server")
    co.add_argument("--nats", metavar="URL", help="NATS server with JetStream (required to run)")
    co.add_argument("--creds", type=Path, help="the coordinator's credential file (init-auth wrote it)")
    co.add_argument(
        "--reply-creds",
        type=Path,
        help="the credential of the connection that answers workers (default: coordinator-replies.creds.json "
        "beside --creds)",
    )
    co.add_argument("--aggregate", choices=("reference", "trimmed", "median", "mean"), default="reference",
                    help="combine the deltas: weighted by agreement with the coordinator's own update on its root "
                         "set (default), norm-trimmed mean, norm-trimmed coordinate-wise median, plain mean (trusted "
                         "setups only)")  # fmt: skip
    co.add_argument("--clip", type=_positive_float, default=1.5,
                    help="shorten deltas longer than this × the median norm to it (default 1.5)")  # fmt: skip
    co.add_argument("--trim", type=_positive_float, default=4.0,
                    help="leave out deltas longer than this × the round's median norm (default 4)")  # fmt: skip
    co.add_argument("--expire-rounds", type=_count(1), default=10,
                    help="a registration without a delta for this many rounds expires (default 10)")  # fmt: skip
    co.add_argument("--suspect-after", type=_count(1), default=3,
                    help="trimmed or down-weighted rounds running that make a worker suspect: its pushes "
                         "are refused (default 3)")  # fmt: skip
    co.add_argument("--outage-window", type=_positive_float, default=60.0,
                    help="seconds NATS may be away before exit 4 (default 60)")  # fmt: skip
    co.add_argument("--rounds", type=_count(1), default=30, help="rounds to train (default 30)")
    co.add_argument("--min-grace", type=_positive_float, default=0.5,
                    help="seconds a round waits for the stragglers after its quorum, at least (default 0.5; "
                         "it waits as long again as the quorum took, if that is longer)")  # fmt: skip
    co.add_argument("--min-deltas", type=_count(1), default=3,
                    help="deltas a round needs to close (default 3: with two, one of them sets half the round)")
    co.add_argument("--quorum-share", type=float, default=0.5,
                    help="a round also needs this share of the eligible workers' deltas (registered or active within "
                         "--live-window rounds, not suspect, not past this round's deadline; default 0.5)")  # fmt: skip
    co.add_argument("--content-rounds", type=_count(1), default=500,
                    help="rounds the duplicate-delta guard remembers an applied delta's values (default 500)")
    co.add_argument("--round-timeout", type=_positive_float, default=30.0, help="seconds per round (default 30)")
    co.add_argument("--h-steps", type=_count(1), default=20, help="local steps per round (default 20)")
    co.add_argument("--lr", type=_positive_float, default=0.1, help="inner lr (its peak; default 0.1)")
    co.add_argument("--inner", choices=("sgd", "nesterov", "adamw"), default="sgd",
                    help="inner optimizer each worker keeps across rounds (default sgd; DiLoCo uses adamw)")
    co.add_argument("--warmup-steps", type=_count(0), default=0,
                    help="linear warmup of the inner lr over this many global steps (round x H + step; default 0)")
    co.add_argument("--schedule", choices=("constant", "cosine"), default="constant",
                    help="inner lr after the warmup: constant, or cosine to 0 at the last round (default constant)")
    co.add_argument("--batch", type=_count(1), default=32, help="inner minibatch (default 32)")
    co.add_argument("--shards", type=_count(1), default=4, help="non-IID data shards (default 4)")
    co.add_argument("--outer", choices=("nesterov", "fedavg"), default="nesterov",
                    help="outer step: Nesterov momentum lr 0.7 / 0.9 (DiLoCo) or plain averaging (FedAvg)")  # fmt: skip
    co.add_argument("--outer-lr", type=_positive_float, default=None,
                    help="the Nesterov outer step's lr (default 0.7, DiLoCo's)")  # fmt: skip
    co.add_argument("--outer-momentum", type=float, default=None,
                    help="the Nesterov outer step's momentum, 0 <= m < 1 (default 0.9, DiLoCo's)")  # fmt: skip
    co.add_argument("--max-staleness", type=_count(0), default=1,
                    help="rounds a late delta may be behind and still count (default 1; 0: none)")  # fmt: skip
    co.add_argument("--staleness-weight", type=_positive_float, default=0.75,
                    help="weight of a delta s rounds late: this ** s (default 0.75)")  # fmt: skip
    co.add_argument("--live-window", type=_count(1), default=3,
                    help="live: a delta applied within this many rounds (default 3)")  # fmt: skip
    co.add_argument("--max-workers", type=_count(1), default=64, help="registry size (default 64)")
    co.add_argument("--max-delta-norm", type=_positive_float, default=100.0,
                    help="larger deltas are refused as corrupt (default 100)")  # fmt: skip
    co.add_argument(
        "--status-file", type=Path, default=Path("status.json"), help="figures file (default ./status.json)"
    )
    co.add_argument("--dry-run-dir", type=Path, default=None,
                    help="count DRY-RUN records here (default: the status file's directory)")  # fmt: skip
    co.add_argument("--seed", type=_count(0), default=0, help="model init and data split (default 0)")

    cl = sub.add_parser("client", help="train rounds as a worker (an ERAN-GRID job), or one --dry-run round")
    mode = cl.add_mutually_exclusive_group(required=True)
    mode.add_argument("--nats", metavar="URL", help="the coordinator's NATS server")
    mode.add_argument("--dry-run", action="store_true", help="one local round on synthetic data, no coordinator")
    cl.add_argument("--creds", type=Path, help="the worker credential file (issue-worker wrote it): its user is the id")
    cl.add_argument("--worker-id", help="on a server without auth; default: job-$ERAN_GRID_JOB_ID under ERAN-GRID")
    cl.add_argument("--outage-window", type=_positive_float, default=60.0,
                    help="seconds NATS may be away before exit 4 (default 60)")  # fmt: skip
    cl.add_argument("--rounds", type=_count(1), default=0, help="rounds to contribute (default: until training ends)")
    cl.add_argument("--timeout", type=_positive_float, default=5.0, help="seconds per NATS call (default 5)")
    cl.add_argument("--register-timeout", type=_positive_float, default=10.0,
                    help="seconds to wait for a coordinator to answer (default 10)")  # fmt: skip
    cl.add_argument("--idle-timeout", type=_positive_float, default=300.0,
                    help="no new round for this long: fail (default 300)")  # fmt: skip
    cl.add_argument("--steps", type=_count(1), default=20, help="--dry-run: local steps (default 20)")
    cl.add_argument("--out", type=Path, default=Path("."), help="--dry-run: where the DRY-RUN record goes (default .)")

    st = sub.add_parser("status", help="the honest figures: round, accuracy, live / registered workers, dry runs")
    src = st.add_mutually_exclusive_group(required=True)
    src.add_argument("--nats", metavar="URL", help="read the coordinator's state from JetStream")
    st.add_argument("--creds", type=Path, help="a credential file (any role reads the state)")
    src.add_argument("--file", type=Path, help="read a coordinator's status.json")
    st.add_argument("--json", action="store_true", help="one JSON object")
    st.add_argument("--dry-run-dir", type=Path, default=Path("."), help="count DRY-RUN records here (default .)")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.verb == "coordinator":
            return _coordinator(args)
        if args.verb == "client":
            return _client(args)
        return _status(args)
    except CloudError as exc:
        print(f"eran-cloud: error: {exc}", file=sys.stderr)
        if exc.hint:
            print(f"  {exc.hint}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("eran-cloud: interrupted", file=sys.stderr)
        return 130


def _coordinator(args: argparse.Namespace) -> int:
    if args.action is not None:
        return _auth(args)
    if not args.nats:
        raise UserError("coordinator needs --nats URL", hint="eran-cloud coordinator --nats nats://127.0.0.1:4222")
    from .auth import RESPONDER
    from .coordinator import Config, run
    from .outer import Outer
    from .store import Creds

    extra = {"staleness_weight": args.staleness_weight, "max_staleness": args.max_staleness,
             "aggregate": args.aggregate, "clip": args.clip, "trim": args.trim}  # fmt: skip
    if not 0.0 <= args.quorum_share <= 1.0:
        raise UserError(f"--quorum-share {args.quorum_share:g} is not a share in [0, 1]")
    if args.outer_momentum is not None and not 0.0 <= args.outer_momentum < 1.0:
        raise UserError(f"--outer-momentum {args.outer_momentum:g} is not in [0, 1)")
    if args.outer == "fedavg" and (args.outer_lr is not None or args.outer_momentum is not None):
        raise UserError("--outer-lr and --outer-momentum are the Nesterov step's; --outer fedavg has neither")
    if args.outer_lr is not None:
        extra["lr"] = args.outer_lr
    if args.outer_momentum is not None:
        extra["momentum"] = args.outer_momentum
    outer = Outer(**extra) if args.outer == "nesterov" else Outer.fedavg(**extra)
    cfg = Config(
        rounds=args.rounds, min_deltas=args.min_deltas, round_timeout=args.round_timeout, shards=args.shards,
        h_steps=args.h_steps, lr=args.lr, inner=args.inner, warmup=args.warmup_steps, schedule=args.schedule,
        batch=args.batch, seed=args.seed, outer=outer,
        live_window=args.live_window, max_workers=args.max_workers, max_delta_norm=args.max_delta_norm,
        expire_rounds=args.expire_rounds, suspect_after=args.suspect_after, outage_window=args.outage_window,
        min_grace=args.min_grace, quorum_share=args.quorum_share, content_rounds=args.content_rounds,
        status_path=args.status_file,
        dry_run_dir=args.dry_run_dir if args.dry_run_dir is not None else args.status_file.parent,
    )  # fmt: skip
    creds = Creds.load(args.creds) if args.creds else None
    reply_creds = None
    if creds is not None:
        reply_path = args.reply_creds or args.creds.with_name(f"{RESPONDER}.creds.json")
        if not reply_path.exists():
            raise UserError(
                f"no credential for the coordinator's replies at {reply_path}",
                hint="registrations are answered over a connection of their own that may write nothing but "
                "inboxes; run init-auth again on the auth dir (it adds the missing role and keeps the rest), "
                "or pass --reply-creds FILE",
            )
        reply_creds = Creds.load(reply_path)
    fig = asyncio.run(run(args.nats, cfg, _log, creds=creds, reply_creds=reply_creds))
    print(json.dumps(fig, sort_keys=True))
    return 0


def _auth(args: argparse.Namespace) -> int:
    from .auth import AuthDir

    auth = AuthDir(args.auth_dir)
    if args.action == "init-auth":
        made = auth.init(args.listen, args.store_dir or args.auth_dir / "jetstream")
        print(json.dumps({"config": str(auth.conf), "creds": [str(p) for p in made]}, sort_keys=True))
        _log(f"start the server with: nats-server -c {auth.conf}")
        return 0
    if args.action == "issue-worker":
        path = auth.issue(args.name, reload=not args.no_reload)
        print(json.dumps({"worker": args.name, "creds": str(path)}, sort_keys=True))
        _log(f"give {path} to the worker (mode 0600): eran-cloud client --nats URL --creds {path.name}")
        return 0
    auth.revoke(args.name, reload=not args.no_reload)
    return 0


def _client(args: argparse.Namespace) -> int:
    if args.dry_run:
        from . import dryrun

        record = dryrun.run(args.out, args.steps, _log)
        print(json.dumps(record, sort_keys=True))
        return 0
    from .client import Options, default_worker_id, print_result, run_live
    from .protocol import WORKER_ID
    from .store import Creds

    creds = Creds.load(args.creds) if args.creds else None
    if creds is not None:
        # On an authenticated server the worker is its user: the server lets it write nothing else.
        if args.worker_id and args.worker_id != creds.user:
            raise UserError(f"--worker-id {args.worker_id[:70]!r} is not the credential's user {creds.user!r}")
        worker = creds.user
    else:
        worker = args.worker_id or default_worker_id(dict(os.environ))
    if not WORKER_ID.match(worker):
        raise UserError(f"worker id {worker[:70]!r}: use 1-64 characters of A-Z a-z 0-9 _ -")
    ckpt = os.environ.get("ERAN_GRID_CHECKPOINT_DIR")
    opts = Options(
        worker=worker, rounds=args.rounds, timeout=args.timeout, register_for=args.register_timeout,
        idle_timeout=args.idle_timeout, checkpoint_dir=Path(ckpt) if ckpt else None, creds=creds,
        outage_window=args.outage_window,
    )  # fmt: skip
    code, result = run_live(args.nats, opts, _log)
    if result is not None:
        print_result(result)
    return code


def _status(args: argparse.Namespace) -> int:
    from . import status

    fig: Any
    if args.file is not None:
        try:
            fig = json.loads(args.file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read {args.file}: {exc}") from exc
        if not isinstance(fig, dict) or fig.get("schema") != status.SCHEMA:
            raise UserError(f"{args.file} is not an {status.SCHEMA} file")
    else:
        from .store import Creds

        creds = Creds.load(args.creds) if args.creds else None
        fig = asyncio.run(_status_live(args.nats, args.dry_run_dir, creds))
    if args.json:
        print(json.dumps(fig, sort_keys=True))
    else:
        print(status.render(fig))
    return 0


async def _status_live(url: str, dry_run_dir: Path, creds: Any) -> dict[str, Any]:
    from . import status
    from .errors import CoordinatorUnreachable
    from .store import TRANSPORT_ERRORS, Store, redact_url

    store = Store(url, name="eran-cloud status", creds=creds)
    await store.connect(create=False)
    try:
        row, _ = await store.get_json("state")
        if row is None:
            raise CoordinatorUnreachable(
                f"NATS at {redact_url(url)}: no round state: no coordinator has started training"
            )
        registered = row.get("registered")  # the coordinator's count (a reader may not list keys)
        if not isinstance(registered, int) or isinstance(registered, bool):
            registered = len(await store.keys("worker."))
        return status.figures(row, registered, status.count_dry_runs(dry_run_dir))
    except TRANSPORT_ERRORS as exc:
        raise store.unreachable(exc) from exc
    finally:
        await store.close()
