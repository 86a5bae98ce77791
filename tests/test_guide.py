"""docs/guide.md runs: every ``python`` and ``bash`` block, in order, in one directory.

A block after a ``<!-- file: NAME -->`` line is saved as ``NAME`` instead (later blocks use it);
``text`` blocks are sample output. Any other kind of block fails the test, so none goes unrun.
Everything is exported to one in-process receiver, which then shows what the guide promises.

The README's and docs/mem0.md's ``python`` blocks run the same way, and the figures the README,
docs/memory.md and docs/dashboards.md state (secret corpus, agent flags, panels, alerts) are
checked against what they describe.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from instrumented_agent.config import AgentConfig, add_agent_arguments
from instrumented_agent.demo import _LIVE_AGENT_ARGS
from kaos_otel import catalog
from kaos_otel._trace_tree import render_trace_trees
from kaos_otel.receiver import OtlpReceiver

REPO = Path(__file__).resolve().parents[1]
GUIDE = REPO / "docs" / "guide.md"
README = REPO / "README.md"
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


def _environment(receiver: OtlpReceiver, directory: Path) -> dict[str, str]:
    """The environment a reader's shell would have: no ``OTEL_*`` but the receiver's endpoint, no
    ``MEM0_DIR`` (the suite's Mem0 tests point it at a folder of theirs)."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith("OTEL_") and k != "MEM0_DIR"},
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.grpc_endpoint,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(directory), os.environ.get("PYTHONPATH")])),
    }


