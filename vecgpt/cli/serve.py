"""`vecgpt serve`: the playground and the streaming-attention page on http://127.0.0.1:8000/ (see docs/playground.md)."""

from __future__ import annotations

import argparse
import os

from vecgpt.errors import VecgptError


def _positive(kind):
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
        return value

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        action="append",
        help="TOML file of a store to offer (repeat for several; default: the default config, FAISS)",
    )
    p.add_argument("--store", metavar="LOCATION", help="override each config's location (folder, schema or prefix)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port (0: any free one; the address is printed)")
    p.add_argument("--workers", type=_positive(int), default=1, help="server processes sharing the port")
    p.add_argument("--idle", type=_positive(float), default=900.0, help="close a text untouched this many seconds")
    p.add_argument("--max-texts", type=_positive(int), default=64, help="texts one process keeps open at once")
    p.add_argument("--max-prompt", type=_positive(int), default=4000, help="longest prompt, in characters")
    p.add_argument("--max-body", type=_positive(int), default=16384, help="largest request body, in bytes")
    p.add_argument(
        "--token", help="require this token (16+ characters; default $VECGPT_TOKEN): ?token= once, then a cookie"
    )
    p.add_argument("--make-token", action="store_true", help="make a token and print the address with it")
    p.add_argument(
        "--allow-host", action="append", default=[], metavar="NAME", help="another name the Host header may carry"
    )
    p.add_argument(
        "--max-dollars-per-hour",
        type=_positive(float),
        default=1.0,
        help="spending limit over stores that charge (turbopuffer), all workers together (default 1.0)",
    )
    p.add_argument("--rate", type=_positive(float), default=10.0, help="requests a second per client (bursts: 10 s)")


def run(args) -> int:
    from vecgpt.config import load_config
    from vecgpt.playground.app import serve
    from vecgpt.playground.server import Settings

    if not 0 <= args.port <= 65535:
        raise VecgptError(f"--port must be 0..65535, not {args.port}")
    token, made = token_of(args)
    for path in args.config or []:
        load_config(path)  # a bad config is one line now, not in every worker
    settings = Settings(
        configs=args.config or [None],
        store=args.store,
        idle_s=args.idle,
        max_texts=args.max_texts,
        max_prompt_chars=args.max_prompt,
        max_body_bytes=args.max_body,
        host=args.host,
        token=token,
        allow_hosts=args.allow_host,
        max_dollars_per_hour=args.max_dollars_per_hour,
        workers=args.workers,
        rate_per_s=args.rate,
        burst=10 * args.rate,
    )
    try:
        serve(settings, args.port, show_token=made)
    except OSError as e:
        raise VecgptError(f"cannot listen on {args.host}:{args.port} ({e.strerror or e})") from None
    return 0


def token_of(args) -> tuple[str | None, bool]:
    """(the token, whether it was made here); beyond loopback a token is required."""
    import secrets

    from vecgpt.playground.guard import is_loopback

    token = args.token or os.environ.get("VECGPT_TOKEN") or None
    if token is not None and (len(token) < 16 or not token.isprintable() or " " in token):
        raise VecgptError("a token needs at least 16 characters and no spaces; --make-token makes one")
    if token is None and args.make_token:
        return secrets.token_urlsafe(24), True
    if token is None and not is_loopback(args.host):
        raise VecgptError(
            f"--host {args.host} lets other machines in: give a token (--make-token, --token or VECGPT_TOKEN)"
        )
    return token, False
