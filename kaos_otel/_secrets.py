"""What counts as a secret, and masking it in every encoding a string reaches the exporter in.

A secret is masked whether it sits in plain text, in a JSON string (``\\n``, ``\\t``, ``\\"``,
``\\u0022`` around it, possibly JSON inside JSON) or URL-encoded (``%20``, ``+``): the patterns
run on the text and on its decoded views, and every match is masked in the original text.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence

REDACTED = "[REDACTED]"

Redactor = Callable[[str], str]
"""Takes one exported string, returns it with secrets masked."""

_START = r"(?<![A-Za-z0-9])"
"""A token starts here: not in the middle of a word (decoding turns ``\\n`` into a newline first)."""

# Each pattern below that starts with an assertion or an alternation first looks ahead for one of
# its first characters, (?=[...]): the regex engine then rejects most positions with one character
# test instead of trying every branch (on an agent's message text, about 1.8x faster overall).

# fmt: off
_ABOUT_A_SECRET = frozenset({
    "policy", "policies", "length", "len", "min", "max", "url", "uri", "link", "expiry",
    "expires", "expired", "expiration", "rotation", "rotated", "age", "changed", "updated",
    "created", "name", "names", "arn", "id", "ids", "count", "header", "type", "provider", "path",
    "file", "dir", "algorithm", "algo", "strength", "rule", "rules", "hint", "manager", "required",
    "enabled", "field", "format", "label", "prompt", "set", "store", "vault", "ref", "source",
    "mode", "version", "versions", "scheme", "schema", "attempts", "failures", "errors",
    "retries", "rotations", "counts", "total",
})
# fmt: on
"""Words of a secret-naming key's suffix that say its value is about a secret, not the secret:
``password_policy``, ``api_key_id``, ``secretKeyRef``."""

_VALUE_WORDS = frozenset({"value", "str", "string", "text", "raw", "plain", "b64", "base64", "hex"})
"""A suffix's last word that says the value is the secret after all (``api_key_header_value``)."""

_SUFFIX_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|[0-9]+")
"""The words of a key's suffix: split at separators and camelCase (``KeyRef``: ``Key``, ``Ref``)."""


_SECRET_NAMES = (
    r"password|passwd|passphrase|pwd|secret|api[_-]?key|apikey|private[_-]?key|access[_-]?key|"
    r"account[_-]?key|credential"
)
"""The names a key holds when its value is a secret (and ``token``, which key=value pairs read
apart: ``max_tokens`` is no secret), as regex alternatives for the patterns below."""

_SECRET_IN_NAME = rf"(?i:{_SECRET_NAMES}|token)"
"""A secret's name inside a key's, an entry's or an element's name (``DB_PASSWORD``,
``api-token``), as a regex."""

_PASS_OWNERS = (
    r"(?:(?<![A-Za-z0-9])|(?-i:(?<=[a-z0-9])(?=[A-Z])))"
    r"(?:db|database|mysql|mariadb|pg|postgres|postgresql|redis|smtp|imap|mail|email|ftp|sftp|ssh"
    r"|ldap|admin|root|user|login|app|amqp|rabbitmq|mongo|mongodb|wifi|vnc|bind|master)[_.-]{0,2}"
)
"""Whose password a name ending in "pass" names: a service or a user, as the word before it, also
in camelCase or after a double separator (``mysqlRootPass``, ``APP__DB__PASS``); not nginx's
``proxy_pass`` (a URL). A pattern for a case-insensitive regex."""

_OWNER_PASS_NAME = r"(?i:" + _PASS_OWNERS + r"pass)"
"""A name ending in a service's or a user's "pass" (``DB_PASS``, ``smtp.pass``, ``rootpass``), as a
regex: a bare ``pass`` is as often a count or a stage (``PASS=12``, ``LINT_PASS=clean``)."""

_OWNER_PASS = re.compile(_OWNER_PASS_NAME + r"\Z")
"""A name that ends as :data:`_OWNER_PASS_NAME` says."""

_SECRET_WORD = re.compile(_SECRET_IN_NAME)
"""A secret's name anywhere in a key."""


def _about_a_secret(suffix: str) -> bool:
    """Whether a key's ``suffix`` (what follows a secret's name in it) says its value is about the
    secret, not the secret: a word of :data:`_ABOUT_A_SECRET` with no secret's name after it
    (``PASSWORD_RESET_TOKEN_V2`` is a token) and not ending in a value word."""
    about_end = -1
    last = ""
    for word in _SUFFIX_WORD.finditer(suffix):
        last = word.group().lower()
        if last in _ABOUT_A_SECRET:
            about_end = word.end()
    return about_end >= 0 and last not in _VALUE_WORDS and not _SECRET_WORD.search(suffix, about_end)


_JWT = re.compile(
    r"(?=[A-Za-z0-9_-])(?<![A-Za-z0-9_-])(?:[A-Za-z0-9_-]{0,63}[_-])?"
    r"(?P<value>eyJ[A-Za-z0-9_-]{8,}\.(?:eyJ[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*)?"
    r"|[A-Za-z0-9_-]*\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}))"
)
"""Bare JWTs (header.payload[.signature], both base64url JSON objects) and JWEs (header, then
four parts: the encrypted key, which may be empty, the IV, the ciphertext and the tag: a session
cookie of NextAuth), also after words and a
separator (``my_jwt_eyJ...``, ``Bearer-eyJ...``, within 64 characters). A scan starts only where
a run of token characters starts: from each "eyJ" of "eyJ_eyJ_..." it would rerun to the run's
end."""