def _run(page: Path, block: Block, directory: Path, env: dict[str, str], code: str | None = None) -> None:
    """Run ``block`` (its ``code``, if given) in ``directory``; a failure names its page and line."""
    code = block.code if code is None else code
    command = (
        [sys.executable, "-c", code] if block.lang == "python" else ["bash", "-euo", "pipefail", "-c", code]
    )
    done = subprocess.run(
        command, cwd=directory, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    where = f"{page.relative_to(REPO)}:{block.line}"
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"


@pytest.mark.timeout(300)
def test_every_block_of_the_guide_runs(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    env = _environment(otlp_receiver, tmp_path)
    for block in guide_blocks(GUIDE.read_text(encoding="utf-8")):
        if block.file is not None:
            (tmp_path / block.file).write_text(block.code + "\n", encoding="utf-8")
            continue
        if block.lang == "text":
            continue
        _run(GUIDE, block, tmp_path, env)

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


def _shape(tree: str) -> list[str]:
    """A printed trace tree without what changes from run to run: ids, durations and bars."""
    tree = re.sub(r"trace [0-9a-f]{32}", "trace ID", tree)
    tree = re.sub(r"\d+(?:\.\d+)? (?:ms|s)\b", "D", tree)
    tree = re.sub(r"\|[█·]+\|", "", tree)
    return [" ".join(line.split()) for line in tree.strip().splitlines()]


@pytest.mark.timeout(120)
def test_the_readme_examples_run_and_print_what_it_shows(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    blocks = guide_blocks(README.read_text(encoding="utf-8"))
    first, sdk = [b for b in blocks if b.lang == "python"]
    (shown,) = [b for b in blocks if b.lang == "text"]
    env = _environment(otlp_receiver, tmp_path)
    _run(README, first, tmp_path, env)
    _run(README, sdk, tmp_path, env)

    spans = otlp_receiver.spans()
    mine = [s for s in spans if s.service_name == "my-agent"]
    assert _shape(render_trace_trees(mine, waterfall=True)) == _shape(shown.code)
    coordinator = {s.name: s for s in spans if s.service_name == "coordinator"}
    assert coordinator["rank_results"].attributes == {"results": 3}
    run = coordinator["invoke_agent coordinator"]
    assert run.attributes[catalog.KAOS_OUTCOME] == "max_steps"
    (step,) = [s for s in spans if s.name == "agent_step" and s.parent_span_id == run.span_id]
    under_step = {s.name: s.kind for s in spans if s.parent_span_id == step.span_id}
    assert under_step == {
        "chat gpt-4o": "CLIENT",
        "execute_tool echo": "INTERNAL",
        "invoke_agent researcher": "CLIENT",
    }


@pytest.mark.timeout(180)
def test_the_mem0_page_examples_run(otlp_receiver: OtlpReceiver, tmp_path: Path) -> None:
    page = REPO / "docs" / "mem0.md"
    enabling, offline = [b for b in guide_blocks(page.read_text(encoding="utf-8")) if b.lang == "python"]
    env = _environment(otlp_receiver, tmp_path)
    _run(page, enabling, tmp_path, env)
    # the page's production paths, here in the test's directory
    assert "/var/lib/my-agent" in offline.code
    _run(page, offline, tmp_path, env, offline.code.replace("/var/lib/my-agent", str(tmp_path)))
    assert (tmp_path / "history.db").is_file() and (tmp_path / "mem0" / "config.json").is_file()


def test_the_readme_states_the_secret_corpus_as_tested() -> None:
    import test_secrets as secrets  # the corpus the README's figures describe

    text = " ".join(README.read_text(encoding="utf-8").split())
    tested = re.search(r"Tested: ([\d,]+) placements \((\d+) shapes x (\d+) encodings\)", text)
    benign = re.search(r"0 found; 0 of ([\d,]+) benign texts", text)
    assert tested is not None and benign is not None
    placements, shapes, encodings = (int(n.replace(",", "")) for n in tested.groups())
    assert (shapes, encodings) == (len(secrets.SECRETS), len(secrets.PLACEMENTS))
    assert placements == len(secrets.CORPUS) == shapes * encodings
    # test_false_positive_rate_on_benign_text_is_measured_and_low draws each benign shape 100 times
    assert int(benign.group(1).replace(",", "")) == 100 * len(secrets.BENIGN)


def test_the_memory_page_states_the_agents_memory_flags() -> None:
    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    options = {option: action for action in parser._actions for option in action.option_strings}
    defaults = AgentConfig(name="defaults", model_base_url="unset", model_name="unset")
    page = (REPO / "docs" / "memory.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| `(--[\w-]+)` \| `(\w+)` \| ([^|]+?) \|", page, re.M)
    assert len(rows) == 4
    for flag, variable, default in rows:
        assert variable in str(options[flag].help), flag
        value = getattr(defaults, flag[2:].replace("-", "_"))
        assert default.strip("`") == ("off" if value in (None, False) else str(value)), flag


def test_the_live_demo_pages_name_the_extra_its_long_term_memory_needs() -> None:
    """Live traffic runs the agents with Mem0, which the ``agent`` extra does not install: without
    it every request ends ``degraded``, so the pages that show the command install ``mem0`` too."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    assert "--memory-long-term" in _LIVE_AGENT_ARGS
    assert not any("mem0" in requirement for requirement in extras["agent"])
    (live,) = [b for b in guide_blocks(README.read_text(encoding="utf-8")) if "--duration" in b.code]
    assert "pip install -e '.[agent,mem0]'" in live.code
    page = (REPO / "docs" / "dashboards.md").read_text(encoding="utf-8")
    (paragraph,) = [p for p in page.split("\n\n") if p.startswith("`--duration` keeps user requests flowing")]
    assert "[agent,mem0]" in paragraph


def _grafana_titles(dashboard: dict[str, Any]) -> set[str]:
    return {panel["title"] for panel in dashboard["panels"] if panel["type"] != "row"}


def _signoz_titles(dashboard: dict[str, Any]) -> set[str]:
    return {panel["spec"]["display"]["name"] for panel in dashboard["spec"]["panels"].values()}


def test_the_dashboards_page_names_the_shipped_panels_and_alerts() -> None:
    page = (REPO / "docs" / "dashboards.md").read_text(encoding="utf-8")
    grafana = json.loads((REPO / "dashboards" / "grafana" / "kaos-agents.json").read_text(encoding="utf-8"))
    signoz = json.loads((REPO / "dashboards" / "signoz" / "kaos-agents.v2.json").read_text(encoding="utf-8"))
    questions = page[page.index("## Which panel answers which question") : page.index("Ratio panels")]
    named = set(re.findall(r"\*([^*|]+)\*", questions))
    assert len(named) >= 20
    assert named <= _grafana_titles(grafana) and named <= _signoz_titles(signoz), named - (
        _grafana_titles(grafana) & _signoz_titles(signoz)
    )

    rules = (REPO / "dashboards" / "prometheus" / "kaos-alerts.rules.yml").read_text(encoding="utf-8")
    alerts = re.findall(r"^ +- alert: (\w+)$", rules, re.M)
    signoz_alerts = [
        json.loads(path.read_text(encoding="utf-8"))["alert"]
        for path in sorted((REPO / "dashboards" / "signoz" / "alerts").glob("*.json"))
    ]
    assert sorted(alerts) == sorted(signoz_alerts)
    assert re.findall(r"^\| `(Kaos\w+)` \|", page, re.M) == alerts
    words = ("one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven")
    assert f"one dashboard and {words[len(alerts) - 1]} alerts" in page
