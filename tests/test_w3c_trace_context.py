"""One test per rule of W3C Trace Context Level 2, sections 3.2 (traceparent) and 3.3 (tracestate),
plus RFC 9110 field combination and baggage hygiene, on the incoming-header parser.

Header pairs are given as an ASGI server hands them over: a name may repeat.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from opentelemetry import baggage, trace
from opentelemetry import context as context_api
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.trace import SpanContext

from kaos_otel._config import TrustPolicy
from kaos_otel.propagation import IncomingContext, extract_incoming, inject_headers, inject_request_hook

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"
PARENT = f"00-{TRACE}-{SPAN}-01"


def incoming(*pairs: tuple[str, str], allow: tuple[str, ...] = ()) -> IncomingContext:
    return extract_incoming(list(pairs), trust=TrustPolicy.TRUSTED, baggage_allowlist=allow)


def remote(*pairs: tuple[str, str]) -> SpanContext | None:
    context = trace.get_current_span(incoming(*pairs).parent).get_span_context()
    return context if context.is_valid else None


def continued(traceparent: str) -> bool:
    found = remote(("traceparent", traceparent))
    return found is not None and (
        trace.format_trace_id(found.trace_id),
        trace.format_span_id(found.span_id),
    ) == (
        TRACE,
        SPAN,
    )


def state(*tracestate: str, traceparent: str = PARENT) -> list[tuple[str, str]]:
    found = remote(("traceparent", traceparent), *(("tracestate", value) for value in tracestate))
    assert found is not None
    return list(found.trace_state.items())


# --- 3.2 traceparent --------------------------------------------------------------------------


def test_header_name_in_any_case() -> None:
    assert remote(("TraceParent", PARENT)) is not None
    found = remote(("traceparent", PARENT), ("TRACESTATE", "v=1"))
    assert found is not None and list(found.trace_state.items()) == [("v", "1")]


def test_a_valid_version_00_header_is_continued() -> None:
    assert continued(PARENT)


def test_version_must_be_two_lowercase_hex_digits_and_a_dash() -> None:
    for version in ("0", "000", "0x", "AA", "0g"):
        assert not continued(f"{version}-{TRACE}-{SPAN}-01"), version


def test_version_ff_is_invalid() -> None:
    assert not continued(f"ff-{TRACE}-{SPAN}-01")


def test_version_00_takes_no_fields_past_the_flags() -> None:
    assert not continued(f"{PARENT}-extra")
    assert not continued(f"{PARENT}0")


def test_a_higher_version_is_parsed_by_its_first_four_fields() -> None:
    assert continued(f"cc-{TRACE}-{SPAN}-01")
    assert continued(f"cc-{TRACE}-{SPAN}-01-what-the-future-adds")
    assert not continued(f"cc-{TRACE}-{SPAN}-01x")  # the flags are followed by the end or a dash
    assert not continued(f"cc-{TRACE}-{SPAN}-1")  # shorter than 55 characters


def test_trace_id_is_32_lowercase_hex_digits_not_all_zero() -> None:
    assert not continued(f"00-{TRACE[:-1]}-{SPAN}-01")
    assert not continued(f"00-{TRACE}0-{SPAN}-01")
    assert not continued(f"00-{TRACE.upper()}-{SPAN}-01")
    assert not continued(f"00-{'0' * 32}-{SPAN}-01")


def test_parent_id_is_16_lowercase_hex_digits_not_all_zero() -> None:
    assert not continued(f"00-{TRACE}-{SPAN[:-1]}-01")
    assert not continued(f"00-{TRACE}-{SPAN.upper()}-01")
    assert not continued(f"00-{TRACE}-{'0' * 16}-01")


def test_trace_flags_are_two_lowercase_hex_digits() -> None:
    assert not continued(f"00-{TRACE}-{SPAN}-1")
    assert not continued(f"00-{TRACE}-{SPAN}-0A")
    assert not continued(f"00-{TRACE}-{SPAN}-zz")


def test_sampled_and_random_flags_are_read_and_other_bits_are_not_propagated() -> None:
    for flags, expected in (
        ("00", 0x00),
        ("01", 0x01),
        ("02", 0x02),
        ("03", 0x03),
        ("ff", 0x03),
        ("08", 0x00),
    ):
        found = remote(("traceparent", f"00-{TRACE}-{SPAN}-{flags}"))
        assert found is not None and int(found.trace_flags) == expected, flags
    sampled = remote(("traceparent", f"00-{TRACE}-{SPAN}-09"))
    assert sampled is not None and sampled.trace_flags.sampled


def test_surrounding_whitespace_of_the_field_value_is_not_part_of_it() -> None:
    assert continued(f"  {PARENT}\t")


def test_more_than_one_traceparent_starts_a_new_trace() -> None:
    other = f"00-{'a' * 32}-{'b' * 16}-01"
    assert remote(("traceparent", PARENT), ("traceparent", other)) is None
    assert remote(("traceparent", PARENT), ("traceparent", PARENT)) is None
    assert remote(("traceparent", f"{PARENT},{other}")) is None  # the combined form of the two


def test_tracestate_is_not_parsed_when_traceparent_is_invalid() -> None:
    assert remote(("traceparent", f"ff-{TRACE}-{SPAN}-01"), ("tracestate", "v=1")) is None


def test_an_invalid_tracestate_does_not_affect_traceparent() -> None:
    assert state("Not A Key=1") == []
    assert continued(PARENT)


# --- 3.3 tracestate ---------------------------------------------------------------------------


def test_repeated_tracestate_fields_are_combined_in_order() -> None:
    assert state("a=1,b=2", "c=3", "d=4") == [("a", "1"), ("b", "2"), ("c", "3"), ("d", "4")]


def test_optional_whitespace_around_members_is_ignored() -> None:
    assert state(" a=1 ,\tb=2\t, c=3") == [("a", "1"), ("b", "2"), ("c", "3")]


def test_empty_and_whitespace_only_members_are_allowed() -> None:
    assert state("a=1,,  ,\t,b=2,") == [("a", "1"), ("b", "2")]
    assert state("") == []
    assert state("a=1,", ",b=2") == [("a", "1"), ("b", "2")]


def test_simple_keys_start_with_a_lowercase_letter_and_have_at_most_256_characters() -> None:
    assert state("a_0-*/z=1") == [("a_0-*/z", "1")]
    assert state("k" * 256 + "=1") == [("k" * 256, "1")]
    assert state("k" * 257 + "=1") == []
    for key in ("0abc", "Abc", "a.b", "a b", "_a", "é"):
        assert state(f"{key}=1") == [], key


def test_multi_tenant_keys_have_tenant_and_system_ids_within_their_limits() -> None:
    assert state("tenant@vendor=1") == [("tenant@vendor", "1")]
    assert state("0tenant@vendor=1") == [("0tenant@vendor", "1")]  # a tenant id may start with a digit
    assert state("t" * 241 + "@" + "v" * 14 + "=1") == [("t" * 241 + "@" + "v" * 14, "1")]
    assert state("t" * 242 + "@vendor=1") == []
    assert state("tenant@" + "v" * 15 + "=1") == []
    assert state("tenant@0vendor=1") == []  # a system id starts with a letter
    assert state("a@b@c=1") == [] and state("@vendor=1") == [] and state("tenant@=1") == []


def test_values_are_printable_ascii_without_comma_or_equals_and_at_most_256_characters() -> None:
    assert state("a= leading space kept") == [("a", " leading space kept")]
    assert state("a=" + "v" * 256) == [("a", "v" * 256)]
    assert state("a=" + "v" * 257) == []
    assert state("a=x=y") == []
    assert state("a=") == []
    assert state("a=tab\tinside") == []
    assert state("a=caf\u00e9") == []


def test_at_most_32_members() -> None:
    members = [f"k{i}=v{i}" for i in range(32)]
    assert len(state(",".join(members))) == 32
    assert state(",".join([*members, "k32=v32"])) == []
    assert len(state(",".join(members), ",,")) == 32  # empty members do not count


def test_duplicate_keys_keep_the_first_most_recent_entry() -> None:
    assert state("congo=second,rojo=1,congo=first") == [("congo", "second"), ("rojo", "1")]


def test_a_member_without_equals_discards_the_list() -> None:
    assert state("a=1,novalue,b=2") == []


# --- baggage (W3C Baggage, after RFC 9110 combination) -----------------------------------------


def test_baggage_fields_are_combined_and_values_with_control_characters_dropped() -> None:
    context = incoming(
        ("traceparent", PARENT),
        ("baggage", "tenant=acme"),
        ("baggage", "region=eu%0D%0Aset-cookie:x,null=a%00b,tab=a%09b"),
        allow=("tenant", "region", "null", "tab"),
    ).parent
    assert baggage.get_all(context) == {"tenant": "acme"}


def test_baggage_values_are_decoded_as_the_w3c_grammar_says() -> None:
    """A ``+`` stays a plus, properties after ``;`` are not part of the value, a key is not
    percent-decoded, octets that are no UTF-8 become U+FFFD, a value holding C1 controls or a
    Unicode line separator is dropped, and so is a member breaking the grammar, alone."""
    context = incoming(
        ("traceparent", PARENT),
        (
            "baggage",
            "expr=1+1, tenant = acme ;ttl=30, ten%61nt=mallory, nel=x%C2%85y, line=x%E2%80%A8y,"
            ' quoted="a", bad=%zz, latin=%E9, email=a%40b.org',
        ),
        allow=("expr", "tenant", "nel", "line", "quoted", "bad", "latin", "email"),
    ).parent
    assert baggage.get_all(context) == {
        "expr": "1+1",
        "tenant": "acme",
        "latin": "\ufffd",
        "email": "a@b.org",
    }


def test_incoming_baggage_is_the_callers_only(caplog: pytest.LogCaptureFixture) -> None:
    """The current context's baggage (the server's own) is not mixed into a request's, and a
    header of 200 malformed members logs nothing."""
    token = context_api.attach(baggage.set_baggage("tenant", "server-side"))
    try:
        sent = incoming(("baggage", "region=eu"), allow=("tenant", "region")).parent
        flood = incoming(("baggage", ",".join(["=x"] * 200)), allow=("tenant",)).parent
    finally:
        context_api.detach(token)
    assert baggage.get_all(sent) == {"region": "eu"}
    assert baggage.get_all(flood) == {}
    assert [record.getMessage() for record in caplog.records] == []


def test_baggage_sent_by_inject_headers_is_read_back_unchanged() -> None:
    """A space goes as ``%20`` (a ``+`` is a plus to a W3C receiver): kaos-otel's parser and
    OpenTelemetry's read every value as it was set; token keys go as they are."""
    sent = {"city": "New York", "expr": "1+1 = 2", "name": "Jos\u00e9", "share": "100%", "q": 'a,b;c="d"\\'}
    context = trace.set_span_in_context(
        trace.NonRecordingSpan(SpanContext(int(TRACE, 16), int(SPAN, 16), is_remote=True))
    )
    for key, value in sent.items():
        context = baggage.set_baggage(key, value, context)
    context = baggage.set_baggage("user.tier-1", "gold", context)
    headers = inject_headers(context=context, baggage=True)
    assert "user.tier-1=gold" in headers["baggage"].split(",")
    received = incoming(*headers.items(), allow=(*sent, "user.tier-1")).parent
    assert baggage.get_all(received) == {**sent, "user.tier-1": "gold"}
    assert baggage.get_all(W3CBaggagePropagator().extract(headers)) == {**sent, "user.tier-1": "gold"}