_COMMAND_PASSWORD = re.compile(
    r"(?:\bcurl\b[^\r\n]{0,256}?[ \t](?:-u|--user|--proxy-user|-U)[ \t]*[\"']?[^\s:\"']{0,256}:"
    r"|\bmysql(?:dump|admin|import|show|check)?\b[^\r\n]{0,256}?[ \t]-p"
    r"|\bsshpass[ \t]+-p[ \t]*)"
    r"(?P<value>[^\s\"'-][^\s\"']*)"
)
"""A password on a command line, in its programs' own short forms: ``curl -u user:password``
(``--user``, ``-U`` for a proxy's), ``mysql -ppassword`` (written against the flag),
``sshpass -p password``. Not ``docker run -u 1000:1000`` (a user and a group)."""

_TELEGRAM_BOT_TOKEN = re.compile(
    r"(?=[0-9])(?:(?<=bot)|(?<![A-Za-z0-9:]))[0-9]{8,10}:A[A-Za-z0-9_-]{34}(?![A-Za-z0-9_-])"
)
"""Telegram bot tokens on their own (a webhook path of the app's own, ``/bot<token>/`` of a local
Bot API server): the bot's id, a colon and 35 characters starting with "A"."""

SECRET_KEY_NAME = re.compile(
    r"(?i)(?:password|passwd|passphrase|secret|token|api[_-]?key|apikey|private[_-]?key|"
    r"access[_-]?key|account[_-]?key|authorization|credentials?|cookie|subscription[_-]?key|"
    r"ingestion[_-]?key|honeycomb[_-]?team)$"
)
"""Attribute keys and header names whose whole value is a secret: the key ends in such a name
(``db.password``, ``auth_token``, ``accessKey``; not ``gen_ai.token.type``, ``max_tokens``,
``password_min_length``)."""

_SECRET_KEY_IN_TEXT = (
    r"(?:(?:" + _SECRET_NAMES + r")s?"
    r"(?P<suffix>(?:(?-i:[_.0-9A-Z-])|(?=key|value|new|old|current|confirm|hash|salt|str|text|raw|enc"
    r"|v[0-9]|prod|admin|access|digest|data|b64|base64|hex))[\w.-]{0,64})?"
    r"|token(?:[_.-]?(?:value|v\d+|str|string|secret))?)"
)
"""A key naming a secret as text writes it, key=value or as a pair's name (a pattern for a
case-insensitive regex; ``suffix``: what follows the secret's name, see :func:`_about_a_secret`)."""

_NAME_OF_A_SECRET = re.compile(r"(?i)" + _SECRET_KEY_IN_TEXT + r"\Z")
"""A name that ends in a secret's name (:func:`names_a_secret`)."""


def names_a_secret(name: str) -> bool:
    """Whether ``name`` (a pair's first item) names a secret, as the key of a key=value pair would:
    ``DB_PASSWORD``, ``SECRET_KEY_BASE``, ``x-api-key``; not ``password_min_length``, ``max_tokens``."""
    if SECRET_KEY_NAME.search(name) or _OWNER_PASS.search(name):  # HTTP_COOKIE (a WSGI environ's items)
        return True
    match = _NAME_OF_A_SECRET.search(name)
    if match is None:
        return False
    suffix = match.group("suffix")
    return not (suffix and _about_a_secret(suffix))


_KEY_LAST_NAMES = re.compile(r"([A-Za-z0-9_.-]{1,64})\]?\Z")
"""A key's last names: after its last ``/``, ``:``, space or ``[`` (``user[password]``), up to 64
characters."""

_SECRET_KEY_ENDING = re.compile(
    r"(?i)(?:(?:" + _SECRET_NAMES + r")s?|token)"
    # each word atomic, the longer spelling first: a run of digits or letters is read one way only
    r"(?:[_.-]?(?>key|base64|base|value|v?[0-9]+|string|str|b64|hex|pem|der|new|old|current|prod"
    r"|live|admin|encoded|enc|data|raw|text|contents?|hash|digest|salt|confirmation|confirm))*\Z"
)
"""A name ending in a secret's name, plural (not ``tokens``), or followed only by words that still
name the value (``SECRET_KEY_BASE``, ``client_secret_v2``, ``db.password.value``,
``password_confirmation``)."""

_SHELL_DIRECTORIES = frozenset({"PWD", "OLDPWD"})


def key_names_a_secret(key: str) -> bool:
    """Whether an attribute's or a mapping's ``key`` names a secret: it ends in a secret's name,
    plural or followed only by words that still name the value (``MYSQL_PWD``,
    ``config/SECRET_KEY_BASE``, ``auth_token``, ``client_secret_v2``, ``db.password.value``); not a
    count, a date or a place said about one (``password_attempts``, ``secrets_detected``,
    ``api_key_env_var``, ``private_key_path``, ``k8s.secret.uid``), nor the shell's ``PWD``; or it
    ends in a service's or a user's "pass" (``DB_PASS``, ``smtp.pass``)."""
    last = _KEY_LAST_NAMES.search(key)
    if last is None or last.group(1).rpartition(".")[2] in _SHELL_DIRECTORIES:
        return False
    name = last.group(1)
    return _SECRET_KEY_ENDING.search(name) is not None or _OWNER_PASS.search(name) is not None


