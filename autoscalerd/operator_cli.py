"""The operator's commands, all against the daemon's HTTP API: status, explain, pause,
resume, override.

A client only: it reads no config and no state file, so it works the same from the
daemon's host, a laptop through a tunnel, or a pod next to the sidecar. The URL is
--url, else $AUTOSCALERD_URL, else the daemon's default address; the token is the
content of --token-file, else $AUTOSCALERD_TOKEN, and is sent with every request (reads
need it under http.require_token_for_reads). Exit codes: 0 ok, 1 the daemon answered an
error or could not be reached, 2 bad usage. Every error is one line,
`autoscalerd: <url>: <what>; <fix>`.
"""

from __future__ import annotations

import argparse
import getpass
import http.client
import json
import os
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from autoscalerd import operator_view

COMMANDS = ("status", "explain", "pause", "resume", "override")
DEFAULT_URL = "http://127.0.0.1:8270"
URL_ENV = "AUTOSCALERD_URL"
TOKEN_ENV = "AUTOSCALERD_TOKEN"
# Every answer is computed from memory: a daemon that takes longer is wedged or elsewhere.
TIMEOUT_S = 5.0
# The decisions asked for by `explain --at`: all that the daemon keeps.
DECISIONS_KEPT = 1000
EXIT_OK, EXIT_FAILURE, EXIT_USAGE = 0, 1, 2


class ClientError(Exception):
    """The daemon answered an error or could not be reached: exit 1."""

    def __init__(self, url: str, what: str, fix: str = "") -> None:
        line = f"{url}: {what}"
        # The daemon's own messages often carry their fix already.
        if fix and "; " not in what:
            line += f"; {fix}"
        super().__init__(line)


class UsageError(Exception):
    """Bad usage found after parsing (an unreadable token file): exit 2."""


# ---------------------------------------------------------------- the command line


def add_parsers(sub: Any) -> None:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        type=_url,
        default=None,
        metavar="URL",
        help=f"the daemon's HTTP API (default: ${URL_ENV}, else {DEFAULT_URL})",
    )
    common.add_argument(
        "--token-file",
        metavar="FILE",
        help=f"file holding the bearer token (default: ${TOKEN_ENV})",
    )
    common.add_argument("--json", action="store_true", help="print the daemon's JSON as is")
    common.add_argument(
        "--timeout-s",
        type=_positive_float,
        default=TIMEOUT_S,
        metavar="S",
        help=f"seconds to wait for an answer (default {TIMEOUT_S:g})",
    )

    status = sub.add_parser(
        "status",
        parents=[common],
        help="every deployment's load, replicas, SLO, operator action, errors",
    )
    status.add_argument("deployment", nargs="?", metavar="DEPLOYMENT", help="only this one")

    explain = sub.add_parser(
        "explain", parents=[common], help="a decision stage by stage, with its reasons"
    )
    explain.add_argument("deployment", metavar="DEPLOYMENT")
    explain.add_argument(
        "--at",
        type=parse_time,
        metavar="TIME",
        help="the decision at or before TIME: seconds on the daemon's clock, or ISO-8601 "
        "(e.g. 2024-01-01T12:00:00Z); default the last one",
    )

    def who(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--reason", required=True, metavar="TEXT", help="why, for the audit trail (required)"
        )
        parser.add_argument(
            "--by", metavar="NAME", help="who, for the audit trail (default: your login name)"
        )

    pause = sub.add_parser("pause", parents=[common], help="hold a deployment's current target")
    pause.add_argument("deployment", metavar="DEPLOYMENT")
    who(pause)
    pause.add_argument(
        "--ttl-s",
        type=_positive_float,
        metavar="S",
        help="end the pause after S seconds of the daemon's clock (default: at resume)",
    )

    resume = sub.add_parser("resume", parents=[common], help="end a pause or an override")
    resume.add_argument("deployment", metavar="DEPLOYMENT")
    who(resume)

    override = sub.add_parser(
        "override", parents=[common], help="pin a deployment's target for a while"
    )
    override.add_argument("deployment", metavar="DEPLOYMENT")
    override.add_argument("replicas", type=_replicas, metavar="REPLICAS")
    who(override)
    override.add_argument(
        "--ttl-s",
        type=_positive_float,
        metavar="S",
        help="end the override after S seconds (default: the daemon's "
        "http.override_default_ttl_s, 1 h unless configured)",
    )