# --- carriers ---------------------------------------------------------------------------------


def test_bytes_headers_as_an_asgi_scope_holds_them_are_read() -> None:
    scope_headers = [(b"traceparent", PARENT.encode()), (b"tracestate", b"v=1"), (b"baggage", b"k=a%20b")]
    for headers in (scope_headers, dict(scope_headers)):
        context = extract_incoming(headers, baggage_allowlist=("k",)).parent
        found = trace.get_current_span(context).get_span_context()
        assert (found.trace_id, found.span_id) == (int(TRACE, 16), int(SPAN, 16)), headers
        assert list(found.trace_state.items()) == [("v", "1")]
        assert baggage.get_all(context) == {"k": "a b"}


def test_a_list_value_is_its_field_lines_and_a_value_that_is_no_text_is_none(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """As an MCP ``_meta`` (JSON) may carry them: a number as ``tracestate`` or ``baggage`` loses
    neither the valid ``traceparent`` nor logs a failure."""
    carriers: list[dict[Any, object]] = [
        {"traceparent": [PARENT], "tracestate": ["a=1", "b=2"]},
        {"traceparent": PARENT, "tracestate": 5, "baggage": {"k": "v"}, 7: "x"},
    ]
    states = []
    for carrier in carriers:
        found = trace.get_current_span(extract_incoming(carrier, baggage_allowlist=("k",)).parent)
        assert found.get_span_context().trace_id == int(TRACE, 16), carrier
        states.append(list(found.get_span_context().trace_state.items()))
    assert states == [[("a", "1"), ("b", "2")], []]
    assert remote(("traceparent", [PARENT, PARENT])) is None  # type: ignore[arg-type]  # two lines
    assert [record.getMessage() for record in caplog.records] == []


def test_injected_fields_replace_the_carriers_own_in_any_case() -> None:
    """Headers forwarded with another trace's context (any case) go on with this one alone: not two
    ``traceparent`` fields (a new root at the receiver), nor the other trace's ``tracestate``."""
    ours = f"00-{'a' * 32}-{'b' * 16}-00"
    context = trace.set_span_in_context(
        trace.NonRecordingSpan(SpanContext(int("a" * 32, 16), int("b" * 16, 16), is_remote=True))
    )
    forwarded = {"TraceParent": PARENT, "TraceState": "theirs=1", "Baggage": "k=1", "Accept": "*/*"}
    plain = inject_headers(dict(forwarded), context=context)
    assert plain == {"Baggage": "k=1", "Accept": "*/*", "traceparent": ours}
    sent = baggage.set_baggage("k", "2", context)
    expected = {"Accept": "*/*", "traceparent": ours, "baggage": "k=2"}
    assert inject_headers(dict(forwarded), context=sent, baggage=True) == expected

    request = httpx.Request("POST", "http://agent/run", headers=forwarded)
    token = context_api.attach(context)
    try:
        inject_request_hook(request)
    finally:
        context_api.detach(token)
    found = remote(*request.headers.multi_items())
    assert found is not None and found.trace_id == int("a" * 32, 16) and not found.trace_state