_SECRET_FLAG = re.compile(
    r"(?i)(?:--pass\Z|--?(?!(?:no|ask|show|prompt|print)[_-])(?:[a-z0-9]+[_-]){0,8}[a-z0-9]*?"
    r"(?:password|passwd|passphrase|pwd|token|secret|secret[_-]?key|api[_-]?key|apikey|access[_-]?key"
    r"|credentials?)\Z)"
)
"""A command-line flag whose value may be the next argument and a secret (``--password``,
``--api-key``, ``--clientSecret``, ``--pass``; not ``--max-tokens``, ``--password-file``,
``--no-password``, ``--ask-pass``)."""


def secret_arguments(arguments: Sequence[str]) -> Iterator[int]:
    """The indexes of the arguments of a command line that follow a flag naming a secret, unless
    they are flags themselves: ``process.command_args`` of ``("docker", "login", "--password",
    "x")`` holds one, at 3."""
    for index, argument in enumerate(arguments[:-1]):
        following = arguments[index + 1]
        if (
            argument[:1] == "-"
            and following[:1] != "-"
            and len(argument) <= 64
            and _SECRET_FLAG.match(argument)
        ):
            yield index + 1


_SAID_FOR = r"(?:[^\S\r\n]+(?:for|of|to)(?:[^\S\r\n]+[\w.@-]{1,32}){1,4}?)?"
"""What a secret said in words is for, between its name and "is": "the password for the db is",
"the password of user admin is" (up to four words)."""

_SAID_VALUE = (
    r"[\"']?(?P<value>(?=[^\s\"'<>]{0,64}[0-9])"
    r"(?![^\s\"'<>]{0,64}-(?:digit|byte|bit|char|character|signed)s?\b)"
    r"(?!(?-i:(?:sha|SHA)(?:1|224|256|384|512)|(?:md|MD)5|(?:ed|Ed)25519|(?:aes|AES)-?(?:128|192|256)"
    r"|(?:rsa|RSA)-?(?:2048|3072|4096)|(?:hmac|HMAC)-(?:sha|SHA)(?:256|512))"
    r"(?:-(?-i:hashed|hash|encrypted|encoded|signed|digest|gcm|GCM|cbc|CBC|bits?))?(?![^\s\"'<>]))"
    r"[^\s\"'<>]{6,})"
)
"""The value of a secret said in words: 6 characters or more holding a digit, not a size ("8-64
characters", "32-byte hex") nor an algorithm's name ("sha256-hashed", "ed25519", "AES-256-GCM")."""

_SAID_IS = r"[^\S\r\n]+(?:is|was):?[^\S\r\n]+"
"""The verb a secret said in words comes after: "is", "was", "is:"."""

_SOMEONES_TOKEN = re.compile(
    r"(?i)token" + _SAID_FOR + _SAID_IS + r"(?=[\"']?[^\s\"'<>]{0,64}[A-Za-z])" + _SAID_VALUE
)
"""A token said in words, someone's (:data:`_SOMEONES`: "my token is ...", "my GitHub token is
...", "the user's token is ..."): a bare "token" may be a model's ("the next token is 128000"),
and so may a possessive one with a number ("the model's token is 128009"): the value holds a
letter."""

_SOMEONES = re.compile(
    r"(?i)(?:\b(?:my|our|your|their|his|her)|\w['\u2019]s)(?:[^\S\r\n]+[\w.-]{1,32}){0,2}?[^\S\r\n]+\Z"
)
"""What precedes a token said to be someone's: a possessive, and up to two words ("my GitHub")."""

_BLOCK_INDICATOR = r"[|>][0-9+-]{0,2}(?:[^\S\r\n]+#[^\r\n]{0,256}|[^\S\r\n]*)"
"""A YAML block scalar's indicator and the rest of its line: spaces, or a comment after a space.
The two branches keep a run of spaces from being split two ways (which costs its square)."""

_LINE_END = r"(?:\r?\n|\\[rn]|$)"
"""A line's end, also JSON-escaped (``\n`` as two characters)."""

_YAML_BLOCK_SECRET = re.compile(
    r"(?m)(?:^[^\S\r\n]*|(?<=[\"']))(?:-[^\S\r\n]+)?[\"']?"
    r"(?P<name>(?=[\w.-]{0,64}?(?i:pass|pwd|secret|key|token|credential))[\w.-]{1,64})[\"']?"
    r"[^\S\r\n]*:(?:[^\S\r\n]+[!&][^\s]{0,64}){0,2}[^\S\r\n]*"
    + _BLOCK_INDICATOR
    + r"(?:\r?\n[^\S\r\n]*){0,8}?\r?\n(?P<indent>[^\S\r\n]+)"
    r"(?P<value>\S[^\r\n]{0,4096}(?:(?:\r?\n[^\S\r\n]*){0,8}?\r?\n(?P=indent)[^\r\n]{1,4096}){0,64})"
)
"""A YAML block scalar under a key naming a secret (as :func:`names_a_secret` reads it):
``password: |`` or ``token: >-`` (a tag, an anchor or a comment after the key too), then its
lines, blank ones included, as far as they keep the first one's indentation; the key at a line's
start, or inside a quoted string (a YAML file written through a tool call's JSON arguments)."""

