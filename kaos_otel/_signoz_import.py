"""``kaos-otel dashboards import``: the SigNoz dashboard and alert rules into a running SigNoz.

SigNoz keeps dashboards and alert rules in its database, so they are created through its API:
``POST /api/v2/dashboards`` for the v2 (Perses) dashboard and ``POST /api/v1/rules`` for each
rule, authenticated with the ``SIGNOZ-API-KEY`` header (Settings -> API Keys; the key needs the
Editor role). It needs ``httpx`` (``pip install httpx``; the ``agent`` and ``dev`` extras have it).

    export SIGNOZ_API_KEY=...
    kaos-otel dashboards import --signoz http://localhost:8080 --dry-run
    kaos-otel dashboards import --signoz http://localhost:8080 --channel my-slack

``--dry-run`` changes nothing: it checks the files, the URL and the key, and sends every rule to
``POST /api/v1/testRule`` (SigNoz evaluates it once and, if it would fire, sends a test
notification to the rule's channels). Re-running skips what already exists (same dashboard title,
same alert name) unless ``--replace`` is given, which updates it in place.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from kaos_otel._trace_tree import printable
from kaos_otel.assets import AssetsMissingError, asset_root

API_KEY_HEADER = "SIGNOZ-API-KEY"
PAGE = 200

JsonObj = dict[str, Any]
Kind = Literal["dashboard", "rule"]


class ImportFailed(Exception):
    """A file or a SigNoz request failed; the message says what to do about it."""


@dataclass(frozen=True, slots=True)
class Item:
    """One dashboard or rule file to import."""

    kind: Kind
    path: Path
    body: JsonObj

    @property
    def title(self) -> str:
        if self.kind == "rule":
            return str(self.body["alert"])
        return str(self.body["spec"]["display"]["name"])


@dataclass(slots=True)
class Report:
    """What an import did: one printed line per item, and the failures counted."""

    failures: int = 0

    def ok(self, text: str) -> None:
        print(f"ok      {text}")

    def fail(self, text: str) -> None:
        self.failures += 1
        print(f"FAILED  {text}", file=sys.stderr)


# --- files --------------------------------------------------------------------------------
def load_item(path: Path) -> Item:
    """Read one JSON file and tell a v2 dashboard from an alert rule."""
    try:
        body = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ImportFailed(f"{path}: cannot read: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ImportFailed(f"{path}: not UTF-8 text ({exc.reason} at offset {exc.start})") from exc
    except json.JSONDecodeError as exc:
        raise ImportFailed(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise ImportFailed(f"{path}: expected a JSON object")
    if "alert" in body:
        if body.get("version") != "v5":
            raise ImportFailed(f'{path}: an alert rule needs "version": "v5"')
        if not isinstance(body.get("condition"), dict):
            raise ImportFailed(f"{path}: an alert rule needs a condition")
        return Item("rule", path, body)
    if isinstance(body.get("spec"), dict) and "schemaVersion" in body:
        if not isinstance(body["spec"].get("display"), dict) or "name" not in body["spec"]["display"]:
            raise ImportFailed(f"{path}: a v2 dashboard needs spec.display.name")
        return Item("dashboard", path, body)
    if "widgets" in body or "layout" in body:
        raise ImportFailed(f"{path}: this is a legacy v1 dashboard; import it from the SigNoz UI instead")
    raise ImportFailed(f"{path}: neither a v2 dashboard nor an alert rule")


def default_files() -> list[Path]:
    """The shipped SigNoz dashboard(s) and alert rules."""
    signoz = asset_root() / "dashboards" / "signoz"
    return sorted(signoz.glob("*.v2.json")) + sorted((signoz / "alerts").glob("*.json"))


def with_channels(rule: JsonObj, channels: Sequence[str]) -> JsonObj:
    """A copy of ``rule`` that notifies ``channels`` (names of SigNoz notification channels)."""
    if not channels:
        return rule
    copy: JsonObj = json.loads(json.dumps(rule))
    thresholds = copy.get("condition", {}).get("thresholds")
    if isinstance(thresholds, dict) and isinstance(thresholds.get("spec"), list):
        for threshold in thresholds["spec"]:
            if isinstance(threshold, dict):  # SigNoz refuses any other, with its reason
                threshold["channels"] = list(channels)
    else:  # schema v1 rules carry their channels at the top
        copy["preferredChannels"] = list(channels)
    return copy


# --- SigNoz API ---------------------------------------------------------------------------
def _one_line(text: str, limit: int) -> str:
    """The start of a body as one line of plain text (an HTML page, a proxy's error page...)."""
    return printable(" ".join(text.split())[:limit])


def _error_message(response: httpx.Response) -> str:
    """The reason SigNoz gives in an error body, whatever its shape."""
    try:
        body = response.json()
    except ValueError:
        return _one_line(response.text, 500) or response.reason_phrase
    if isinstance(body, dict):
        error = body.get("error")
        if isinstance(error, dict):
            parts = [str(error.get("message") or error.get("code") or "")]
            for extra in error.get("errors") or []:
                if isinstance(extra, dict) and extra.get("message"):
                    parts.append(str(extra["message"]))
            return "; ".join(p for p in parts if p)
        if error:
            return str(error)
        if body.get("message"):
            return str(body["message"])
    return json.dumps(body)[:500]


def _check_api_key(api_key: str) -> None:
    """Refuse a key an HTTP header cannot carry, without showing it (httpx would fail each request
    with the key in its message, or with a traceback for a non-ASCII one)."""
    for position, character in enumerate(api_key, 1):
        if not " " <= character <= "~":
            kind = "a control character" if character.isascii() else "a non-ASCII character"
            raise ImportFailed(
                f"the API key has {kind} at position {position} of {len(api_key)}, which an HTTP header "
                "cannot carry: copy it again from SigNoz (Settings -> API Keys) into --api-key or "
                "SIGNOZ_API_KEY"
            )


class SigNozClient:
    """The few SigNoz API calls an import needs."""

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        rules_api: Literal["v1", "v2"] = "v1",
        timeout: float = 30.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        self.rules_api = rules_api
        _check_api_key(api_key)
        try:
            self._http = httpx.Client(
                base_url=self.url,
                headers={API_KEY_HEADER: api_key, "Accept": "application/json"},
                timeout=timeout,
                transport=transport,
            )
        except httpx.InvalidURL as exc:
            raise ImportFailed(f"the SigNoz URL {url!r} is not valid: {exc} (--signoz / SIGNOZ_URL)") from exc
        # "localhost:8080" reads as scheme "localhost"
        if self._http.base_url.scheme not in ("http", "https"):
            raise ImportFailed(
                f"the SigNoz URL {url!r} is not valid: it starts with neither http:// nor https:// "
                "(--signoz / SIGNOZ_URL)"
            )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SigNozClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, method: str, path: str, *, body: JsonObj | None = None, **params: Any) -> Any:
        try:
            response = self._http.request(method, path, json=body, params=params or None)
        except httpx.TimeoutException as exc:
            raise ImportFailed(f"{method} {self.url}{path}: timed out ({exc})") from exc
        except httpx.TransportError as exc:
            raise ImportFailed(f"cannot reach SigNoz at {self.url}: {exc}") from exc
        if response.status_code in (401, 403):
            raise ImportFailed(
                f"{method} {path}: HTTP {response.status_code} {_error_message(response)} "
                f"(check the API key in {API_KEY_HEADER} / SIGNOZ_API_KEY; it needs the Editor role)"
            )
        if response.status_code == 404:
            hint = (
                "v2 dashboards need SigNoz >= v0.135"
                if "dashboards" in path
                else f"try --rules-api {'v2' if self.rules_api == 'v1' else 'v1'}"
            )
            raise ImportFailed(f"{method} {path}: HTTP 404 {_error_message(response)} ({hint})")
        location = response.headers.get("Location")
        if 300 <= response.status_code < 400 and location:
            raise ImportFailed(
                f"{method} {path}: HTTP {response.status_code} redirect to {location} "
                "(--signoz must be the address SigNoz answers on, not one that redirects)"
            )
        if not response.is_success:
            raise ImportFailed(f"{method} {path}: HTTP {response.status_code}: {_error_message(response)}")
        if response.status_code == 204 or not response.content:
            return None
        try:
            payload = response.json()
        except ValueError as exc:
            raise ImportFailed(
                f"{method} {path}: SigNoz answered with non-JSON: {_one_line(response.text, 200)}"
            ) from exc
        if isinstance(payload, dict) and payload.get("status") == "error":
            raise ImportFailed(f"{method} {path}: {_error_message(response)}")
        return payload.get("data") if isinstance(payload, dict) and "data" in payload else payload

    def _create(self, path: str, body: JsonObj) -> JsonObj:
        """POST ``body`` to ``path``: the created item as SigNoz answers it (without an id: a failure)."""
        created = self._call("POST", path, body=body)
        if not isinstance(created, dict) or created.get("id") in (None, ""):
            raise ImportFailed(
                f"POST {path}: the answer has no id of a created item (is {self.url} SigNoz?): "
                f"{json.dumps(created)[:200]}"
            )
        return created

    # dashboards
    def dashboards(self) -> Iterator[JsonObj]:
        """Every v2 dashboard (paged)."""
        offset = 0
        while True:
            data = self._call("GET", "/api/v2/dashboards", limit=PAGE, offset=offset)
            data = data if isinstance(data, dict) else {}
            page = [d for d in data.get("dashboards") or [] if isinstance(d, dict)]
            yield from page
            offset += len(page)
            total = data.get("total")
            if len(page) < PAGE or (total is not None and offset >= int(total)):
                return

    def create_dashboard(self, body: JsonObj) -> JsonObj:
        return self._create("/api/v2/dashboards", body)

    def update_dashboard(self, existing: JsonObj, body: JsonObj) -> Any:
        updatable = {
            "name": existing.get("name") or body.get("name") or "",
            "schemaVersion": body["schemaVersion"],
            "image": body.get("image", ""),
            "tags": body.get("tags") or [],
            "spec": body["spec"],
        }
        return self._call("PUT", f"/api/v2/dashboards/{existing['id']}", body=updatable)

    # rules
    def rules(self) -> list[JsonObj]:
        data = self._call("GET", f"/api/{self.rules_api}/rules")
        rules = data.get("rules") if isinstance(data, dict) else data
        return [r for r in rules or [] if isinstance(r, dict)]

    def create_rule(self, body: JsonObj) -> JsonObj:
        return self._create(f"/api/{self.rules_api}/rules", body)

    def update_rule(self, rule_id: str, body: JsonObj) -> Any:
        return self._call("PUT", f"/api/{self.rules_api}/rules/{rule_id}", body=body)

    def test_rule(self, body: JsonObj) -> Any:
        path = "/api/v1/testRule" if self.rules_api == "v1" else "/api/v2/rules/test"
        return self._call("POST", path, body=body)