def run(args: argparse.Namespace) -> int:
    """Run one of COMMANDS; the exit code."""
    try:
        client = Client(
            args.url or _url(os.environ.get(URL_ENV) or DEFAULT_URL),
            _token(args.token_file),
            args.timeout_s,
        )
        return _COMMANDS[args.command](client, args)
    except UsageError as exc:
        print(f"autoscalerd: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except argparse.ArgumentTypeError as exc:  # $AUTOSCALERD_URL
        print(f"autoscalerd: ${URL_ENV}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ClientError as exc:
        print(f"autoscalerd: {exc}", file=sys.stderr)
        return EXIT_FAILURE


def _status(client: Client, args: argparse.Namespace) -> int:
    status = client.get("/v1/status")
    if args.deployment is not None:
        _managed(client, status, args.deployment)
    if args.json:
        shown = status if args.deployment is None else status["deployments"][args.deployment]
        _print_json(shown)
    else:
        print(operator_view.status_text(status, args.deployment))
    return EXIT_OK


def _explain(client: Client, args: argparse.Namespace) -> int:
    status = client.get("/v1/status")
    entry = _managed(client, status, args.deployment)
    if args.at is None:
        decision = entry.get("last_decision")
        if not decision:
            raise ClientError(
                client.url("/v1/status"),
                f"no decision for {args.deployment} yet",
                "wait for the first tick",
            )
    else:
        path = "/v1/decisions"
        query = {"deployment": args.deployment, "limit": str(DECISIONS_KEPT)}
        decisions = client.get(path, query).get("decisions") or []
        before = [d for d in decisions if d.get("decided_at_s", float("inf")) <= args.at]
        if not before:
            oldest = decisions[0].get("decided_at_s") if decisions else None
            kept = (
                f"the oldest kept is at {operator_view.when(oldest)}"
                if oldest is not None
                else "none is kept yet"
            )
            raise ClientError(
                client.url(path, query),
                f"no decision for {args.deployment} at or before {operator_view.when(args.at)}",
                f"{kept}; pick a later --at",
            )
        decision = before[-1]
    if args.json:
        _print_json(decision)
    else:
        history = entry.get("operator_history") or []
        print(operator_view.explain_text(decision, entry, history, status.get("now_s")))
    return EXIT_OK


def _pause(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"reason": args.reason, "by": _by(args)}
    if args.ttl_s is not None:
        body["ttl_s"] = args.ttl_s
    return _change(client, args, "pause", body)


def _resume(client: Client, args: argparse.Namespace) -> int:
    return _change(client, args, "resume", {"reason": args.reason, "by": _by(args)})


def _override(client: Client, args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"replicas": args.replicas, "reason": args.reason, "by": _by(args)}
    if args.ttl_s is not None:
        body["ttl_s"] = args.ttl_s
    return _change(client, args, "override", body, args.replicas)


def _change(
    client: Client,
    args: argparse.Namespace,
    action: str,
    body: dict[str, Any],
    requested: int | None = None,
) -> int:
    body = {k: v for k, v in body.items() if v is not None}
    name = urllib.parse.quote(args.deployment, safe="/")
    answer = client.post(f"/v1/deployments/{name}/{action}", body)
    if args.json:
        _print_json(answer)
    else:
        print(operator_view.change_text(answer, requested))
    return EXIT_OK


_COMMANDS = {
    "status": _status,
    "explain": _explain,
    "pause": _pause,
    "resume": _resume,
    "override": _override,
}


def _managed(client: Client, status: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    deployments = status.get("deployments") or {}
    if name not in deployments:
        managed = ", ".join(sorted(deployments)[:20]) or "none yet"
        waiting = (status.get("waiting") or {}).get(name)
        what = f"deployment {name!r} is not managed"
        what += f" (waiting: {waiting})" if waiting else f"; managed: {managed}"
        raise ClientError(client.url("/v1/status"), what, "pass one of those names")
    entry: Mapping[str, Any] = deployments[name]
    return entry


def _by(args: argparse.Namespace) -> str | None:
    if args.by:
        return str(args.by)
    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no login name: the daemon names the token instead
        return None


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, sort_keys=False))


# ---------------------------------------------------------------- argument types


def _url(text: str) -> str:
    parts = urllib.parse.urlsplit(text.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(
            f"must be an http:// or https:// URL, e.g. {DEFAULT_URL} (got {text!r})"
        )
    if parts.query or parts.fragment:
        raise argparse.ArgumentTypeError(f"must have no query or fragment (got {text!r})")
    return text.strip().rstrip("/")


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0 (got {text})")
    return value


def _replicas(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of replicas") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (got {text})")
    return value


def parse_time(text: str) -> float:
    """Seconds on the daemon's clock, or an ISO-8601 time (UTC unless it says otherwise)."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither seconds nor ISO-8601 (e.g. 1700000000 or 2024-01-01T12:00:00Z)"
        ) from None
    if at.tzinfo is None:
        at = at.replace(tzinfo=timezone.utc)
    return at.timestamp()


def _token(path: str | None) -> str | None:
    if path is None:
        return os.environ.get(TOKEN_ENV, "").strip() or None
    try:
        token = Path(path).expanduser().read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UsageError(
            f"--token-file {path}: cannot read ({reason}); pass a file holding the token"
        ) from None
    if not token:
        raise UsageError(f"--token-file {path}: empty; pass a file holding the token")
    return token


# ---------------------------------------------------------------- the HTTP client


class Client:
    """The daemon's HTTP API over urllib; every failure a ClientError of one line."""

    def __init__(self, base_url: str, token: str | None, timeout_s: float = TIMEOUT_S) -> None:
        self.base_url = base_url
        self.token = token
        self.timeout_s = timeout_s

    def url(self, path: str, query: Mapping[str, str] | None = None) -> str:
        suffix = f"?{urllib.parse.urlencode(query)}" if query else ""
        return f"{self.base_url}{path}{suffix}"

    def get(self, path: str, query: Mapping[str, str] | None = None) -> Any:
        return self._request("GET", self.url(path, query), None)

    def post(self, path: str, body: Mapping[str, Any]) -> Any:
        return self._request("POST", self.url(path), json.dumps(body).encode())

    def _request(self, method: str, url: str, data: bytes | None) -> Any:
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(url, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                return self._json(url, response.status, response.read())
        except urllib.error.HTTPError as error:
            raise self._refused(url, error) from None
        except urllib.error.URLError as error:
            raise self._unreachable(url, error.reason) from None
        except TimeoutError as error:
            raise self._unreachable(url, error) from None
        except (http.client.HTTPException, ConnectionError) as error:
            raise ClientError(
                url,
                f"the connection ended without an answer ({type(error).__name__})",
                "is --url autoscalerd's HTTP API?",
            ) from None

    def _json(self, url: str, status: int, raw: bytes) -> Any:
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise ClientError(
                url,
                f"HTTP {status}, but the answer is not JSON",
                "is --url autoscalerd's HTTP API?",
            ) from None

    def _refused(self, url: str, error: urllib.error.HTTPError) -> ClientError:
        try:
            raw = error.read()
            message = str(json.loads(raw.decode("utf-8"))["error"])
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
            message = error.reason if isinstance(error.reason, str) else "no JSON error"
        message = " ".join(message.split())
        fix = {
            401: f"set ${TOKEN_ENV} or pass --token-file",
            403: f"check the token in ${TOKEN_ENV} or --token-file",
            404: "is --url autoscalerd's HTTP API?",
        }.get(error.code, "see the autoscalerd log" if error.code >= 500 else "")
        return ClientError(url, f"HTTP {error.code}: {message}", fix)

    def _unreachable(self, url: str, reason: object) -> ClientError:
        if isinstance(reason, TimeoutError):
            return ClientError(
                url,
                f"no answer within {self.timeout_s:g} s",
                "is autoscalerd running there? check --url, or allow more with --timeout-s",
            )
        if isinstance(reason, ConnectionRefusedError):
            what = "cannot connect (connection refused)"
        elif isinstance(reason, socket.gaierror):
            what = f"cannot resolve the host ({reason.strerror or reason})"
        elif isinstance(reason, OSError):
            what = f"cannot connect ({reason.strerror or reason})"
        else:
            what = f"cannot connect ({reason})"
        return ClientError(
            url, what, f"is autoscalerd running with its HTTP API there? check --url or ${URL_ENV}"
        )