_PASS_KEY = re.compile(
    r"(?i)pass[\"']?[^\S\r\n]*[:=][^\S\r\n]*(?P<quote>[\"'])?"
    r"(?!(?:none|null|nil|undefined|%s|\$[0-9]+|\?)(?:[\s,;&\"']|$))"
    r"(?!" + _BLOCK_INDICATOR + _LINE_END + r")"
    r"(?P<value>(?(quote)[^\"'\r\n]{1,256}|[^\s,;&\"'=]{1,256}))"
)
"""A key naming a service's or a user's password by "pass" (:data:`_PASS_OWNER` before it:
``DB_PASS=...``, ``SMTP_PASS: ...``, ``"rootpass": "..."``), as text writes it, key=value, YAML
or JSON: a bare ``pass`` is as often a count or a stage (``PASS=12``, ``LINT_PASS=clean``,
``-pass=mem2reg``)."""

_PASS_OWNER = re.compile(r"(?i)" + _PASS_OWNERS + r"\Z")
"""What ends where a "pass" key of :data:`_PASS_KEY` starts."""

_PRECEDED = {_SOMEONES_TOKEN: (_SOMEONES, 80), _PASS_KEY: (_PASS_OWNER, 12)}
"""For a pattern that starts at its literal, what must end where its match starts, and within how
many characters before it: checked on each match, which is cheaper than trying the words before
the literal at every position."""

