"""docs/guide.md runs: every ``python`` and ``bash`` block, in order, in one directory.

A block after a ``<!-- file: NAME -->`` line is saved as ``NAME`` instead (later blocks use it);
``text`` blocks are sample output. Any other kind of block fails the test, so none goes unrun.
Everything is exported to one in-process receiver, which then shows what the guide promises.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kaos_otel import catalog
from kaos_otel.receiver import OtlpReceiver

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
_BLOCK = re.compile(r"(?:<!-- file: (?P<file>[\w.]+) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)\n```", re.DOTALL)


@dataclass(frozen=True)
class Block:
    """One fenced block of the guide."""

    lang: str
    code: str
    file: str | None
    line: int


def guide_blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text``, with the line each starts on."""
    return [
        Block(m["lang"], m["code"], m["file"], text.count("\n", 0, m.start("lang")) + 1)
        for m in _BLOCK.finditer(text)
    ]


def test_the_guide_has_only_blocks_the_test_runs() -> None:
    blocks = guide_blocks(GUIDE.read_text(encoding="utf-8"))
    assert {b.lang for b in blocks} <= {"python", "bash", "text"}
    assert len([b for b in blocks if b.lang == "python"]) >= 12
    assert GUIDE.read_text(encoding="utf-8").count("```") == 2 * len(blocks)


@pytest.mark.timeout(300)
def test_every_block_of_the_guide_runs(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_")},
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp_receiver.grpc_endpoint,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
    }
    for block in guide_blocks(GUIDE.read_text(encoding="utf-8")):
        if block.file is not None:
            (tmp_path / block.file).write_text(block.code + "\n", encoding="utf-8")
            continue
        if block.lang == "text":
            continue
        command = (
            [sys.executable, "-c", block.code]
            if block.lang == "python"
            else ["bash", "-euo", "pipefail", "-c", block.code]
        )
        done = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"docs/guide.md:{block.line} failed:\n{done.stdout}\n{done.stderr}"

    spans = otlp_receiver.spans()
    services = {s.service_name for s in spans}

    def by_name(name: str) -> set[str]:
        return {s.span_id for s in spans if s.name == name}

    assert services >= {
        "support-agent",
        "researcher",
        "coordinator",
        "planner",
        "indexer",
        "analyst",
        "assistant",
        "worker",
    }
    # a streamed answer: the chat span inside the traced generator, the caller's spans outside it
    (chat,) = [s for s in spans if s.name == "chat gpt-4o" and s.parent_span_id in by_name("stream_answer")]
    sent = [s for s in spans if s.name == "send-to-client"]
    assert len(sent) == 2 and chat.span_id not in {s.parent_span_id for s in sent}
    assert chat.attributes[catalog.GEN_AI_USAGE_INPUT_TOKENS] == 42
    assert chat.attributes[catalog.GEN_AI_RESPONSE_FINISH_REASONS] == ("stop",)
    assert chat.attributes[catalog.GEN_AI_REQUEST_STREAM] is True
    assert 0 < chat.attributes[catalog.GEN_AI_RESPONSE_TIME_TO_FIRST_CHUNK] < chat.duration_s
    # a sub-agent in the same process counts as delegated
    origins = {
        s.attributes[catalog.GEN_AI_AGENT_NAME]: s.attributes[catalog.KAOS_REQUEST_ORIGIN]
        for s in spans
        if s.service_name == "planner" and s.kind == "INTERNAL" and s.name.startswith("invoke_agent")
    }
    assert origins == {"planner": "user", "summarizer": "delegated"}
    # FastAPI: one server span for the request, flushed on SIGTERM
    assert [s.name for s in spans if s.service_name == "researcher" and s.kind == "SERVER"] == ["POST /ask"]
    # httpx: the delegation span is the parent the sub-agent was given
    (delegation,) = [s for s in spans if s.name == "invoke_agent researcher" and s.kind == "CLIENT"]
    assert delegation.service_name == "coordinator"
    # threads: every embed span is inside the indexer's run
    indexer = [s for s in spans if s.service_name == "indexer"]
    (run,) = [s for s in indexer if s.name == "invoke_agent indexer"]
    assert [s.trace_id for s in indexer if s.name == "embed"] == [run.trace_id] * 3
    # MCP: the SDK's own spans are in the analyst's trace
    (tool,) = [s for s in spans if s.name == "execute_tool add"]
    assert {s.trace_id for s in spans if "tools/call" in s.name} == {tool.trace_id}
    # Mem0 and own memory: memory spans by tier
    tiers = {s.attributes.get(catalog.KAOS_MEMORY_TIER) for s in spans if s.service_name == "assistant"}
    assert tiers >= {"long_term", "short_term", "medium_term"}
    # logs carry the span they were written in
    (record,) = [r for r in otlp_receiver.logs() if r.body == "looking up order 123"]
    assert record.trace_id is not None and record.span_id is not None
    # labels are bounded; content is captured only when asked, and masked
    tools = {p.attributes.get(catalog.GEN_AI_TOOL_NAME) for p in otlp_receiver.metric_points()}
    assert "_other" in tools and "made_up_by_the_model" not in tools
    captured = [s for s in spans if s.attributes.get(catalog.GEN_AI_INPUT_MESSAGES)]
    assert len(captured) == 1 and "sk-proj-abcdefghijklmnopqrstuvwx" not in str(captured[0].attributes)
