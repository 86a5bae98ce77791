"""No secret leaves: a corpus of secrets in many encodings, through the real exporter, in every mode.

Each placement puts one secret (a provider key shape, a private key, a JWT, URL credentials, an
HTTP credential header) into a text (next to newlines, tabs, quotes, JSON escapes, URL encoding)
and the text into every channel an application has: a span attribute, a span event, a log line,
an exception message, prompt and response messages and tool arguments. The receiver's raw
export requests are then searched for any part of any secret, in any of its encodings.
The secrets are generated at run time (random bodies in the providers' shapes).
"""

from __future__ import annotations

import base64
import json
import logging
import random
import string
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import quote, quote_plus

import pytest

from kaos_otel import KaosOtelManager
from kaos_otel._config import ContentCapture
from kaos_otel._secrets import REDACTED, default_redactor
from kaos_otel.receiver import OtlpReceiver

MakeOtel = Callable[..., KaosOtelManager]
LOGGER = "test.secrets"
RNG = random.Random(20261130)
ALNUM = string.ascii_letters + string.digits
B64 = ALNUM + "+/"


def _random(alphabet: str, size: int) -> str:
    return "".join(RNG.choice(alphabet) for _ in range(size))


@dataclass(frozen=True)
class Secret:
    """A text fragment holding secret values, and those values (what must never be exported)."""

    kind: str
    text: str
    values: tuple[str, ...]


def _pem() -> Secret:
    lines = [_random(B64, 64) for _ in range(4)]
    body = "\n".join(lines)
    return Secret(
        "pem", f"-----BEGIN RSA PRIVATE KEY-----\n{body}\n-----END RSA PRIVATE KEY-----", tuple(lines)
    )


def _pgp() -> Secret:
    lines = [_random(B64, 64) for _ in range(4)]
    body = "\n".join(lines)
    return Secret(
        "pgp",
        f"-----BEGIN PGP PRIVATE KEY BLOCK-----\n\n{body}\n-----END PGP PRIVATE KEY BLOCK-----",
        tuple(lines),
    )


def _jwt() -> Secret:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).decode().rstrip("=")

    token = part({"alg": "HS256", "typ": "JWT"}) + "." + part({"sub": _random(ALNUM, 12)}) + "."
    token += _random(ALNUM + "-_", 43)
    return Secret("jwt", token, (token.split(".", 1)[1],))


def _jwe() -> Secret:
    """A compact JWE (a NextAuth session cookie's shape): header, encrypted key (empty with
    ``dir``), IV, ciphertext, tag."""
    header = base64.urlsafe_b64encode(b'{"alg":"dir","enc":"A256GCM"}').decode().rstrip("=")
    ciphertext = _random(ALNUM + "-_", 120)
    token = f"{header}..{_random(ALNUM + '-_', 16)}.{ciphertext}.{_random(ALNUM + '-_', 22)}"
    return Secret("jwe", token, (ciphertext,))


def _plain(kind: str, make: Callable[[], str]) -> Callable[[], Secret]:
    def build() -> Secret:
        value = make()
        return Secret(kind, value, (value,))

    return build


def _labelled(kind: str, template: str, make: Callable[[], str]) -> Callable[[], Secret]:
    def build() -> Secret:
        value = make()
        return Secret(kind, template.format(value), (value,))

    return build


def _aws_pair() -> Secret:
    key_id = "AKIA" + _random(string.ascii_uppercase + string.digits, 16)
    secret = _random(B64, 40)
    return Secret("aws-pair", f"{key_id} {secret}", (key_id, secret))


def _odbc() -> Secret:
    first, second = _random(ALNUM, 16), _random(ALNUM + "!#", 16)
    text = f"Driver={{ODBC Driver 18}};Server=db;Uid=app;Pwd={{{first};{second}}};Database=app"
    return Secret("odbc-braced-password", text, (first, second))


HEX = string.digits + "abcdef"
UPPER = string.ascii_uppercase + string.digits