# --- the import ---------------------------------------------------------------------------
def _dashboard_title(listed: JsonObj) -> str:
    spec = listed.get("spec") or {}
    display = spec.get("display") or {}
    return str(display.get("name") or listed.get("name") or "")


def run_import(
    client: SigNozClient,
    items: Sequence[Item],
    *,
    dry_run: bool = False,
    replace: bool = False,
    channels: Sequence[str] = (),
) -> Report:
    """Create (or, with ``replace``, update) every item; with ``dry_run`` only test them. What this
    run created (or, dry, would create) counts as existing: a title given twice is created once.
    Dashboards that cannot be listed (a SigNoz without v2 dashboards) do not stop the rules."""
    report = Report()
    dashboards = [i for i in items if i.kind == "dashboard"]
    rules = [i for i in items if i.kind == "rule"]
    if dashboards:
        _import_dashboards(client, dashboards, report, dry_run=dry_run, replace=replace)
    if rules:
        _import_rules(client, rules, report, dry_run=dry_run, replace=replace, channels=channels)
    return report


def _import_dashboards(
    client: SigNozClient, dashboards: Sequence[Item], report: Report, *, dry_run: bool, replace: bool
) -> None:
    try:
        existing_dashboards = {_dashboard_title(d): d for d in client.dashboards()}
    except ImportFailed as exc:
        report.fail(f"listing dashboards: {exc}")
        return
    for item in dashboards:
        found = existing_dashboards.get(item.title)
        try:
            if dry_run:
                action = (
                    "would update" if found and replace else "exists, would skip" if found else "would create"
                )
                report.ok(f"dashboard {item.title!r}: {action} ({item.path.name})")
                existing_dashboards.setdefault(item.title, {"title": item.title})  # as the run would
            elif found and not replace:
                report.ok(
                    f"dashboard {item.title!r}: exists (id {found.get('id')}), skipped (--replace updates it)"
                )
            elif found:
                client.update_dashboard(found, item.body)
                report.ok(f"dashboard {item.title!r}: updated (id {found.get('id')})")
            else:
                created = client.create_dashboard(item.body)
                existing_dashboards[item.title] = created
                report.ok(f"dashboard {item.title!r}: created (id {created['id']})")
        except ImportFailed as exc:
            report.fail(f"dashboard {item.title!r} ({item.path.name}): {exc}")


