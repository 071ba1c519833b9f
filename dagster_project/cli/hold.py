"""`dflash hold`: the line's hold (a quality gate failed on the answers arriving), shown and released."""

from __future__ import annotations

import argparse
import getpass
import socket
from datetime import UTC, datetime
from typing import Any

from dagster_project.cli.common import open_configured_store
from dagster_project.shown_text import shown


def _when(at: float | None) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC") if at else "—"


def describe_hold(hold: Any) -> list[str]:
    """The hold's lines: headline, the gate's verdict, the evidence and who is involved; what the data and the
    servers wrote escaped (`shown`), each line one line."""
    lines = [hold.headline(), f"  gate's verdict: {hold.message}"]
    lines += [f"  example {e.event_id} ({e.server or 'server unknown'}): '{e.answer_head}'" for e in hold.examples]
    lines.append(
        f"  shards {hold.shards}; runs {', '.join(hold.runs) or '—'}; servers {', '.join(hold.servers) or '—'}"
    )
    return [shown(line) for line in lines]


def cmd_hold(args: argparse.Namespace, resources: Any) -> int:
    from dagster_project.generation.line_hold import read_hold, read_hold_log, release_hold

    store = open_configured_store()
    if args.action == "release":
        by = args.by or f"{getpass.getuser()}@{socket.gethostname()}"
        try:
            released = release_hold(store, by=by, reason=args.reason, override=args.override, drop_all=args.drop_all)
        except LookupError as exc:
            raise SystemExit(f"dflash hold release: {exc}") from None
        overridden = f"; gates overridden from now on: {', '.join(released.overridden)}" if released.overridden else ""
        released_line = (
            f"hold on gate {released.gate} released by {by} at {_when(released.released_at)} ({args.reason})"
            f"{overridden}; {_dropped(released)}. Now {released.rerun()} (it generates only what is missing)"
        )
        print(shown(released_line))
        return 0
    hold = read_hold(store)
    print("\n".join(describe_hold(hold)) if hold is not None else "the line is not held")
    log = read_hold_log(store)
    for past in log.released[-args.last :] if args.last else []:
        overridden = f", overriding {', '.join(past.overridden)}" if past.overridden else ""
        print(
            shown(
                f"released: gate {past.gate} held {_when(past.held_at)}, released {_when(past.released_at)} by "
                f"{past.released_by}: {past.release_reason}{overridden}"
            )
        )
    return 0


def _dropped(released: Any) -> str:
    """What the held shards' next runs drop from their journals (`line_stop.condemned_answers`)."""
    if released.overridden:
        return "a false alarm: every answer the held runs journaled is kept"
    if released.drop_all or released.onset is None:
        why = "--drop-all" if released.drop_all else "the onset is unknown"
        return f"every answer the held runs journaled is dropped and generated again ({why})"
    return (
        f"answers journaled from the onset {_when(released.onset)} (the first to fail the gate on its own) are "
        "dropped and generated again; those before it are kept"
    )


def hold_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", nargs="?", choices=("show", "release"), default="show")
    parser.add_argument("--reason", help="release: why the line may run again (recorded)")
    parser.add_argument("--by", help="release: who releases it (default user@host)")
    parser.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="GATE",
        help="release: a known false alarm: the watch no longer holds on GATE (recorded in the manifests)",
    )
    parser.add_argument(
        "--drop-all",
        action="store_true",
        help="release: drop every answer the held runs journaled, not only those from the hold's onset on",
    )
    parser.add_argument("--last", type=int, default=5, help="show: the last N released holds (default 5)")
    parser.set_defaults(func=_checked)


def _checked(args: argparse.Namespace, resources: Any) -> int:
    if args.action == "release" and not args.reason:
        raise SystemExit("dflash hold release: say why with --reason TEXT (it is recorded with who and when)")
    if args.action != "release" and args.override:
        raise SystemExit("dflash hold: --override goes with release (`dflash hold release --override GATE ...`)")
    if args.action != "release" and args.drop_all:
        raise SystemExit("dflash hold: --drop-all goes with release (`dflash hold release --drop-all ...`)")
    if args.override and args.drop_all:
        raise SystemExit("dflash hold release: --override keeps every answer, --drop-all drops them: choose one")
    return cmd_hold(args, resources)