SECRETS: tuple[Callable[[], Secret], ...] = (
    _plain("openai", lambda: "sk-" + _random(ALNUM, 48)),
    _plain("openai-project", lambda: "sk-proj-" + _random(ALNUM + "-_", 120)),
    _plain("anthropic", lambda: "sk-ant-api03-" + _random(ALNUM + "-_", 93) + "AA"),
    _plain("aws-key-id", lambda: "AKIA" + _random(string.ascii_uppercase + string.digits, 16)),
    _aws_pair,
    _labelled("aws-secret", "AWS_SECRET_ACCESS_KEY={}", lambda: _random(B64, 40)),
    _plain("github", lambda: "ghp_" + _random(ALNUM, 36)),
    _plain("github-fine-grained", lambda: "github_pat_" + _random(ALNUM, 22) + "_" + _random(ALNUM, 59)),
    _plain(
        "slack",
        lambda: f"xoxb-{RNG.randrange(10**11, 10**12)}-{RNG.randrange(10**12, 10**13)}-{_random(ALNUM, 24)}",
    ),
    _plain("google", lambda: "AIza" + _random(ALNUM + "-_", 35)),
    _plain("stripe", lambda: "sk_live_" + _random(ALNUM, 24)),
    _pem,
    _jwt,
    _jwe,
    _labelled(
        "git-token-url",
        "git clone https://{}@github.com/kaos/agents.git",
        lambda: _random(string.digits, 2) + _random(ALNUM, 38),
    ),
    _labelled("url-credentials", "postgres://app:{}@db.internal:5432/prod", lambda: _random(ALNUM, 20)),
    _labelled("authorization-bearer", "Authorization: Bearer {}", lambda: _random(ALNUM + "._-", 40)),
    _labelled(
        "authorization-basic",
        "Authorization: Basic {}",
        lambda: base64.b64encode(_random(ALNUM, 24).encode()).decode(),
    ),
    _labelled("cookie", "Cookie: session={}; theme=dark", lambda: _random(ALNUM, 32)),
    _labelled("set-cookie", "Set-Cookie: sid={}; Path=/; HttpOnly", lambda: _random(ALNUM, 32)),
    _labelled("password-json", '{{"password": "{}"}}', lambda: _random(ALNUM + "!#$", 14)),
    _labelled("api-key-env", "OPENAI_API_KEY={}", lambda: _random(ALNUM, 40)),
    _pgp,
    _plain("huggingface", lambda: "hf_" + _random(ALNUM, 34)),
    _plain("gitlab", lambda: "glpat-" + _random(ALNUM + "_-", 20)),
    _plain("groq", lambda: "gsk_" + _random(ALNUM, 52)),
    _plain("npm", lambda: "npm_" + _random(ALNUM, 36)),
    _plain("google-oauth", lambda: "ya29." + _random(ALNUM + "_-", 60)),
    _labelled(  # a password with the characters DSNs leave unencoded
        "url-credentials-symbols",
        "mysql://admin:{}@db.internal:3306/app",
        lambda: f"{_random(ALNUM, 6)}/{_random(ALNUM, 4)}+{_random(ALNUM, 4)}@{_random(ALNUM, 3)}",
    ),
    _labelled(
        "azure-account-key",
        "DefaultEndpointsProtocol=https;AccountName=kaos;AccountKey={};EndpointSuffix=core.windows.net",
        lambda: base64.b64encode(RNG.randbytes(64)).decode(),
    ),
    _labelled("passphrase", "passphrase: {}", lambda: _random(ALNUM, 24)),
    _labelled(
        "access-token-json", '{{"access_token": "{}", "token_type": "bearer"}}', lambda: _random(ALNUM, 32)
    ),
    _labelled(
        "s3-presigned-url",
        "https://bucket.s3.amazonaws.com/report.pdf?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Expires=900"
        "&X-Amz-SignedHeaders=host&X-Amz-Signature={}",
        lambda: _random(HEX, 64),
    ),
    _labelled(
        "azure-sas-url",
        "https://kaos.blob.core.windows.net/c/b.txt?sv=2022-11-02&sp=r&se=2026-12-02T00:00:00Z&sig={}",
        lambda: quote(base64.b64encode(RNG.randbytes(32)).decode(), safe=""),
    ),
    _labelled(
        "slack-webhook",
        "https://hooks.slack.com/services/{}",
        lambda: f"T{_random(UPPER, 10)}/B{_random(UPPER, 10)}/{_random(ALNUM, 24)}",
    ),
    _labelled(
        "telegram-bot",
        "https://api.telegram.org/bot{}/sendMessage",
        lambda: f"{RNG.randrange(10**8, 10**10)}:AA{_random(ALNUM + '_-', 33)}",
    ),
    _plain("sendgrid", lambda: f"SG.{_random(ALNUM, 22)}.{_random(ALNUM + '_-', 43)}"),
    _labelled("azure-subscription-key", "Ocp-Apim-Subscription-Key: {}", lambda: _random(HEX, 32)),
    _labelled("command-line-password", "deploy --password {} --yes", lambda: _random(ALNUM, 20)),
    _labelled("netrc", "machine api.example.com login deploy password {}", lambda: _random(ALNUM, 20)),
    _odbc,
    _labelled("password-in-prose", 'Set it with password: "{}".', lambda: _random(ALNUM, 16)),
    _plain("google-oauth-client-secret", lambda: "GOCSPX-" + _random(ALNUM + "_-", 28)),
    _plain("vault", lambda: "hvs." + _random(ALNUM + "_-", 90)),
    _plain("pypi", lambda: "pypi-AgEIcHlwaS5vcmc" + _random(ALNUM + "_-", 60)),
    _plain("shopify", lambda: "shpat_" + _random(HEX, 32)),
    _plain("langsmith", lambda: f"lsv2_pt_{_random(HEX, 32)}_{_random(HEX, 10)}"),
    _plain("tavily", lambda: "tvly-" + _random(ALNUM, 32)),
    _plain("perplexity", lambda: "pplx-" + _random(ALNUM, 48)),
    _plain("replicate", lambda: "r8_" + _random(ALNUM, 37)),
    _plain("databricks", lambda: "dapi" + _random(HEX, 32)),
    _plain("twilio", lambda: "SK" + _random(HEX, 32)),
    _plain("age", lambda: "AGE-SECRET-KEY-1" + _random(UPPER, 58)),
    _labelled(
        "discord-webhook",
        "https://discord.com/api/webhooks/{}",
        lambda: f"{RNG.randrange(10**17, 10**18)}/{_random(ALNUM + '_-', 68)}",
    ),
    _labelled(
        "teams-webhook",
        "https://contoso.webhook.office.com/webhookb2/{}",
        lambda: (
            f"{uuid.UUID(int=RNG.getrandbits(128))}@{uuid.UUID(int=RNG.getrandbits(128))}"
            f"/IncomingWebhook/{_random(HEX, 32)}/{uuid.UUID(int=RNG.getrandbits(128))}"
        ),
    ),
    _labelled("honeycomb-header", "x-honeycomb-team: {}", lambda: _random(ALNUM, 32)),
    _labelled("signoz-ingestion-key", "signoz-ingestion-key: {}", lambda: _random(ALNUM, 36)),
    _labelled("authorization-pair", "('Authorization', 'Token {}')", lambda: _random(ALNUM, 40)),
    _labelled("xml-password", "<config><password>{}</password></config>", lambda: _random(ALNUM, 16)),
    _labelled(
        "kubernetes-env-json",
        '{{"env": [{{"name": "DB_PASSWORD", "value": "{}"}}]}}',
        lambda: _random(ALNUM, 20),
    ),
    _labelled(
        "secret-named-pair-json", '[["PORT", "5432"], ["DB_PASSWORD", "{}"]]', lambda: _random(ALNUM, 20)
    ),
    _labelled("secret-named-pair-python", "dict_items([('api_key', '{}')])", lambda: _random(ALNUM, 20)),
    _labelled(
        "environment-pair-bytes",
        "[(b'PORT', b'5432'), (b'STRIPE_SECRET_KEY', b'{}')]",
        lambda: _random(ALNUM, 24),
    ),
    _labelled(
        "environment-pair-lines",
        '[\n  [\n    "SECRET_KEY_BASE",\n    "{}"\n  ]\n]',
        lambda: _random(ALNUM, 24),
    ),
    _labelled("kubernetes-env-yaml", "env:\n  - name: API_TOKEN\n    value: {}", lambda: _random(ALNUM, 24)),
    # a password key named by its service or user and "pass"
    _labelled("owner-pass-env", "DB_PASS={}", lambda: _random(ALNUM, 16)),
    _labelled("owner-pass-yaml", "smtp.pass: {}", lambda: _random(ALNUM, 16)),
    _labelled("owner-pass-json", '{{"MYSQL_ROOT_PASS": "{}"}}', lambda: _random(ALNUM, 16)),
    _labelled("owner-pass-camel", "ldapBindPass={}", lambda: _random(ALNUM, 16)),
    _labelled("owner-pass-xml", "<APP__DB__PASS>{}</APP__DB__PASS>", lambda: _random(ALNUM, 16)),
    _labelled(
        "owner-pass-kubernetes-json",
        '{{"env": [{{"name": "REDIS_PASS", "value": "{}"}}]}}',
        lambda: _random(ALNUM, 16),
    ),
    _labelled("owner-pass-kubernetes-yaml", "- name: SMTP_PASS\n  value: {}", lambda: _random(ALNUM, 16)),
    # Slack's refresh, client and cookie tokens; other providers' tokens by their prefix
    _plain("slack-refresh", lambda: f"xoxe-1-{_random(ALNUM, 140)}"),
    _plain("slack-client", lambda: f"xoxc-{RNG.randrange(10**11, 10**12)}-{_random(HEX, 64)}"),
    _plain("slack-cookie", lambda: f"xoxd-{_random(ALNUM, 20)}%2B{_random(ALNUM, 40)}%3D"),
    _plain("grafana-cloud", lambda: "glc_" + base64.b64encode(_random(ALNUM, 90).encode()).decode()),
    _plain("grafana-service-account", lambda: f"glsa_{_random(ALNUM, 32)}_{_random(HEX, 8)}"),
    _plain("new-relic", lambda: "NRAK-" + _random(UPPER, 27)),
    _plain("sentry", lambda: "sntrys_" + _random(ALNUM, 80)),
    _plain("docker-hub", lambda: "dckr_pat_" + _random(ALNUM + "_-", 27)),
    _plain("gitlab-trigger", lambda: "glptt-" + _random(HEX, 40)),
    _plain("digitalocean", lambda: "dop_v1_" + _random(HEX, 64)),
    _plain("supabase", lambda: "sbp_" + _random(HEX, 40)),
    _plain("pinecone", lambda: "pcsk_" + _random(ALNUM + "_", 60)),
    _plain("linear", lambda: "lin_api_" + _random(ALNUM, 40)),
    _plain("notion", lambda: "ntn_" + _random(ALNUM, 46)),
    # base64 "user:password" under an "auth" key
    _labelled(
        "docker-config-auth",
        '{{"auths": {{"ghcr.io": {{"auth": "{}"}}}}}}',
        lambda: base64.b64encode(f"kaos:ghp_{_random(ALNUM, 36)}".encode()).decode(),
    ),
    _labelled(
        "npmrc-auth",
        "//registry.npmjs.org/:_auth={}",
        lambda: base64.b64encode(f"kaos:{_random(ALNUM, 20)}".encode()).decode(),
    ),
    # a password in a command's own short form
    _labelled("curl-user", "curl -sS -u deploy:{} https://api.example.com/v1", lambda: _random(ALNUM, 16)),
    _labelled("mysql-password", "mysql -h db -u root -p{} app", lambda: _random(ALNUM, 16)),
    _labelled("sshpass", "sshpass -p {} ssh deploy@host", lambda: _random(ALNUM, 16)),
    _labelled(
        "gcs-signed-url",
        "https://storage.googleapis.com/b/o?X-Goog-Algorithm=GOOG4-RSA-SHA256&X-Goog-Signature={}",
        lambda: _random(HEX, 128),
    ),
)