DEFAULT_SECRET_PATTERNS: tuple[re.Pattern[str], ...] = (
    # PEM private-key blocks and PGP private-key blocks; one cut by a size cap is masked to its end
    re.compile(
        r"-----BEGIN[A-Z ]*PRIVATE KEY(?: BLOCK)?-----(?:.*?-----END[A-Z ]*PRIVATE KEY(?: BLOCK)?-----|.*\Z)",
        re.DOTALL,
    ),
    # Provider keys and tokens by their prefix, one scan for all: OpenAI (sk-, sk-proj-,
    # sk-svcacct-), Anthropic (sk-ant-) and rk-/pk- keys of the same shape, those with a digit (not
    # a slug such as "pk-value-of-the-first-column"); Stripe secret and restricted keys, webhook
    # secrets; Google API keys and OAuth client secrets; GitHub; Slack; Hugging Face, GitLab, Groq,
    # xAI and npm tokens; Google OAuth access tokens; SendGrid, HashiCorp Vault, PyPI, Shopify,
    # LangSmith, Tavily, Perplexity, Replicate, Databricks and Twilio tokens; age keys; Grafana
    # Cloud, New Relic, Sentry, Docker Hub, DigitalOcean, Supabase, Pinecone, Linear and Notion
    # tokens
    re.compile(
        r"(?=[srpwAGgxhnySltdN])"
        + _START
        + r"(?:sk-[A-Za-z0-9_-]{20,}|(?:rk|pk)-(?=[A-Za-z_-]{0,64}[0-9])[A-Za-z0-9_-]{20,}"
        r"|(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{10,}|whsec_[A-Za-z0-9]{16,}"
        r"|AIza[0-9A-Za-z_-]{30,}|GOCSPX-[A-Za-z0-9_-]{20,}"
        r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
        r"|xox[abcdeoprs]-[A-Za-z0-9%-]{10,}|xapp-[A-Za-z0-9-]{10,}"
        r"|hf_[A-Za-z0-9]{30,}|gl(?:pat|ptt|dt|rt|ft|oas|soat|cbt|imt|agent)-[A-Za-z0-9_-]{20,}"
        r"|gsk_[A-Za-z0-9]{40,}"
        r"|xai-[A-Za-z0-9]{40,}|npm_[A-Za-z0-9]{36,}|ya29\.[A-Za-z0-9_-]{20,}"
        r"|SG\.[A-Za-z0-9_-]{16,32}\.[A-Za-z0-9_-]{16,64}|hvs\.[A-Za-z0-9_-]{24,}|pypi-AgE[A-Za-z0-9_-]{50,}"
        r"|shp(?:at|ss|ca|pa)_[a-fA-F0-9]{32}|lsv2_(?:pt|sk)_[A-Za-z0-9_]{30,}|tvly-[A-Za-z0-9_-]{20,}"
        r"|pplx-[A-Za-z0-9]{40,}|r8_[A-Za-z0-9]{30,}|dapi[0-9a-f]{32}|SK[0-9a-f]{32}"
        r"|AGE-SECRET-KEY-1[0-9A-Z]{50,}"
        r"|glc_[A-Za-z0-9+/]{32,}={0,2}|glsa_[A-Za-z0-9]{32}_[A-Fa-f0-9]{8}|NRAK-[A-Z0-9]{27}"
        r"|sntry[su]_[A-Za-z0-9+/=_]{40,}|dckr_pat_[A-Za-z0-9_-]{24,}|do[opr]_v1_[a-f0-9]{64}"
        r"|sbp_[a-f0-9]{40}|pcsk_[A-Za-z0-9_]{40,}|lin_api_[A-Za-z0-9]{40}|ntn_[A-Za-z0-9]{40,})"
    ),
    # a user's password given to curl (-u user:password), to mysql (-ppassword) or to sshpass
    _COMMAND_PASSWORD,
    # webhook URLs whose path is the credential: Slack, Discord, Teams, Telegram
    re.compile(
        r"(?:hooks\.slack\.com/(?:services|workflows|triggers)/|discord(?:app)?\.com/api/webhooks/"
        r"|\.webhook\.office\.com/webhookb2/|api\.telegram\.org/bot)(?P<value>[A-Za-z0-9/_:@.-]{10,})"
    ),
    _TELEGRAM_BOT_TOKEN,
    # signed URLs: S3 (SigV4, SigV2), CloudFront, GCS, Azure SAS; the signature's value, which
    # holds a digit ("signature=inspect.signature(fn)" is code)
    re.compile(
        r"[Ss](?:ignature|IGNATURE|ig|IG)="  # X-Amz-Signature, X-Goog-Signature too
        r"(?P<value>(?=[A-Za-z0-9+/_~.%-]{0,64}[0-9])[A-Za-z0-9+/_~.%-]{16,}={0,2})"
    ),
    # a URL's query parameter named for a credential with no name of a secret in it (?key=,
    # ?appid=, Firebase's ?auth=, ?pass=): a value of 8 characters or more holding a digit and no
    # / . : (not an object key, a path, a version or a cache key: ?key=reports/2024/q1.pdf)
    re.compile(
        r"[?&](?i:key|appid|app_id|auth|pass)="
        r"(?P<value>(?=[^&#\s\"'/.:]{0,64}[0-9])[^&#\s\"'/.:]{8,})(?=[&#\s\"']|$)"
    ),
    # base64 "user:password" under an "auth" key: a Docker config.json's registry credentials
    # ({"auths": {"ghcr.io": {"auth": "..."}}}), an .npmrc's _auth=...; holding a digit or a
    # symbol ("auth": "AuthenticationRequired" is a word)
    re.compile(
        r"(?:\"_?auth\"[^\S\r\n]*:[^\S\r\n]*\"|(?<![\w.-])_auth[^\S\r\n]*=[^\S\r\n]*)"
        r"(?P<value>(?=[A-Za-z0-9+/]{0,256}[0-9+/=])[A-Za-z0-9+/]{16,}={0,2})"
    ),
    # credentials given on a command line or in a .netrc: "--password x", "login u password x"
    re.compile(r"--(?:password|passwd|token|api-key|apikey|secret|client-secret)[ \t]+(?P<value>[^\s-]\S*)"),
    re.compile(r"login[ \t]+\S+\s+password[ \t]+(?P<value>[^\s-]\S*)"),
    # an XML element named for a secret (<password>x</password>, <ns:ApiKey>x</ns:ApiKey>,
    # <DB_PASS>x</DB_PASS>)
    re.compile(
        r"<(?:[\w.-]{1,32}:)?"
        r"(?:[\w-]{0,32}" + _SECRET_IN_NAME + r"s?|[\w-]{0,32}?" + _OWNER_PASS_NAME + r")>"
        r"(?P<value>[^<\s][^<\r\n]{0,255})<"
    ),
    # a name/value pair whose name names a secret: Kubernetes env entries, in JSON and in YAML
    # ({"name": "DB_PASSWORD", "value": "x"}; "- name: DB_PASSWORD" then "value: x")
    re.compile(
        r"\"name\"[^\S\r\n]*:[^\S\r\n]*\""
        r"(?:[\w.-]{0,64}" + _SECRET_IN_NAME + r"[\w.-]{0,64}|[\w.-]{0,64}?" + _OWNER_PASS_NAME + r")"
        r"\"[^\S\r\n]*,"
        r"[^\S\r\n]*\"value\"[^\S\r\n]*:[^\S\r\n]*\"(?P<value>(?:[^\"\\\r\n]|\\.)*)\""
    ),
    re.compile(
        r"name:[^\S\r\n]*[\"']?"
        r"(?:[\w.-]{0,64}" + _SECRET_IN_NAME + r"[\w.-]{0,64}|[\w.-]{0,64}?" + _OWNER_PASS_NAME + r")"
        r"[\"']?[^\S\r\n]*\r?\n"
        r"[^\S\r\n]*value:[^\S\r\n]*[\"']?(?P<value>[^\s\"']+)"
    ),
    # a (name, value) pair whose name names a secret (as a key=value key would: names_a_secret),
    # an item of a list of pairs or a tuple, as JSON or Python write one, on one line or several:
    # [["DB_PASSWORD", "x"]], [('api_key', 'x')], (b'x-api-key', b'x'), ('pin_password', 1234),
    # dict_items([...]). Not a two-item list elsewhere ({"required": ["password", "username"]} is
    # a schema), nor a call's arguments (os.environ.get("API_KEY", "")). A quoted value the text
    # cuts runs to its end.
    re.compile(
        r"(?:[\[,]\s{0,256}\[|(?<![\w)\]])\()\s{0,256}b?[\"']"
        r"(?P<name>(?=[\w.-]{0,64}?(?i:pass|pwd|secret|key|token|credential|auth|cookie|honeycomb))[\w.-]{1,64})"
        r"[\"']\s{0,256},\s{0,256}(?:b(?=[\"']))?(?P<quote>[\"'])?"
        r"(?P<value>(?(quote)(?:(?!(?P=quote))[^\\\r\n]|\\.|\\\Z)+|-?[0-9][0-9_.eE+-]{0,64}))"
        r"(?(quote)(?:(?P=quote)\s{0,256}[\])]|\Z)|\s{0,256}[\])])"
    ),
    # AWS access key ids, with a secret access key that follows within a few separators
    re.compile(
        r"(?=A)" + _START + r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}(?![A-Za-z0-9])"
        r"(?:[^A-Za-z0-9/+]{1,8}[A-Za-z0-9/+]{40}(?![A-Za-z0-9/+=]))?"
    ),
    _JWT,
    # user:password@ in URLs (the whole user info is masked): the password runs to the last @
    # within 256 characters (a bound: the scan stays linear) and may hold / + @ ' (a port followed
    # by a path is not a password)
    # (or to the first @, holding ? and # but no /: a password SQLAlchemy reads unescaped)
    re.compile(
        r"://(?P<value>[^/\s:@?#]*:(?![0-9]+(?:[/?#\s]|$))(?:[^\s?#\"\\]{0,256}|[^\s@/\"\\]{0,256}))(?=@)"
    ),
    # a token as a URL's whole user info (git clone https://<token>@github.com/...): 32 characters
    # or more holding a digit (a user name is shorter: git@, github-actions-bot-2024@)
    re.compile(r"://(?P<value>(?=[A-Za-z0-9_-]{0,256}[0-9])[A-Za-z0-9_-]{32,256})@"),
    # Authorization / Cookie / Set-Cookie / API-key header values: the rest of the header line
    # (also in a (name, value) pair), quoted cookie values (sid="2|1:0|...") included
    re.compile(
        r"(?i)(?=[apcsxoi])(?:\b(?:proxy-)?(?:authorization|set-cookie|cookie|x-api-key|x-honeycomb-team"
        r"|(?:ocp-apim-|signoz-)?(?:subscription|ingestion)-key)"
        r"(?:[\"']?\s*[:=]\s*[\"']?|[\"']\s*,\s*b?[\"']))"
        r"(?P<value>[^\s\"'\\](?:[^\r\n\"'\\]|(?<==)\"[^\"\r\n\\]{0,4096}\")*)"
    ),
    # bearer / basic credentials anywhere (a token with a digit, or a long one); a basic one is
    # base64 ("a basic example." is not a credential)
    re.compile(
        r"(?i)(?=b)(?:\bbearer\s+)"
        r"(?P<value>(?=[A-Za-z0-9._~+/=-]*[0-9._~+/=])[A-Za-z0-9._~+/=-]{8,}|[A-Za-z0-9._~+/=-]{24,})"
    ),
    re.compile(
        r"(?i)(?=b)(?:\bbasic\s+)"
        r"(?P<value>(?=[A-Za-z0-9+/]*[0-9+/=])[A-Za-z0-9+/]{8,}={0,2}|[A-Za-z0-9+/]{24,}={0,2})"
    ),
    # key=value / "key": "value" pairs whose key names a secret:
    # - the name may be plural and carry a suffix of up to 64 characters after a separator, a
    #   capital or a secret word (DB_PASSWORD_NEW, apiKeyValue, SECRET_KEY_BASE, secretkey; not
    #   "secretary"), unless the suffix says the value is about the secret, not the secret
    #   (_about_a_secret, checked on a match: a look-ahead would cost every occurrence of the name
    #   a scan; after such a key the scan resumes inside its value if quoted, else after it);
    # - a key ending in "token" or in "token" and a value suffix (not token counts, usage, ids or
    #   tokenizers such as ``max_tokens``, ``token_usage``, ``totalTokenCount``).
    # The value is on the key's line. A quoted one is masked inside its quotes (JSON stays JSON),
    # may hold escapes (\") and ends at a quote that ends a word (in a JSON-decoded view a value
    # ending in a backslash must not run on); a braced one ending a field is an ODBC value
    # (Pwd={a;b};); any other is not a structure ({, [, () nor a placeholder (None, null, %s, $1,
    # ?), is masked with a label it may start with ("credentials: password: ...", "passwords:
    # wifi: ...") and runs on past , ; & ) ] } that a digit or a symbol follows ("Tr0ub4dor&3"
    # whole), not a letter, which may start the next pair ("x" of "password=x&user=y")
    re.compile(
        r"(?i)(?=[pasct])" + _SECRET_KEY_IN_TEXT + r"[\"']?[^\S\r\n]*[:=][^\S\r\n]*"
        r"(?P<quote>[\"'])?(?!\[REDACTED\])"
        r"(?P<value>(?(quote)(?:(?!(?P=quote))[^\\\r\n]|\\.)*"
        r"|(?:\{[^{}\r\n\"']{1,256}\}(?=;|$)"
        r"|(?:[\w.-]+[^\S\r\n]*[:=][^\S\r\n]+)?"
        # a YAML block scalar's indicator (_YAML_BLOCK_SECRET), also JSON-escaped
        r"(?!" + _BLOCK_INDICATOR + _LINE_END + r")"
        r"(?!(?:none|null|nil|undefined|%s|\$[0-9]+|\?)(?![^\s,;&}\])\"']|[,;&}\])][0-9!#%^*+~@]))"
        r"[^\s,;&}\])\"'{\[(=](?:[^\s,;&}\])\"']|[,;&}\])](?=[0-9!#%^*+~@]))*)))"
        r"(?(quote)(?:(?P=quote)(?=[\s,;:}\])./>?!|&<\"'\\]|$)|$))"
    ),
    _YAML_BLOCK_SECRET,
    _PASS_KEY,
    # a secret said in words, as a memory or a message says it ("my password is Tr0ub4dor&3", "the
    # user's API key is 9f8e...", "the password for the db is ...", "API key: 9f8e..."; 12
    # characters or more after a name and a colon: "Private key: RSA-2048" is a description)
    re.compile(
        r"(?i)(?=[pasrb])\b(?:(?:password|passphrase|passcode|api[ _-]?key|secret(?:[ _-]?key)?"
        r"|(?:access|auth|bearer|refresh|api|bot)[ _-]?token)"
        + _SAID_FOR
        + _SAID_IS
        + r"|(?:api|secret|access|private)[ ]key[\"']?[^\S\r\n]*[:=][^\S\r\n]*(?=[\"']?[^\s\"'<>]{12}))"
        + _SAID_VALUE
    ),
    _SOMEONES_TOKEN,
)