def _import_rules(
    client: SigNozClient,
    rules: Sequence[Item],
    report: Report,
    *,
    dry_run: bool,
    replace: bool,
    channels: Sequence[str],
) -> None:
    try:
        existing_rules = {str(r.get("alert")): r for r in client.rules()}
    except ImportFailed as exc:
        report.fail(f"listing rules: {exc}")
        return
    for item in rules:
        body = with_channels(item.body, channels)
        found = existing_rules.get(item.title)
        try:
            if dry_run:
                result = client.test_rule(body)
                detail = ""
                if isinstance(result, dict):
                    detail = f": {result.get('alertCount', 0)} alert(s) now"
                    if result.get("message"):
                        detail += f" ({result['message']})"
                state = "exists" if found else "new"
                report.ok(f"rule {item.title!r} ({state}): testRule passed{detail}")
                existing_rules.setdefault(item.title, {"alert": item.title})  # as the run would
            elif found and not replace:
                report.ok(
                    f"rule {item.title!r}: exists (id {found.get('id')}), skipped; --replace updates it"
                )
            elif found:
                client.update_rule(str(found["id"]), body)
                report.ok(f"rule {item.title!r}: updated (id {found['id']})")
            else:
                created = client.create_rule(body)
                existing_rules[item.title] = created
                report.ok(f"rule {item.title!r}: created (id {created['id']})")
        except ImportFailed as exc:
            report.fail(f"rule {item.title!r} ({item.path.name}): {exc}")