PLACEMENTS: tuple[Callable[[str], str], ...] = (
    lambda s: s,
    lambda s: f"My key is:\n{s}",
    lambda s: f"key\t{s}",
    lambda s: f'use "{s}" here',
    lambda s: f"use '{s}' here",
    lambda s: json.dumps({"value": s, "note": "line\nbreak"}),
    lambda s: json.dumps(f"escaped:\n{s}\ttail"),
    lambda s: json.dumps([{"role": "user", "content": json.dumps({"cfg": f"\n{s}"})}]),
    lambda s: "https://example.com/cb?state=" + quote(f"x {s} y", safe=""),
    lambda s: "q=" + quote_plus(f"line one\n{s}"),
    lambda s: f"<pre>{s}</pre>",
    lambda s: f"\u201c{s}\u201d",
    lambda s: f"a,{s},b",
    lambda s: "literal \\n" + s + "\\t",
    lambda s: f"Headers:\r\n{s}\r\n",
    lambda s: f"({s})",
)


@dataclass(frozen=True)
class Placement:
    secret: Secret
    text: str
    context: str
    """A benign marker next to the secret: content that must arrive when capture is on."""


def _corpus() -> list[Placement]:
    corpus = []
    for make in SECRETS:
        for place in PLACEMENTS:
            secret = make()
            context = f"ctx{uuid.uuid4().hex[:12]}"
            corpus.append(Placement(secret, f"{context} {place(secret.text)}", context))
    return corpus