_GATES = {
    _JWT: re.compile("eyj"),
    _TELEGRAM_BOT_TOKEN: re.compile(":a"),
    _SOMEONES_TOKEN: re.compile("token"),
    _YAML_BLOCK_SECRET: re.compile(_BLOCK_INDICATOR + r"\r?\n"),
    _PASS_KEY: re.compile("pass"),
    _COMMAND_PASSWORD: re.compile("curl|mysql|sshpass"),
}
"""For some patterns, text every match holds (searched in the case-folded text): a view without it
is not scanned by that pattern."""

_SCANS = tuple(
    (
        pattern,
        "value" if "value" in pattern.groupindex else 0,  # the part masked
        "suffix" in pattern.groupindex,  # keys whose suffix may be about a secret (_matches)
        "name" in pattern.groupindex,  # pairs whose name may name no secret (_matches)
        _GATES.get(pattern),
        _PRECEDED.get(pattern),
    )
    for pattern in DEFAULT_SECRET_PATTERNS
)
"""Each pattern with what the scan needs to know of it, worked out once."""


# A necessary condition for any pattern above to match, searched in the case-folded text:
# without IGNORECASE the regex engine scans several times faster (this runs on every exported
# string, on the export thread).
_QUICK_CHECK = re.compile(
    r"sk-|rk-|pk-|sk_|rk_|whsec_|aiza|gocspx-|gh[pousr]_|github_pat_|xox|xapp-|hf_|glpat-|gsk_|xai-|npm_|"
    r"ya29\.|sg\.[a-z0-9_-]{16}|hvs\.|pypi-|shp[acps][acst]_|lsv2_|tvly-|pplx-|r8_|dapi[0-9a-f]{32}|"
    r"sk[0-9a-f]{32}|age-secret|akia|asia|abia|acca|eyj|slack\.com|webhook|telegram|sig=|signature=|"
    r"glc_|glsa_|nrak-|sntry|dckr_pat_|do[opr]_v1_|sbp_|pcsk_|lin_api_|ntn_|gl(?:ptt|dt|rt|ft|oas|soat|cbt|imt|agent)-|curl|mysql|"
    r"honeycomb|:a|appid|"
    r"private key|://|bearer|basic|pass|pwd|secret|token|key|auth|cookie|credential"
)
_JSON_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|[\"\\/bfnrt])")
_JSON_SIMPLE = {"b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
_URL_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}|\+")
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-9;]{0,32}[A-Za-z]")
"""Terminal control sequences (colours): ``\\x1b[36m``."""
_MAX_JSON_DEPTH = 3


