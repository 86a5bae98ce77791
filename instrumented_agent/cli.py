"""The ``kaos-agent`` command line: ``serve {agent,model,mcp}`` and ``demo``."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from instrumented_agent.config import ConfigError, add_agent_arguments, agent_config_from_args
from instrumented_agent.errors import ListenError
from kaos_otel._cli_support import add_version, parse_args, port_number

__all__ = ["main"]

ENV_MODEL_LATENCY_MS = "KAOS_MODEL_LATENCY_MS"
_QUIET_LOGGERS = ("httpx", "httpx2", "mcp", "uvicorn.error")


def _configure_logging() -> None:
    """INFO logs to stderr with trace and span ids (the manager also exports them over OTLP)."""
    from kaos_otel import console_handler

    root = logging.getLogger()
    root.setLevel(logging.INFO)
    root.addHandler(console_handler())
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)


def _serve_agent(args: argparse.Namespace) -> int:
    from instrumented_agent.server import create_agent_app
    from instrumented_agent.serving import serve
    from kaos_otel import KaosOtelManager

    try:
        config = agent_config_from_args(args)
    except ConfigError as exc:
        print(f"kaos-agent serve agent: error: {exc}", file=sys.stderr)
        return 2
    otel = KaosOtelManager(service_name=config.name)
    _configure_logging()
    try:
        serve(create_agent_app(config, otel), args.host, args.port, args.fd)
    finally:
        otel.shutdown()
    return 0


def _serve_model(args: argparse.Namespace) -> int:
    from instrumented_agent.model_server import create_model_app
    from instrumented_agent.serving import serve

    logging.basicConfig(level=logging.INFO)
    serve(create_model_app(latency_s=args.latency_ms / 1000), args.host, args.port, args.fd)
    return 0


def _serve_mcp(args: argparse.Namespace) -> int:
    from instrumented_agent.mcp_servers import create_mcp_app
    from instrumented_agent.serving import serve
    from kaos_otel import KaosOtelManager

    otel = KaosOtelManager(service_name=f"mcp-{args.server}")
    _configure_logging()
    try:
        serve(create_mcp_app(args.server), args.host, args.port, args.fd)
    finally:
        otel.shutdown()
    return 0


def _demo(args: argparse.Namespace) -> int:
    from instrumented_agent.demo import SCENARIOS, run_demo
    from instrumented_agent.faults import parse_fault
    from instrumented_agent.live import LiveTraffic

    names = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
    live = None
    if args.duration is not None:
        try:
            faults = tuple(parse_fault(f, args.duration / 3) for f in args.fault)
        except ValueError as exc:
            print(f"kaos-agent demo: error: {exc}", file=sys.stderr)
            return 2
        late = [f"{f.fault.value}@{f.start_s:g}" for f in faults if f.start_s >= args.duration]
        if late:
            print(
                f"kaos-agent demo: error: {', '.join(late)} starts after the run ends "
                f"(--duration {args.duration:g})",
                file=sys.stderr,
            )
            return 2
        live = LiveTraffic(args.duration, args.rate, faults)
    elif args.fault:
        print("kaos-agent demo: error: --fault needs --duration", file=sys.stderr)
        return 2
    return run_demo(
        names,
        json_mode=args.json,
        workdir=args.workdir,
        startup_timeout_s=args.startup_timeout if live is None else max(args.startup_timeout, 120.0),
        model_latency_ms=args.latency_ms,
        live=live,
    )


def _directory(text: str) -> Path:
    """An ``argparse`` type: a directory, existing or to be made (not an existing file)."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} exists and is not a directory")
    return path


def _positive(text: str) -> float:
    """An ``argparse`` type: a finite number above 0 (``nan`` would wait or send forever, or never)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not above 0")
    return value


def _not_negative(text: str) -> float:
    """An ``argparse`` type: a finite number, 0 or more."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text} is below 0")
    return value


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text} is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number")
    return value


def _add_listen_arguments(parser: argparse.ArgumentParser, port: int) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=port_number, default=port, help=f"port to bind (default {port})")
    parser.add_argument("--fd", type=int, help="serve on this inherited listening socket instead")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kaos-agent", description="The kaos-otel reference multi-agent system."
    )
    add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run one service in the foreground, as a container would")
    kinds = serve.add_subparsers(dest="kind", required=True)
    agent = kinds.add_parser("agent", help="an agent (OpenAI-compatible API)")
    add_agent_arguments(agent)
    _add_listen_arguments(agent, 8000)
    agent.set_defaults(handler=_serve_agent)
    model = kinds.add_parser("model", help="the scripted OpenAI-compatible model")
    model.add_argument(
        "--latency-ms",
        type=_not_negative,
        default=os.environ.get(ENV_MODEL_LATENCY_MS, "0"),  # text: read by the type, as the flag is
        help=f"delay per reply (env {ENV_MODEL_LATENCY_MS})",
    )
    _add_listen_arguments(model, 8100)
    model.set_defaults(handler=_serve_model)
    mcp = kinds.add_parser("mcp", help="an MCP server over streamable HTTP (path /mcp)")
    mcp.add_argument("server", choices=["calculator", "echo"])
    _add_listen_arguments(mcp, 8200)
    mcp.set_defaults(handler=_serve_mcp)

    demo = commands.add_parser("demo", help="run the multi-agent demo locally and print its traces")
    demo.add_argument("--scenario", choices=["research", "failure", "all"], default="all")
    demo.add_argument("--json", action="store_true", help="print a machine-readable summary on stdout")
    demo.add_argument(
        "--workdir", type=_directory, help="where logs and telemetry go (default .kaos/demo/<time>)"
    )
    demo.add_argument(
        "--startup-timeout", type=_positive, default=40.0, help="seconds to wait for all services"
    )
    demo.add_argument("--latency-ms", type=_not_negative, default=0.0, help="scripted model delay per reply")
    demo.add_argument(
        "--duration",
        type=_positive,
        help="live mode: send user requests for this many seconds (metrics exported every 2 s)",
    )
    demo.add_argument(
        "--rate", type=_positive, default=1.0, help="live mode: requests per second (default 1)"
    )
    demo.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME[@START[-END]]",
        help="live mode: switch a fault on START s into the run (default a third in) until END "
        "(default the end): memory-latency, memory-errors, model-errors, model-latency, subagent-down",
    )
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``kaos-agent``; what it writes (databases, logs, telemetry files) is the
    user's only: files 0600, directories 0700."""
    os.umask(0o077)
    args = parse_args(_parser(), argv)
    try:
        code: int = args.handler(args)
    except ListenError as exc:
        print(f"kaos-agent: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the command handles it itself (while importing, say)
        print("kaos-agent: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # whoever read the output went away (`| head`): everything is stopped
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] in ("instrumented_agent", "kaos_otel"):
            raise
        print(
            f"kaos-agent: error: {exc.name} is not installed; the reference system needs the agent "
            "extra: pip install 'kaos-otel[agent]'",
            file=sys.stderr,
        )
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main())