def main(argv: Sequence[str] | None = None, *, transport: httpx.BaseTransport | None = None) -> int:
    """Parse ``argv`` like ``kaos-otel dashboards import`` and run it (tests pass a fake transport)."""
    from kaos_otel.cli import add_signoz_import_arguments

    parser = argparse.ArgumentParser(prog="kaos-otel dashboards import")
    add_signoz_import_arguments(parser)
    return run(parser.parse_args(argv), transport=transport)


def run(args: argparse.Namespace, *, transport: httpx.BaseTransport | None = None) -> int:
    """Exit status: 0 all done, 1 something failed, 2 bad usage or bad files."""
    api_key = (args.api_key or "").strip()  # pasted with a line break or a space around it
    if not api_key:
        print(
            "error: no API key: pass --api-key or set SIGNOZ_API_KEY (SigNoz: Settings -> API Keys)",
            file=sys.stderr,
        )
        return 2
    try:
        items = [load_item(path) for path in (args.files or default_files())]
    except (ImportFailed, AssetsMissingError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.only:
        items = [i for i in items if i.kind == args.only.removesuffix("s")]
    if not items:
        print("error: nothing to import", file=sys.stderr)
        return 2
    try:
        client = SigNozClient(
            args.url, api_key, rules_api=args.rules_api, timeout=args.timeout, transport=transport
        )
    except ImportFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    mode = "dry run against" if args.dry_run else "importing into"
    print(f"{mode} {args.url}: {len(items)} file(s)")
    with client:
        report = run_import(client, items, dry_run=args.dry_run, replace=args.replace, channels=args.channel)
    if report.failures:
        print(f"{report.failures} failure(s)", file=sys.stderr)
        return 1
    return 0