def _json_unescape(escape: str) -> str:
    if escape[1] == "u":
        return chr(int(escape[2:], 16))
    return _JSON_SIMPLE.get(escape[1], escape[1])


def _url_unescape(escape: str) -> str:
    return " " if escape == "+" else chr(int(escape[1:], 16))


def _dropped(escape: str) -> str:
    return ""


class _View:
    """A decoded form of the original text: each of its characters knows its original span."""

    __slots__ = ("ends", "starts", "text")

    def __init__(self, text: str, starts: list[int] | None = None, ends: list[int] | None = None) -> None:
        self.text = text
        self.starts = starts
        self.ends = ends

    def original_span(self, start: int, end: int) -> tuple[int, int]:
        """The original text's span that the view's ``[start, end)`` came from."""
        if self.starts is None or self.ends is None or end <= start:
            return start, end
        return self.starts[start], self.ends[end - 1]

    def _map(self, start: int, end: int) -> tuple[list[int], list[int]]:
        """Original starts and ends of the view's characters ``[start, end)``."""
        if self.starts is None or self.ends is None:
            return list(range(start, end)), list(range(start + 1, end + 1))
        return self.starts[start:end], self.ends[start:end]

    def decoded(self, escape: re.Pattern[str], decode: Callable[[str], str]) -> _View | None:
        """This view with ``escape`` sequences decoded, or ``None`` when it has none."""
        text = self.text
        pieces: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        position = 0
        for match in escape.finditer(text):
            plain_starts, plain_ends = self._map(position, match.start())
            starts += plain_starts
            ends += plain_ends
            pieces.append(text[position : match.start()])
            replacement = decode(match.group())  # one character, or none
            pieces.append(replacement)
            if replacement:
                first, last = self.original_span(match.start(), match.end())
                starts.append(first)
                ends.append(last)
            position = match.end()
        if not pieces:
            return None
        plain_starts, plain_ends = self._map(position, len(text))
        starts += plain_starts
        ends += plain_ends
        pieces.append(text[position:])
        return _View("".join(pieces), starts, ends)