CORPUS = _corpus()


def _encodings(value: str) -> set[bytes]:
    """``value`` as it could appear on the wire: plain, JSON-escaped (once, twice), URL-encoded."""
    once = json.dumps(value)[1:-1]
    forms = {value, once, json.dumps(once)[1:-1], quote(value, safe=""), quote_plus(value), quote(value)}
    return {form.encode() for form in forms}


def leaks(payload: bytes, placement: Placement) -> list[str]:
    found = []
    for value in placement.secret.values:
        middle = value[len(value) // 2 - 6 : len(value) // 2 + 6]
        if any(form in payload for form in _encodings(middle)):
            found.append(f"{placement.secret.kind}: {placement.text!r}")
    return found


def send(otel: KaosOtelManager, placement: Placement) -> None:
    log = logging.getLogger(LOGGER)
    text = placement.text
    with otel.invoke_agent("assistant", attributes={"app.note": text}) as run:
        run.span.add_event("note", {"text": text})
        with otel.model_call("assistant", "gpt-4o-mini") as model:
            model.record_messages(
                [{"role": "user", "content": text}], [{"role": "assistant", "content": text}]
            )
        with otel.tool_call("assistant", "lookup", arguments={"query": text}):
            log.warning("looked up %s", text)
        try:
            with otel.tool_call("assistant", "failing"):
                raise ValueError(text)
        except ValueError:
            log.exception("tool failed: %s", text)


def test_corpus_is_large_and_every_secret_is_masked_by_the_redactor() -> None:
    assert len(CORPUS) >= 300
    assert len({p.secret.kind for p in CORPUS}) == len(SECRETS)
    unmasked = [p.text for p in CORPUS if leaks(default_redactor(p.text).encode(), p)]
    assert unmasked == []


@pytest.mark.parametrize("capture", list(ContentCapture))
def test_no_secret_of_the_corpus_reaches_the_receiver(
    make_otel: MakeOtel, otlp_receiver: OtlpReceiver, capture: ContentCapture
) -> None:
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    otel = make_otel(
        environ={
            "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": capture.value,
            "OTEL_BSP_MAX_QUEUE_SIZE": "8192",  # the corpus is sent faster than exported
            "OTEL_BLRP_MAX_QUEUE_SIZE": "8192",
        }
    )
    for placement in CORPUS:
        send(otel, placement)
    spans, logs = 4 * len(CORPUS), 2 * len(CORPUS)
    assert otel.force_flush(30)
    assert otlp_receiver.wait_for(lambda r: len(r.spans()) >= spans and len(r.logs()) >= logs, 60)

    payload = b"".join(request.SerializeToString() for request in otlp_receiver.raw_requests())
    found = [leak for placement in CORPUS for leak in leaks(payload, placement)]
    assert found == [], f"{len(found)} of {len(CORPUS)} placements leaked: {found[:5]}"
    # the texts did reach the receiver (the test can fail): every context marker is there
    assert all(p.context.encode() in payload for p in CORPUS)
    assert REDACTED.encode() in payload


BENIGN: tuple[Callable[[], str], ...] = (
    lambda: str(uuid.uuid4()),
    lambda: uuid.uuid4().hex,
    lambda: _random("0123456789abcdef", 40),  # a git commit id / SHA-1
    lambda: _random("0123456789abcdef", 64),  # SHA-256
    lambda: base64.b64encode(RNG.randbytes(RNG.randrange(12, 90))).decode(),
    lambda: base64.urlsafe_b64encode(RNG.randbytes(RNG.randrange(12, 90))).decode(),
    lambda: f"def {_random(string.ascii_lowercase, 8)}(x: int) -> int:\n    return x * {RNG.randrange(99)}\n",
    lambda: (
        f"for task in tasks:\n    task-manager --disk-usage {RNG.randrange(9)}"
        f" --max_tokens={RNG.randrange(4096)}"
    ),
    lambda: json.dumps({"model": "gpt-4o-mini", "max_tokens": RNG.randrange(4096), "input_tokens": 12}),
    lambda: json.dumps({"usageMetadata": {"promptTokenCount": RNG.randrange(900), "totalTokenCount": 9}}),
    lambda: f"usage: prompt_token_count={RNG.randrange(900)} candidates_token_count={RNG.randrange(90)}",
    lambda: f"https://example.com/docs/{_random(string.ascii_lowercase, 10)}?page={RNG.randrange(50)}#top",
    lambda: f"/var/lib/kaos/{uuid.uuid4().hex}/memory.db",
    lambda: (
        f"2026-11-30T18:{RNG.randrange(60):02d}:00Z"
        f" v{RNG.randrange(9)}.{RNG.randrange(99)}.{RNG.randrange(99)}"
    ),
    lambda: f"The primary key of the table is id; ask the {_random(string.ascii_lowercase, 6)} team.",
    lambda: f"SELECT id, content FROM turns WHERE session_id = '{uuid.uuid4()}' LIMIT {RNG.randrange(50)}",
    lambda: (
        f"The token budget is {RNG.randrange(9000)} tokens;"
        f" risk-assessment-for-quarterly-review-{RNG.randrange(99)}"
    ),
    # ordinary agent text that names tokens, keys or "basic"
    lambda: f"Here is a basic example of step {RNG.randrange(9)}.",
    lambda: json.dumps({"token_usage": {"input": RNG.randrange(900), "output": 3}}),
    lambda: json.dumps({"token_ids": [101, RNG.randrange(30000), 102], "tokenizer": "cl100k_base"}),
    lambda: json.dumps({"token_type": "bearer", "expires_in": RNG.randrange(3600)}),
    lambda: f"if token == 'EOF':\n    break  # line {RNG.randrange(99)}",
    lambda: f"https://localhost:{RNG.randrange(1024, 65535)}/users/@{_random(string.ascii_lowercase, 6)}",
    # a tool's schema, a call's arguments: two names side by side are not a pair
    lambda: json.dumps({"type": "object", "required": ["password", f"user_{RNG.randrange(99)}"]}),
    lambda: f'os.environ.get("API_KEY", "default-{RNG.randrange(99)}")',
    lambda: f'text.replace("token", "[UNK{RNG.randrange(99)}]")',
    # "pass" that names no one's password: a stage, nginx's directive
    lambda: f"LINT_PASS=clean; FIRST_PASS=done in {RNG.randrange(99)} s",
    lambda: f"location / {{ proxy_pass http://backend:{RNG.randrange(1024, 65535)}; }}",
)


def test_false_positive_rate_on_benign_text_is_measured_and_low() -> None:
    corpus = [make() for make in BENIGN for _ in range(100)]
    altered = [text for text in corpus if default_redactor(text) != text]
    rate = len(altered) / len(corpus)
    print(f"benign corpus: {len(corpus)} texts, {len(altered)} altered, false-positive rate {rate:.2%}")
    assert rate <= 0.01, altered[:10]


@pytest.mark.parametrize(
    "text",
    [
        "SECRET_KEY_BASE=4f9a8b7c6d5e",
        "db_password_new=hunter2x",
        '{"apiKeyValue": "abc123xyz"}',
        "client_secret=abc123xyz",
        "Password2: hunter2x",
        "passwords: wifi: hunter2x",
        "PASSWORD_RESET_TOKEN=hunter2x",  # a suffix about a secret that ends in another one
        "SECRETS_MANAGER_API_KEY=hunter2x",
        "DB_PASSWORD_ADMIN=hunter2x",  # "admin" holds "min", not the word
        "API_KEY_ANDROID=hunter2x",
        "secretkey=hunter2x",
        "password_hash=hunter2x",
        "SECRET_KEY_FOR_THE_PRODUCTION_DATABASE_CLUSTER_EU_WEST=hunter2x",
        "PASSWORD_RESET_TOKEN_V2=hunter2x",  # a secret's name after the word about one
        "SECRET_NAME_PASSWORD_1=hunter2x",
        "passwordadmin=hunter2x",
        "password:\xa0hunter2x",  # a no-break space, as text pasted from a web page has
        '{"password_policy": "password=hunter2x"}',  # inside the value of a key about a secret
        "jwt_eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJodW50ZXIyeCJ9.abc123",
        "my_refresh_jwt_eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJodW50ZXIyeCJ9.abc123",
        "--eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJodW50ZXIyeCJ9.abc123",
        # found by a security review and a Mem0 user: names with a space, a secret said in words,
        # punctuation inside a value, colour codes, query parameters, a bare bot token
        "API key: 4f9a8b7c6d5e",
        "secret key = 4f9a8b7c6d5e",
        '{"api key": "4f9a8b7c6d5e"}',
        "User's API key is 4f9a8b7c6d5e",
        "my password is hunter2x&3",
        "wifi password: hunter2x&3",
        "password=hunter2x;DROP",
        "SMTP_PASSWORD=hunter2x,9#",
        "\x1b[36mpassword\x1b[0m=\x1b[35mhunter2x\x1b[0m",
        "\x1b[38;5;186msk-proj-abc123DEF456ghi789JKL012\x1b[0m",
        "postgresql://app:hunter2x#9@db.internal:5432/app",
        "https://api.example.com/weather?q=London&appid=4f9a8b7c6d5e",
        "https://example.firebaseio.com/a.json?auth=abc123xyz987",
        "https://example.com/telegram/1234567890:AAabc123DEF456ghi789JKL012mno345pqr",
        "http://localhost:8081/bot1234567890:AAabc123DEF456ghi789JKL012mno345pqr/getMe",
        "\x1b[34mAWS_SECRET_ACCESS_KEY\x1b[0m=\x1b[33mabc123+hunter2x/EXAMPLE\x1b[0m",
        # a review of the first version: words after a secret's name that do not make it about one
        "PASSWORD_RESET_KEY=4f9a8b7c6d5e",
        "password_reset_code=hunter2x",
        "SECRET_CHECK_KEY=abc123xyz",
        "api_key_invalid=hunter2x",
        "/login?password_attempts=3&2fa_token=4f9a8b7c6d5e",  # after a key about a secret
        "%1B%5B36mpassword%1B%5B0m=hunter2x9",  # colour codes, URL-encoded
        "https://legacy.example.com/api?user=u&pass=hunter2x%40",
        # left by the last review, masked since: a key ending in PASS, secrets said in other
        # words, a YAML block, a quoted cookie value
        "DB_PASS=hunter2x",
        "smtp.pass = 'hunter2x'",
        "my token is abc123xyz987",
        "the user\u2019s token is abc123xyz987",
        "the password for the db is hunter2x&3",
        "API key for OpenAI was abc123xyz987",
        "password: |\n  hunter2x\n  hunter2x again\nuser: app",
        "  - api_key: >-\n      abc123xyz987\n    region: eu",
        'Cookie: sid="2|1:0|10:1700000000|3:sid|16:abc123xyz987";',
        # a review of those: shapes they missed, and what they took for an algorithm or a stage
        "LANGFUSE_SECRET=sk-lf-4f9a8b41-5b3e-4f8a-9d61-0e2b7c4a8f13",
        "my password is Hunter2024",
        "the password is aes256-hunter2",
        json.dumps({"path": "s.yaml", "content": "password: |\n  hunter2x9\n"}),
        json.dumps("- token: >-\n    abc123xyz987\n"),
        "password: |\n\n  hunter2x\n",
        "password: |  # rotated monthly\n  hunter2x\n",
        "password: &pw |\n  hunter2x\n",
        "DB_PASS=Password123hunter2",
        "DB_PASS: hunter2x",
        '{"DB_PASS": "hunter2x"}',
        "rootpass=hunter2x",
        "the password for my mail account is hunter2x9",
        "the password of user admin is: hunter2x9",
        "my GitHub token is abc123xyz987",
        "his token is abc123xyz987",
        # a second review: a match rejected by the words before it hid one inside it; a value
        # starting like a block indicator with a comment
        "We rotate the token for CI. My token is abc123xyz987",
        "password=>#hunter2x&3",
        # left by the last stop: a "pass" key of a service's as a YAML block, an XML element, a pair
        "DB_PASS: |\n  hunter2x\n",
        "<DB_PASS>hunter2x</DB_PASS>",
        "<ns:mysql_root_pass>hunter2x</ns:mysql_root_pass>",
        '[["PORT", "5432"], ["SMTP_PASS", "hunter2x"]]',
        # a review of those: Kubernetes env entries, camelCase, a double separator
        '{"name": "DB_PASS", "value": "hunter2x"}',
        "- name: DB_PASS\n  value: hunter2x",
        "mysqlRootPass=hunter2x",
        "APP__DB__PASS=hunter2x",
    ],
)
def test_a_secret_under_a_key_with_a_suffix_is_masked(text: str) -> None:
    assert default_redactor(text).count(REDACTED) == 1
    assert not any(part in default_redactor(text) for part in ("4f9a8b", "hunter2", "abc123", "eyJ"))


@pytest.mark.parametrize(
    "value",
    [['DB_PASSWORD="hunter2x"', "PORT=5432"], {"args": 'password="hunter2x"'}, "api_key='hunter2x'"],
)
def test_a_quoted_secret_inside_json_text_is_masked(value: object) -> None:
    """A quoted value ends where its quote does, also when the quote is escaped in JSON text (a
    list of environment lines set as one attribute): the string's own closing quote follows."""
    assert "hunter2" not in default_redactor(json.dumps(value))


def test_a_quoted_cookie_value_is_masked_and_the_next_field_kept() -> None:
    """A cookie's quoted value is part of the header's value; a JSON string holding the header
    still ends at its own quote."""
    header = 'Cookie: sid="2|1:0|16:abc123xyz987"; theme=dark'
    assert default_redactor(header) == f"Cookie: {REDACTED}"
    as_json = json.dumps({"cookie": 'sid="abc123xyz987"', "note": "kept"})
    assert default_redactor(as_json) == '{"cookie": "' + REDACTED + '", "note": "kept"}'


@pytest.mark.parametrize(
    "text",
    [
        "password=hunter2x;api_key = 'Zq9vX81kPm'",
        "password=hunter2x,api_key = Zq9vX81kPm",
        'pwd=hunter2x;$token="Zq9vX81kPm"',
    ],
)
def test_a_value_ends_where_the_next_pair_starts(text: str) -> None:
    """A value running on past punctuation stops at a letter, which may start the next pair: both
    secrets are masked, the second one's key kept."""
    redacted = default_redactor(text)
    assert "hunter2" not in redacted and "Zq9vX81kPm" not in redacted
    assert redacted.count(REDACTED) == 2


@pytest.mark.parametrize(
    "text",
    [
        "password_policy: strict",
        "password_min_length=12",
        "passwordless: true",
        "secretary: Ann",
        "secretName: my-secret",
        "secretKeyRef: db-credentials",
        "api_key_id=key-42",
        "apiKeyHeader: X-Trace",
        "pk-value-of-the-first-column-in-the-table",
        "signature = inspect.signature(fn)",
        '{"type": "object", "required": ["password", "username"]}',
        '{"enum": ["token", "cookie"]}',
        'os.environ.get("API_KEY", "default")',
        'text.replace("token", "[UNK]")',
        "[('password_min_length', '12')]",
        "password_attempts=3",
        "credential_errors=5",
        "token=None",
        "WHERE token = %s",
        "password_hash = $1",
        "the password is incorrect",
        "max tokens is 4096",
        "pass=10 fail=2",
        "bypass=3",
        "https://example.com/search?key=name",
        "meeting at 10:AM, room 12345678:Abc",
        "https://bucket.example.com/get?key=reports/2024/q1.pdf",
        "https://cdn.example.com/app.js?key=v1.2.3-build42",
        "Invalid API key: Unauthorized",
        "Password is 8-64 characters",
        "API key is 32-byte hex",
        "API key: sha256-hashed",
        "Private key: ed25519",
        "the next token is 128000",
        "API key: AES-256-GCM",
        "RESULT: PASS=green FAIL=0",
        "LINT_PASS=clean",
        "<LINT_PASS>clean</LINT_PASS>",
        "LINT_PASS: |\n  clean\n",
        '[["LINT_PASS", "clean"]]',
        '{"name": "LINT_PASS", "value": "clean"}',
        "proxy_pass: http://app:8000",
        "compilerPass=inline",
        "opt -pass=mem2reg",
        "compiler_pass = InlinePass(config)",
        "the model's token is 128009",
        "git clone https://github-actions-bot-2024@github.com/kaos/agents.git",
        "FIRST_PASS=done",
        "PASS=true",
        "description: |\n  the password is set by the operator\n",
        "ssh://git@github.com/kaos/agents.git",
        "docker run -u 1000:1000 kaos/agent",
        '{"auth": "AuthenticationRequired"}',
        "mysql -u root -p app",
        "curl -sS https://api.example.com && git push -u origin feature:main",
    ],
)
def test_text_about_a_secret_is_left_alone(text: str) -> None:
    """A key whose suffix says its value is about a secret (a policy, an id, a name, a reference),
    a word that only starts like a secret's name, a slug with a key's prefix, code, a schema's
    list of field names, a call's arguments."""
    assert default_redactor(text) == text


@pytest.mark.parametrize(
    "unit",
    [
        "pwd.",
        "secret_",
        "api-key-",
        "credential-",
        "eyJ_",
        "jwt_eyJ",
        "://:",
        "sig=",
        "secret_name=",
        "x_api_key_id=",
        "[('password', '",
        '[["api_key", 1',
        ",[ 'token', 'x",
        "password=a,",
        "password=a&",
        "password is 1",
        "?key=1",
        "\x1b[1m",
        "1234567890:A",
        "://a:b?",
        "my token is 1",
        "password for x is ",
        "DB_PASS=a",
        "password: |\n ",
        "eyJaaaaaaaa.",
        "://a1a1a1a1a1a1a1a1a1a1",
        'Cookie: a="',
        "'password: |\n",
        "his a token is a1 ",
        "db_pass: ",
        "the password for a b c d is ",
        "password: |#",
        "|#",
        "<db_pass>a",
        '"name": "dbUser',
        "name: aDb__",
        "curl -u ",
        "curl ",
        '"auth": "a',
        "_auth=",
        "mysql -p",
    ],
)
def test_scanning_hostile_text_costs_time_in_proportion_to_its_length(unit: str) -> None:
    """A text repeating the start of a pattern (a model's output can be anything) is scanned in
    time that grows with its length, not its square: 4 times the text costs about 4 times the
    time (a rescan from every repetition costs 16 times). Best of five, so a busy machine does
    not decide."""

    def best_time(size: int) -> float:
        return _best_scan_time(unit * (size // len(unit)))

    assert best_time(32_768) < 8 * best_time(8_192)


@pytest.mark.parametrize("head", ["password=|", "token\n|", "DB_PASS: >", "password: |"])
def test_a_long_run_of_spaces_after_a_block_indicator_costs_time_in_proportion(head: str) -> None:
    """A YAML block indicator followed by a long run of spaces (a padded table cell, a model's
    output): the run is read one way only, not split in every way (which cost its square)."""

    def best_time(size: int) -> float:
        return _best_scan_time(head + " " * size + "x")

    assert best_time(32_768) < 8 * best_time(8_192)


def _best_scan_time(text: str) -> float:
    """The best of five times to scan ``text``: a busy machine does not decide."""
    times = []
    for _ in range(5):
        started = time.perf_counter()
        default_redactor(text)
        times.append(time.perf_counter() - started)
    return min(times)
