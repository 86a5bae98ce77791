"""A Mem0 setup that needs no network and no torch: copy it, or use it in tests and demos.

- mem0's PostHog telemetry off: importing this module sets ``MEM0_TELEMETRY=False`` unless the
  variable is already set, so import it before anything imports ``mem0`` (or set the variable
  in the environment). Point ``MEM0_DIR`` at a folder of your own the same way.
- Vector store: qdrant in memory (``path=":memory:"``, isolated per instance).
- Embedder: :class:`WordLlamaEmbedder`, static WordLlama embeddings (256 dims, about 30 us per
  short text) loaded from the installed ``wordllama`` package with downloads disabled.
- LLM (``add(..., infer=True)`` only): mem0's ``openai`` provider pointed at an
  OpenAI-compatible server, e.g. a local scripted one, even with ``OPENROUTER_API_KEY`` set
  (which, on its own, makes mem0 send the messages to openrouter.ai). mem0 sends one
  ``POST /v1/chat/completions`` (``response_format`` ``json_object``) per ``add`` and expects
  the reply content ``{"memory": [{"id": "0", "text": "..."}]}``.

Example::

    from kaos_otel.instrumentation.mem0.offline import offline_memory

    memory = offline_memory("http://127.0.0.1:8000/v1", history_db_path="/tmp/mem0-history.db")
    memory.add("Alice likes blue", user_id="alice", infer=False)
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

os.environ.setdefault("MEM0_TELEMETRY", "False")

from mem0 import AsyncMemory, Memory
from mem0.configs.embeddings.base import BaseEmbedderConfig
from mem0.embeddings.base import EmbeddingBase
from openai import OpenAI

from kaos_otel._logs import root_logging_kept

with root_logging_kept():  # importing wordllama runs logging.basicConfig(level=INFO)
    import wordllama
    from wordllama import WordLlama

WORDLLAMA_DIMS = 256
WORDLLAMA_MODEL = "wordllama-l2-supercat"
MemoryAction = Literal["add", "search", "update"] | None


@functools.cache
def _wordllama() -> Any:
    """The bundled WordLlama model, loaded once (about 0.15 s) without any download."""
    return WordLlama.load(
        cache_dir=Path(wordllama.__file__).parent, disable_download=True, dim=WORDLLAMA_DIMS
    )


class WordLlamaEmbedder(EmbeddingBase):  # type: ignore[misc]
    """A mem0 embedder on WordLlama's static embeddings: local, no torch, no network."""

    def __init__(self) -> None:
        super().__init__(BaseEmbedderConfig(model=WORDLLAMA_MODEL, embedding_dims=WORDLLAMA_DIMS))

    def embed(self, text: str, memory_action: MemoryAction = None) -> list[float]:
        """One text's embedding."""
        return self.embed_batch([text], memory_action)[0]

    def embed_batch(self, texts: Sequence[str], memory_action: MemoryAction = "add") -> list[list[float]]:
        """Embeddings of several texts in one call."""
        vectors: list[list[float]] = _wordllama().embed(list(texts)).tolist()
        return vectors


def offline_config(
    llm_base_url: str,
    *,
    history_db_path: str | os.PathLike[str],
    collection_name: str = "mem0",
    model: str = "scripted",
    api_key: str = "offline",
) -> dict[str, Any]:
    """A ``MemoryConfig`` dict: in-memory qdrant, LLM and embedder clients at ``llm_base_url``.

    mem0 builds its ``openai`` embedder from this config (it needs a configured provider);
    :func:`offline_memory` replaces it with :class:`WordLlamaEmbedder` before first use.
    """
    client = {"api_key": api_key, "openai_base_url": llm_base_url}
    return {
        "vector_store": {
            "provider": "qdrant",
            "config": {
                "path": ":memory:",
                "collection_name": collection_name,
                "embedding_model_dims": WORDLLAMA_DIMS,
            },
        },
        "llm": {"provider": "openai", "config": {**client, "model": model}},
        "embedder": {"provider": "openai", "config": {**client, "embedding_dims": WORDLLAMA_DIMS}},
        "history_db_path": str(history_db_path),
    }


def _made_offline(memory: Any, config: dict[str, Any]) -> Any:
    """``memory`` embedding with WordLlama, its LLM client at the configured server only."""
    memory.embedding_model = WordLlamaEmbedder()
    llm = config["llm"]["config"]
    # mem0's openai LLM targets openrouter.ai, with that key, whenever OPENROUTER_API_KEY is set
    memory.llm.client = OpenAI(api_key=llm["api_key"], base_url=llm["openai_base_url"])
    return memory


def offline_memory(llm_base_url: str, *, history_db_path: str | os.PathLike[str], **options: str) -> Any:
    """A ``mem0.Memory`` built from :func:`offline_config`, embedding with WordLlama."""
    config = offline_config(llm_base_url, history_db_path=history_db_path, **options)
    return _made_offline(Memory.from_config(config), config)


def offline_async_memory(
    llm_base_url: str, *, history_db_path: str | os.PathLike[str], **options: str
) -> Any:
    """A ``mem0.AsyncMemory`` built from :func:`offline_config`, embedding with WordLlama."""
    config = offline_config(llm_base_url, history_db_path=history_db_path, **options)
    return _made_offline(AsyncMemory.from_config(config), config)