def _views(text: str) -> Iterator[_View]:
    """The text itself and its JSON-decoded forms (JSON in JSON too), each also without its
    terminal colour codes (a shell tool's output, a coloured log line), then the last one
    URL-decoded."""
    view = _View(text)
    yield view
    for depth in range(_MAX_JSON_DEPTH + 1):
        if "\x1b" in view.text and (plain := view.decoded(_TERMINAL_ESCAPE, _dropped)) is not None:
            view = plain
            yield view
        if depth == _MAX_JSON_DEPTH or "\\" not in view.text:
            break
        decoded = view.decoded(_JSON_ESCAPE, _json_unescape)
        if decoded is None:
            break
        view = decoded
        yield view
    if "%" in view.text or "+" in view.text:
        decoded = view.decoded(_URL_ESCAPE, _url_unescape)
        if decoded is not None:
            yield decoded
            if "\x1b" in decoded.text and (plain := decoded.decoded(_TERMINAL_ESCAPE, _dropped)) is not None:
                yield plain


def _matches(
    pattern: re.Pattern[str],
    text: str,
    about_suffix: bool,
    named: bool,
    preceded: tuple[re.Pattern[str], int] | None,
) -> Iterator[re.Match[str]]:
    """The matches of ``pattern`` in ``text``; with ``about_suffix``, but a key whose suffix is
    about a secret: the scan resumes inside its value if quoted (a quoted value may hold a secret,
    and is read again only once), else after it (an unquoted value runs to the next space: read
    again from every key in it, hostile text would cost the square of its length); with
    ``named``, but a pair whose name names no secret: the scan resumes after the name; with
    ``preceded``, but a match the text before it does not end as said: the scan resumes just past
    its start (each literal is tried once)."""
    if not about_suffix and not named and preceded is None:
        yield from pattern.finditer(text)
        return
    position = 0
    while (match := pattern.search(text, position)) is not None:
        if preceded is not None:
            before, reach = preceded
            if before.search(text, max(0, match.start() - reach), match.start()) is None:
                position = match.start() + 1  # another literal may start inside this match
                continue
        if named and not names_a_secret(match.group("name")):
            position = match.end("name")
            continue
        suffix = match.group("suffix") if about_suffix else None
        if suffix and _about_a_secret(suffix):
            position = match.start("value") if match.group("quote") else _next_pair(text, match)
            continue
        yield match
        position = match.end()


def _next_pair(text: str, match: re.Match[str]) -> int:
    """Where the scan resumes after an unquoted value about a secret: at a ``,`` ``;`` or ``&``
    inside it, where a next pair may start (``password_attempts=3&2fa_token=...``), else after it."""
    start, end = match.span("value")
    separators = [found for found in (text.find(c, start, end) for c in ",;&") if found >= 0]
    return min(separators) if separators else match.end()


def secret_spans(text: str) -> list[tuple[int, int]]:
    """Spans of ``text`` that hold a secret, in any of its encodings (sorted, merged)."""
    spans: list[tuple[int, int]] = []
    for view in _views(text):
        folded = view.text.casefold()
        if not _QUICK_CHECK.search(folded):
            continue
        for pattern, group, about_suffix, named, gate, preceded in _SCANS:
            if gate is not None and gate.search(folded) is None:
                continue
            for match in _matches(pattern, view.text, about_suffix, named, preceded):
                start, end = match.span(group)
                if end > start:
                    spans.append(view.original_span(start, end))
    spans.sort()
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def default_redactor(text: str) -> str:
    """Mask provider keys, tokens, passwords, private keys and credentials in ``text``."""
    if not _QUICK_CHECK.search(text.casefold()) and "\\" not in text and "%" not in text:
        return text
    spans = secret_spans(text)
    if not spans:
        return text
    pieces: list[str] = []
    position = 0
    for start, end in spans:
        pieces.append(text[position:start])
        pieces.append(REDACTED)
        position = end
    pieces.append(text[position:])
    return "".join(pieces)


_URL_QUERY = re.compile(r"(?i)\b[a-z][a-z0-9+.-]*://[^\s?#\"']*\?(?P<query>[^\s#\"']+)")
_QUERY_VALUE = re.compile(r"(?P<key>[^&=]+)=(?P<value>[^&]*)")


def mask_message(text: str) -> str:
    """A diagnostic message with its secrets masked, and every URL query value too (exporter
    endpoints carry tokens there: ``?token=``, ``?sig=``, ``?code=``...)."""

    def mask_query(match: re.Match[str]) -> str:
        start = match.start("query") - match.start()
        query = _QUERY_VALUE.sub(lambda pair: f"{pair.group('key')}={REDACTED}", match.group("query"))
        return match.group()[:start] + query

    return default_redactor(_URL_QUERY.sub(mask_query, text))
